"""CREATE INDEX CONCURRENTLY on a partitioned table, carried out as the steps Postgres allows.

Postgres refuses CONCURRENTLY on a partitioned table, and a plain CREATE INDEX there builds every
partition's index under a SHARE lock that stops all writes until the last one is done. So the
migration runner (app/platform/migrate.py) turns such a statement, in a `-- migrate: no-transaction` file,
into these steps:

  1. CREATE INDEX name ON ONLY parent ...        the parent's index alone: catalog only, INVALID
  2. for each partition:
       CREATE INDEX CONCURRENTLY <partition>_<suffix> ON partition USING ...    writes go on
       ALTER INDEX name ATTACH PARTITION <partition>_<suffix>
  3. the parent's index turns valid when the last partition's index is attached.

The partitions' statements take the definition from the parent's index as Postgres prints it, so
they match it whatever the file says by then (a TABLESPACE clause is not carried over: Postgres
does not print it). Each step is an ordinary statement to the runner (its lock_timeout with
retries; an INVALID index left by a failed concurrent build is dropped and built again), and a step
is skipped when the catalog shows it done, so a run stopped anywhere is completed by running the
migration again: the parent's index is found by its name, a partition's by the name derived from
it. A partition that is itself partitioned gets the same treatment one level down.

Partitions created while the parent's index exists get theirs from Postgres itself, valid or not
yet: ATTACH PARTITION (how app/platform/partitions.py adds months) and CREATE TABLE ... PARTITION OF both
build or adopt a matching index on the new partition. A partition whose DETACH CONCURRENTLY is
pending is left out: Postgres neither counts it for validity nor lets an index attach to it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

_IDENT = r'(?:"(?:[^"]|"")+"|[^\s"(.]+)'
CREATE_INDEX_RE = re.compile(
    rf"""^CREATE\s+(?P<unique>UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?P<if_not_exists>IF\s+NOT\s+EXISTS\s+)?
         (?:(?!ON\s)(?P<name>{_IDENT})\s+)?
         ON\s+(?!ONLY\s)(?P<table>{_IDENT}(?:\.{_IDENT})?)\s*
         (?P<definition>.+)$""",
    re.IGNORECASE | re.DOTALL | re.VERBOSE,
)
MAX_NAME_BYTES = 63  # NAMEDATALEN - 1: Postgres would truncate a longer name silently


class PartitionedIndexError(RuntimeError):
    pass


@dataclass(frozen=True)
class IndexSpec:
    unique: bool
    definition: str  # what follows the table name: [USING method] (columns) [INCLUDE, WITH, WHERE ...]

    def statement(self, quoted_name: str, table: str, *, concurrently: bool, only: bool, if_not_exists: bool) -> str:
        return " ".join(
            filter(
                None,
                [
                    "CREATE",
                    "UNIQUE" if self.unique else "",
                    "INDEX",
                    "CONCURRENTLY" if concurrently else "",
                    "IF NOT EXISTS" if if_not_exists else "",
                    quoted_name,
                    "ON",
                    "ONLY" if only else "",
                    table,
                    self.definition,
                ],
            )
        )


@dataclass(frozen=True)
class Relation:
    oid: int
    text: str  # oid::regclass::text: quoted, schema-qualified when off the search_path
    name: str
    schema: int
    kind: str  # pg_class.relkind: 'p' partitioned table, 'r' table, 'I' partitioned index, 'i' index


def steps(conn, statement: str) -> Iterator[str]:
    """The statements that carry out `statement`: the statement itself, unless it is a CREATE INDEX
    CONCURRENTLY on a partitioned table. Catalog reads on `conn` (autocommit) happen between the
    steps, so the caller must have executed each step before asking for the next."""
    m = CREATE_INDEX_RE.match(statement.strip())
    table = _partitioned_table(conn, m["table"]) if m else None
    if m is None or table is None:
        yield statement
        return
    if not m["name"]:
        raise PartitionedIndexError(
            f"name the index built on the partitioned table {table.text}: a rerun finds a half-built one by its name"
        )
    spec = IndexSpec(unique=bool(m["unique"]), definition=m["definition"].strip())
    yield from _build(conn, table, _unquote(m["name"]), spec, if_not_exists=bool(m["if_not_exists"]))


def _build(conn, table: Relation, name: str, spec: IndexSpec, if_not_exists: bool) -> Iterator[str]:
    index = _index_named(conn, name, table.schema)
    valid = index is not None and _is_valid(conn, index)
    if index is None or (valid and not if_not_exists):  # the latter to fail as Postgres would
        yield spec.statement(_quote(conn, name), table.text, concurrently=False, only=True, if_not_exists=if_not_exists)
    if valid:
        return
    # INVALID until every partition's index is attached: completed here, also after a stop.
    index = _check_belongs(conn, index or _index_named(conn, name, table.schema), table)
    spec = _spec_of(conn, index)  # the partitions' must match the parent's as built, whatever the file says now
    tried = set()
    while missing := _partitions_without_index(conn, table, index):
        for partition in missing:
            if partition.oid in tried:  # attached a moment ago: cannot be missing again
                raise PartitionedIndexError(f"{partition.text} still has no index attached to {index.text}")
            tried.add(partition.oid)
            child_name = child_index_name(partition.name, table.name, name)
            yield from _drop_if_stale(conn, _index_named(conn, child_name, partition.schema), partition, spec)
            if partition.kind == "p":
                yield from _build(conn, partition, child_name, spec, if_not_exists=True)
            else:
                yield spec.statement(
                    _quote(conn, child_name), partition.text, concurrently=True, only=False, if_not_exists=True
                )
            child = _check_belongs(conn, _index_named(conn, child_name, partition.schema), partition)
            if not _is_valid(conn, child):
                raise PartitionedIndexError(f"{child.text} is INVALID after its build; not attaching it")
            yield f"ALTER INDEX {index.text} ATTACH PARTITION {child.text}"
    if not _is_valid(conn, index):
        # Every partition has its index attached, yet Postgres judged validity before the last
        # partition without one went (detached): it judges again on an ATTACH, even a repeated one.
        attached = _attached_children(conn, index)
        if attached:
            yield f"ALTER INDEX {index.text} ATTACH PARTITION {attached[0].text}"
        if not _is_valid(conn, index):
            invalid = [c.text for c in attached if not _is_valid(conn, c)]
            raise PartitionedIndexError(
                f"{index.text} stays INVALID: attached partition indexes {invalid} are INVALID "
                "(REINDEX INDEX CONCURRENTLY each, then run the migration again)"
            )


def _drop_if_stale(conn, existing: Relation | None, partition: Relation, spec: IndexSpec) -> Iterator[str]:
    """A partition index of the derived name left over from an earlier definition (its parent's
    index dropped and written anew) is dropped before the build; Postgres would refuse to attach it."""
    if existing is None:
        return
    _check_belongs(conn, existing, partition)
    if _spec_of(conn, existing) == spec:
        return
    if partition.kind == "p":
        raise PartitionedIndexError(
            f"{existing.text} is left from another definition of the index: DROP INDEX it, then run the migration again"
        )
    yield f"DROP INDEX CONCURRENTLY {existing.text}"


def child_index_name(partition: str, table: str, index: str) -> str:
    """`<partition>_<suffix>`: the suffix is the index name without its table's prefix
    (digest_events_category_idx on digest_events_p2026_01 is digest_events_p2026_01_category_idx).
    The same every run, so a rerun finds what an earlier one built."""
    suffix = index[len(table) + 1 :] if index.startswith(table + "_") and len(index) > len(table) + 1 else index
    name = f"{partition}_{suffix}"
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return name.encode()[: MAX_NAME_BYTES - 9].decode(errors="ignore") + "_" + digest


def _quote(conn, name: str) -> str:
    """Quoted only where needed, as Postgres writes names (and as the runner's logs read best)."""
    with conn.cursor() as cur:
        cur.execute("SELECT quote_ident(%s)", (name,))
        return cur.fetchone()[0]


def _unquote(identifier: str) -> str:
    if identifier.startswith('"'):
        return identifier[1:-1].replace('""', '"')
    return identifier.lower()


_RELATION = "SELECT c.oid, c.oid::regclass::text, c.relname, c.relnamespace, c.relkind FROM pg_class c"


def _fetch(conn, sql: str, params) -> list[Relation]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return [Relation(*row) for row in cur.fetchall()]


def _partitioned_table(conn, table: str) -> Relation | None:
    found = _fetch(conn, _RELATION + " WHERE c.oid = to_regclass(%s) AND c.relkind = 'p'", (table,))
    return found[0] if found else None


def _index_named(conn, name: str, schema: int) -> Relation | None:
    found = _fetch(conn, _RELATION + " WHERE c.relname = %s AND c.relnamespace = %s", (name, schema))
    return found[0] if found else None


def _check_belongs(conn, index: Relation | None, table: Relation) -> Relation:
    """`index` itself once it is known to be an index on `table`."""
    with conn.cursor() as cur:
        cur.execute("SELECT indrelid FROM pg_index WHERE indexrelid = %s", (index.oid if index else None,))
        row = cur.fetchone()
    if index is None or not row or row[0] != table.oid:
        raise PartitionedIndexError(
            f"{index.text if index else 'the index'} is not an index on {table.text}: the name is taken"
        )
    return index


def _is_valid(conn, index: Relation) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = %s", (index.oid,))
        row = cur.fetchone()
    return bool(row and row[0])  # no row: the name belongs to something else than an index


def _spec_of(conn, index: Relation) -> IndexSpec:
    """What Postgres says the index is, from USING on (the same text for a parent's index and a
    matching partition's: columns by name, the predicate, storage parameters)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT indisunique, substring(pg_get_indexdef(indexrelid) FROM ' (USING .*)$') "
            "FROM pg_index WHERE indexrelid = %s",
            (index.oid,),
        )
        unique, definition = cur.fetchone()
    return IndexSpec(unique=unique, definition=definition)


def _partitions_without_index(conn, table: Relation, index: Relation) -> list[Relation]:
    return _fetch(
        conn,
        _RELATION
        + """
        JOIN pg_inherits i ON i.inhrelid = c.oid
        WHERE i.inhparent = %(table)s AND NOT i.inhdetachpending
          AND NOT EXISTS (SELECT 1 FROM pg_inherits ii JOIN pg_index x ON x.indexrelid = ii.inhrelid
                          WHERE ii.inhparent = %(index)s AND x.indrelid = c.oid)
        ORDER BY c.relname""",
        {"table": table.oid, "index": index.oid},
    )


def _attached_children(conn, index: Relation) -> list[Relation]:
    return _fetch(
        conn,
        _RELATION + " JOIN pg_inherits i ON i.inhrelid = c.oid WHERE i.inhparent = %s ORDER BY c.relname",
        (index.oid,),
    )
