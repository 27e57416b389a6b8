"""May we mail this address now? The one definition, as SQL every sending path composes into its
own statement (the digest claim, send-now runs, the newsletter outbox fill and claim, test sends).

A fragment rather than a view or a SQL function: each path decides in the statement that claims
or writes its rows (I6: an unsubscribe or suppression made a second ago counts), and a function
with a subquery is never inlined by the planner, so it would run as a separate call per row of a
million-row outbox fill. tests/subscribers/test_mailable.py checks that every path builds its SQL from here
and that each "may not" state stops each path.

The answer is NULL (mail may go) or why not, the first that applies:
  'unsubscribed'                    from everything (subscribers.unsubscribed_at)
  'unsubscribed from newsletters'   the newsletter stream (newsletters_unsubscribed_at)
  'suppressed: <reason>'            the address is suppressed; an erased subscriber's address stays
                                    suppressed with reason 'erased', so erasure is this case too
  'paused'                          digests paused (paused_until)
  'cadence off'                     the digest stream (digest_cadence 'off')
"""

from __future__ import annotations

from app.subscribers.streams import DIGESTS, NEWSLETTERS


def _word(reason: str, when: str) -> str:
    return "'" + reason + when + "'"


def address_refusal(address: str, when: str = "") -> str:
    """SQL: NULL, or 'suppressed<when>: <reason>' when the canonical address (a SQL expression)
    is suppressed."""
    return f"(SELECT {_word('suppressed', when)} || ': ' || x.reason FROM suppressions x WHERE x.email = {address})"


def refusal(stream: str, s: str = "s", now: str = "now()", when: str = "") -> str:
    """SQL: NULL when subscriber `s` (an alias of a subscribers row) may be mailed on `stream` at
    `now` (a SQL expression), else why not (module docstring); `when` is appended to the reason's
    first word (" before send": the newsletter claim says when it noticed)."""
    if stream not in (DIGESTS, NEWSLETTERS):
        raise ValueError(f"no mail stream {stream!r}")
    cases = [f"WHEN {s}.unsubscribed_at IS NOT NULL THEN {_word('unsubscribed', when)}"]
    if stream == NEWSLETTERS:
        cases.append(
            f"WHEN {s}.newsletters_unsubscribed_at IS NOT NULL THEN {_word('unsubscribed from newsletters', when)}"
        )
    suppressed = address_refusal(f"{s}.canonical_email", when)
    if stream == DIGESTS:  # one suppression lookup per row: the states after it are its fallback
        suppressed = (
            f"coalesce({suppressed}, CASE WHEN {s}.paused_until > {now} THEN {_word('paused', when)}"
            f" WHEN {s}.digest_cadence = 'off' THEN {_word('cadence off', when)} END)"
        )
    cases.append(f"ELSE {suppressed}")
    return "(CASE " + " ".join(cases) + " END)"


def may_mail(stream: str, s: str = "s", now: str = "now()") -> str:
    """SQL condition: subscriber `s` may be mailed on `stream` at `now`."""
    return f"{refusal(stream, s, now)} IS NULL"
