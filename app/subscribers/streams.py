"""Mail streams, and what the scope of an unsubscribe token stops.

Two streams: digests and newsletters. Each mail's List-Unsubscribe (and its visible unsubscribe
link) carries its own stream in the token scope, so a one-click unsubscribe stops only that
stream, as Gmail expects; the page behind the link also offers "everything".

Scopes (inside the signed token, app/platform/tokens.py), old ones included because they are in inboxes:
  "digests"            the digest stream (digest_cadence 'off', the previous cadence kept)
  "newsletters"        the newsletter stream (subscribers.newsletters_unsubscribed_at)
  "category:<key>"     one topic (category_opt_outs)
  none                 everything (subscribers.unsubscribed_at). Every link mailed before streams
                       existed has no scope and promised "stop all emails": it keeps that meaning.
  "newsletter:<id>"    everything, as it always meant (newsletters were not separate lists then;
                       tests/platform/test_tokens_golden.py keeps such a token verifying).
A scope this code does not know (a newer release's, after a rollback) also means everything:
the safe reading of a link someone clicked to leave.
"""

from __future__ import annotations

from dataclasses import dataclass

DIGESTS = "digests"
NEWSLETTERS = "newsletters"
EVERYTHING = "everything"
CATEGORY = "category"

_CATEGORY_PREFIX = "category:"


@dataclass(frozen=True)
class Target:
    kind: str  # DIGESTS, NEWSLETTERS, CATEGORY or EVERYTHING
    category: str | None = None


def target(scope: str | None) -> Target:
    if not scope:
        return Target(EVERYTHING)
    if scope.startswith(_CATEGORY_PREFIX) and len(scope) > len(_CATEGORY_PREFIX):
        return Target(CATEGORY, scope[len(_CATEGORY_PREFIX) :])
    if scope == DIGESTS:
        return Target(DIGESTS)
    if scope == NEWSLETTERS:
        return Target(NEWSLETTERS)
    return Target(EVERYTHING)


# What each mail's List-Unsubscribe and visible unsubscribe link carry.
DIGEST_MAIL_SCOPE = DIGESTS
NEWSLETTER_MAIL_SCOPE = NEWSLETTERS


def label(target: Target) -> str:
    """What the link stops, as the page says it: "Stop {label} to ana@…?"."""
    return {DIGESTS: "digest emails", NEWSLETTERS: "newsletters"}.get(target.kind, "all emails")
