"""`python -m scripts.demo_data`: a few subscribers and events so a newcomer sees digests arrive,
and a week of mail history for the /admin dashboard (scripts/demo_history.py)
(development only: `make demo`, `make run`)."""
from __future__ import annotations

import random
import sys
from datetime import datetime, timedelta, timezone

from app import apikeys, db, ingest, subscribers
from scripts import demo_history

DEMO_USERS = [
    ("demo-ana", "ana@example.test", "Ana Lima", "Europe/Lisbon"),
    ("demo-bo", "bo@example.test", "Bo Chen", "America/New_York"),
    ("demo-cy", "cy@example.test", "Cy Okafor", "Asia/Tokyo"),
]
ACTORS = ["Ana", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus"]


def load() -> dict:
    db.init()
    for user_id, email, name, tz in DEMO_USERS:
        subscribers.upsert(user_id, subscribers.validate({"email": email, "name": name, "timezone": tz})[0])
    rng = random.Random(7)
    now = datetime.now(timezone.utc)
    rows = []
    for user_id, *_ in DEMO_USERS:
        for i in range(20):
            actor = rng.choice(ACTORS)
            post = rng.randint(1, 4)
            kind = rng.choice(["like", "comment", "follow"])
            rows.append(("demo", f"{user_id}-{i}", user_id, kind, "post", f"post-{post}", actor.lower(), actor,
                         '{"title": "Post %d"}' % post, now - timedelta(minutes=5 * i)))
    with db.raw_cursor() as cur:
        result = ingest.insert_rows(cur, [rows])[0]
    keys = {}
    if not any(name == "demo-producer" and revoked is None for _, name, _, _, _, revoked in apikeys.list_keys()):
        keys["events"] = apikeys.create("demo-producer", "events")
        keys["admin"] = apikeys.create("demo-admin", "admin")
    return {"subscribers": len(DEMO_USERS), "events_new": result.accepted, "keys": keys,
            "history": demo_history.load()}


def main() -> int:
    summary = load()
    print(f"demo data: {summary['subscribers']} subscribers, {summary['events_new']} new events")
    history = summary["history"]
    print(f"demo history for /admin: {history['mails']} mails over 7 days, {history['opens_clicks']} opens/clicks, "
          f"{history['bounces_complaints']} bounces/complaints")
    for scope, key in summary["keys"].items():
        print(f"demo {scope} API key (shown once): {key}")
    if "admin" in summary["keys"]:
        print("operator dashboard: /admin on the web port (sign in with the admin key)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
