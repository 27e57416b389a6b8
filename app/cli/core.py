"""Core operator commands: migrate, API keys, settings, the metrics exporter."""

from __future__ import annotations

import sys

from app.cli import commands
from app.platform import apikeys, config, db, migrate, observability
from app.subscribers import rekey


def cmd_migrate(args) -> int:
    """apply pending SQL migrations (release phase)"""
    if args.status:
        rows = migrate.status()
        for r in rows:
            extra = f"{r['applied_at']}  {r['duration_ms']} ms" if r["state"] == "applied" else ""
            print(f"{r['version']}  {r['name']:<40} {r['state']:<8} {extra}")
        pending = sum(r["state"] == "pending" for r in rows)
        print(f"{len(rows) - pending} applied, {pending} pending")
        return 0
    observability.init_sentry("release")
    applied = migrate.migrate()
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "; schema is up to date"))
    return 0


def cmd_create_api_key(args) -> int:
    """create an API key; prints it once"""
    db.init()
    try:
        key = apikeys.create(args.name, args.scope)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(f"(scope {args.scope}; shown once, only its hash is stored)", file=sys.stderr)
    return 0


def cmd_revoke_api_key(args) -> int:
    """revoke keys by name or prefix"""
    db.init()
    n = apikeys.revoke(args.name)
    print(f"revoked {n} key(s)")
    return 0 if n else 1


def cmd_list_api_keys(args) -> int:
    """list keys (never the keys themselves)"""
    db.init()
    for key_id, name, scope, prefix, created, revoked in apikeys.list_keys():
        print(
            f"{key_id:>4}  {name:<24} {scope:<7} {prefix}…  created {created:%Y-%m-%d}"
            + (f"  REVOKED {revoked:%Y-%m-%d}" if revoked else "")
        )
    return 0


SECRETS = (
    "secret_key",
    "secret_key_fallbacks",
    "sendgrid_api_key",
    "dkim_private_key",
    "aws_secret_access_key",
    "aws_session_token",
    "postmark_server_token",
    "mailgun_api_key",
    "postmark_webhook_password",
    "mailgun_webhook_signing_key",
)


def cmd_settings(args) -> int:
    """print every setting in force (secrets masked), or --markdown"""
    if args.markdown:
        print(config.markdown_table())
        return 0
    current = config.get()
    for f in config.fields(config.Settings):
        value = getattr(current, f.name)
        secret = f.name in SECRETS
        print(f"{config.env_name(f.name)}={'***' if secret and value else value}")
    return 0


def cmd_rekey_addresses(args) -> int:
    """store every address's canonical form again where it is wrong (after a deploy that changed non-ASCII addresses
    meanwhile)"""
    conn = db.connect_raw(migrate.target_url(), autocommit=True)
    try:
        counts = rekey.rekey(conn)
    finally:
        conn.close()
    print(", ".join(f"{table}: {n} row(s) rekeyed" for table, n in counts.items()))
    return 0


def cmd_metrics_exporter(args) -> int:
    # Here, not at the top: the web stack would slow the start-up of every other command (migrate in
    # the release phase; python -X importtime shows it).
    """serve GET /metrics of this host's worker processes (a host without a web process): admin key or METRICS_TOKEN"""
    import uvicorn

    from app.web import health

    observability.init_sentry("metrics-exporter")
    uvicorn.run(health.exporter_app(), host=args.host, port=args.port, log_level="warning")
    return 0


def register(sub) -> None:
    p = commands.add(sub, "settings", cmd_settings)
    p.add_argument("--markdown", action="store_true", help="the configuration table of docs/configuration.md")
    p = commands.add(sub, "migrate", cmd_migrate)
    p.add_argument("--status", action="store_true", help="list applied and pending migrations")
    commands.add(sub, "rekey-addresses", cmd_rekey_addresses)
    p = commands.add(sub, "create-api-key", cmd_create_api_key)
    p.add_argument("name")
    p.add_argument("--scope", choices=apikeys.SCOPES, required=True)
    p = commands.add(sub, "revoke-api-key", cmd_revoke_api_key)
    p.add_argument("name")
    commands.add(sub, "list-api-keys", cmd_list_api_keys)
    p = commands.add(sub, "metrics-exporter", cmd_metrics_exporter)
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9191, help="listen port (default 9191)")
