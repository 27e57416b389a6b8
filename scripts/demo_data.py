"""`python -m scripts.demo_data`: a few subscribers and events so a newcomer sees digests arrive,
and a week of mail history for the /admin dashboard (scripts/demo_history.py)
(development only: `make demo`, `make run`)."""

from __future__ import annotations

import json
import random
import sys
from datetime import UTC, datetime, timedelta

import dotenv

from app.newsletter import service as newsletters
from app.platform import apikeys, config, db
from app.subscribers import categories
from app.subscribers import records as subscribers
from digest import ingest
from scripts import demo_history
from scripts.dev import env_file

DEMO_USERS = [
    ("demo-ana", "ana@example.test", "Ana Lima", "Europe/Lisbon"),
    ("demo-bo", "bo@example.test", "Bo Chen", "America/New_York"),
    ("demo-cy", "cy@example.test", "Cy Okafor", "Asia/Tokyo"),
    ("demo-ivy", "ivy@example.test", "Ivy Novak", "Europe/Berlin"),
]
# Ivy: a mail soon after events arrive; Cy: a digest every hour (README "Cadences", "Send now").
CADENCES = {"demo-ivy": "immediately", "demo-cy": "hourly"}
# (actor_id, name): the demo users act too — their own activity never shows in their own digest.
ACTORS = [
    ("demo-ana", "Ana"),
    ("demo-bo", "Bo"),
    ("demo-cy", "Cy"),
    ("dee", "Dee"),
    ("eli", "Eli"),
    ("fay", "Fay"),
    ("gus", "Gus"),
    ("demo-ivy", "Ivy"),
]


# A picture beside each actor's name, served by the web app itself (app/web/static/avatar-*.svg):
# `make run` reaches nothing on the internet, and the demo digest shows its pictures offline.
def avatar_url(actor: str) -> str:
    return f"{config.get().base_url}/static/avatar-{actor.lower()}.svg"


# Links in the demo point at a reserved name (RFC 6761 `.test`): nothing ever resolves them.
POSTS = [
    ("post-1", "Launch notes"),
    ("post-2", "Roadmap for Q3"),
    ("post-3", "Design review: onboarding"),
    ("post-4", "Hiring update"),
]
# What PUT /v1/categories/{key} would register (README "Categories").
CATEGORIES = {
    "follow": {"label": "Follows", "description": "Someone follows a post of yours", "verb": "followed"},
    "like": {"label": "Likes", "description": "Someone likes a post of yours", "verb": "liked"},
    "comment": {"label": "Comments", "description": "Someone comments on a post of yours", "verb": "commented on"},
    # "send now": its events go out at once, even to daily subscribers (README "Send now")
    "mention": {
        "label": "Mentions",
        "description": "Someone mentions you",
        "verb": "mentioned you in",
        "delivery": "immediate",
    },
}
# Events that cannot wait, a few minutes old: (user_id, producer id, category, actor, priority high).
URGENT = [
    ("demo-ana", "demo-ana-mention-1", "mention", ("gus", "Gus"), False),
    ("demo-bo", "demo-bo-high-1", "comment", ("fay", "Fay"), True),
]


# A newsletter whose body is an HTML fragment: it goes out inside the mail layout (brand header,
# card, BRAND_* colours; app/platform/mail_layout.py), with the standard footer added (no {{unsubscribe_url}}).
NEWSLETTER_SUBJECT = "What's new at Notify{{#name}}, {{name}}{{/name}}"
NEWSLETTER_HTML = """<h1>{{greeting}} here is what's new</h1>
<p>You can now stop newsletters and keep your digest, or the other way round: every mail's
unsubscribe link stops only that kind of mail, and the page behind it still offers "everything".</p>
<p>Each digest also has a <strong>View in your browser</strong> link at the top.</p>
<p><a href="https://example.test/blog/streams">Read the announcement</a></p>"""


def demo_newsletter() -> int | None:
    """Create the demo newsletter once and ask for it to be sent to the demo users (the worker of
    `make run` sends it). Returns its id, or None when it exists already."""
    if db.query("SELECT 1 FROM newsletters WHERE subject = %s", (NEWSLETTER_SUBJECT,)):
        return None
    values, errors = newsletters.validate_new({"subject": NEWSLETTER_SUBJECT, "html": NEWSLETTER_HTML})
    assert not errors, errors
    newsletter_id = newsletters.create(values)
    newsletters.request_send(newsletter_id, {"kind": "user_ids", "user_ids": sorted(u for u, *_ in DEMO_USERS)})
    return newsletter_id


def load() -> dict:
    db.init()
    for user_id, email, name, tz in DEMO_USERS:
        subscribers.upsert(
            user_id,
            subscribers.validate(
                {"email": email, "name": name, "timezone": tz, "digest_cadence": CADENCES.get(user_id, "daily")}
            )[0],
        )
    for key, values in CATEGORIES.items():
        categories.upsert(key, categories.validate(values)[0])
    rng = random.Random(7)
    now = datetime.now(UTC)
    rows = []
    for user_id, *_ in DEMO_USERS:
        titled, done = set(), set()
        for i in range(24, 0, -1):  # oldest first, over the last day and a bit
            actor_id, actor = rng.choice(ACTORS)
            post, title = POSTS[min(rng.randint(0, 4), 3)]
            kind = rng.choice(["like", "comment", "follow", "follow"])
            if (actor_id, kind, post) in done and kind != "comment":  # one follow or like per person
                continue
            done.add((actor_id, kind, post))
            # Only a post's first event carries its title and link, as a "created" event would:
            # the digest keeps them although later events say nothing.
            payload = {"actor_avatar_url": avatar_url(actor)}
            if post not in titled:
                titled.add(post)
                payload |= {"entity_title": title, "entity_url": f"https://example.test/posts/{post}"}
            rows.append(
                (
                    "demo",
                    f"{user_id}-{i}",
                    user_id,
                    kind,
                    "post",
                    post,
                    actor_id,
                    actor,
                    json.dumps(payload),
                    now - timedelta(minutes=65 * i),
                    None,
                )
            )
    for user_id, producer_id, kind, (actor_id, actor), high in URGENT:
        payload = {"actor_avatar_url": avatar_url(actor)}
        rows.append(
            (
                "demo",
                producer_id,
                user_id,
                kind,
                "post",
                "post-1",
                actor_id,
                actor,
                json.dumps(payload),
                now - timedelta(minutes=5),
                high or None,
            )
        )
    with db.raw_cursor() as cur:
        result = ingest.insert_rows(cur, [rows])[0]
    return {
        "subscribers": len(DEMO_USERS),
        "events_new": result.accepted,
        "keys": demo_keys(),
        "history": demo_history.load(),
        "newsletter": demo_newsletter(),
    }


# scope -> (the key's name in api_keys, the variable of .env that holds the key itself)
DEMO_KEYS = {"events": ("demo-producer", "NOTIFY_EVENTS_KEY"), "admin": ("demo-admin", "NOTIFY_ADMIN_KEY")}


def demo_keys() -> dict[str, tuple[str, bool]]:
    """The demo API keys, kept in .env (only their sha256 is in the database): a key there that
    still works is kept; otherwise (first run, a new database, a revoked key) a new one is created
    and written there. Without a file (ENV_FILE empty) they are created once, printed once.
    scope -> (key, created now)."""
    target = env_file.path()
    if target is None:
        if any(name == "demo-producer" and revoked is None for _, name, _, _, _, revoked in apikeys.list_keys()):
            return {}
        return {scope: (apikeys.create(name, scope), True) for scope, (name, _) in DEMO_KEYS.items()}
    stored = dotenv.dotenv_values(target) if target.exists() else {}
    keys = {}
    for scope, (name, variable) in DEMO_KEYS.items():
        key = stored.get(variable) or ""
        principal = apikeys.KeyCache().lookup(key)
        if principal is not None and principal.scope == scope:
            keys[scope] = (key, False)
        else:
            keys[scope] = (apikeys.create(name, scope), True)
    env_file.write({DEMO_KEYS[scope][1]: key for scope, (key, _) in keys.items()}, target)
    return keys


def main() -> int:
    summary = load()
    print(f"demo data: {summary['subscribers']} subscribers, {summary['events_new']} new events")
    history = summary["history"]
    print(
        f"demo history for /admin: {history['mails']} mails over 7 days, {history['opens_clicks']} opens/clicks, "
        f"{history['bounces_complaints']} bounces/complaints"
    )
    if summary["newsletter"]:
        print(f"demo newsletter {summary['newsletter']} queued for the demo users (in the layout; mail viewer)")
    for scope, (key, created) in summary["keys"].items():
        variable = DEMO_KEYS[scope][1]
        where = f"  (in {env_file.path()} as {variable})" if env_file.path() else " (shown once)"
        print(f"demo {scope} API key{' (new)' if created else ''}: {key}{where}")
    print("operator dashboard: /admin on the web port (sign in with the admin key)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
