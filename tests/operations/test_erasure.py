"""Right to erasure: after DELETE /v1/subscribers/{id} no table holds the address, the user_id, the
subscriber id, or the IP/user agent of their clicks, except the one suppressions row that keeps the
address from ever being mailed again. Everything is produced through the real paths (API, digest
sender, newsletter send loop, /c/ and /o/ routes, SendGrid webhook) and searched for in every table."""

from __future__ import annotations

import re

import orjson
import pytest
import redis as redis_lib

from app.newsletter import sender, service
from app.platform import config, db
from app.platform.providers.base import Provider, SendResult
from digest import send as digest_send
from tests import factories
from tests.conftest import auth
from tests.newsletter_support import start
from tracking import recorder, resolve, stats, webhook_apply

ADDRESS = "Erase.Me+4b7f@Example.test"
USER_ID = "erase-me-4b7f"
SUB_ID = 918273645  # a digit run no other row contains by accident
IP, UA = "198.51.100.77", "EraseMeBrowser/4.7 (ua-4b7f)"
BO = {"user_id": "bo-keep-9c1d", "email": "bo@example.test", "ip": "192.0.2.55", "ua": "BoBrowser/1.0"}
NEEDLES = (ADDRESS, USER_ID, str(SUB_ID), IP, "ua-4b7f")


class Capture(Provider):
    name, max_batch = "capture", 1000

    def __init__(self):
        self.mails = []

    def send_batch(self, mails, progress=None):
        self.mails.extend(mails)
        return [SendResult(ok=True, message_id=f"msg-{m.idempotency_key}") for m in mails]

    def to(self, address):
        return [m for m in self.mails if m.to.lower() == address.lower()]


@pytest.fixture(autouse=True)
def tracking_on(settings):
    settings(tracking=True, base_url="http://localhost:8000", tracking_scanner_seconds=0)
    resolve.clear_caches()
    yield
    recorder.recorder().flush()
    resolve.clear_caches()


def rows_mentioning(needles) -> dict[str, list[str]]:
    """Every row of every table in the schema whose text form contains one of the needles."""
    tables = [
        t
        for (t,) in db.query(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
        )
    ]
    assert {"subscribers", "email_link_history", "webhook_events", "suppressions"} <= set(tables)
    patterns = ["%" + n.replace("%", r"\%").replace("_", r"\_") + "%" for n in needles]
    found = {}
    for table in tables:
        rows = db.query(f'SELECT t::text FROM "{table}" t WHERE t::text ILIKE ANY(%s)', (patterns,))
        if rows:
            found[table] = [r[0] for r in rows]
    return found


def redis_values(url: str) -> list[bytes]:
    """Everything stored in the test Redis db (broker messages and hints)."""
    client = redis_lib.Redis.from_url(url)
    readers = {
        b"string": lambda k: [client.get(k)],
        b"hash": lambda k: list(client.hgetall(k).items()),
        b"list": lambda k: client.lrange(k, 0, -1),
        b"set": lambda k: list(client.smembers(k)),
        b"zset": lambda k: client.zrange(k, 0, -1),
    }
    out = []
    for key in client.scan_iter():
        out.append(key)
        out.extend(repr(v).encode() for v in readers.get(client.type(key), lambda k: [])(key))
    client.close()
    return out


def put_subscriber(client, key, user_id, email, sub_id=None):
    if sub_id:
        db.query("SELECT setval('subscribers_id_seq', %s, false)", (sub_id,))
    r = client.put(f"/v1/subscribers/{user_id}", json={"email": email, "name": "Erin Example"}, headers=auth(key))
    assert r.status_code == 201
    return r.json()["id"]


def post_events(client, key, user_id, n=2):
    events = [
        {
            "id": f"{user_id}-ev-{i}",
            "user_id": user_id,
            "category": "likes",
            "entity_type": "post",
            "entity_id": f"p{i}",
            "actor_name": "Bo",
            "payload": {"title": f"Post {i}", "url": f"https://app.example/{user_id}/post/{i}"},
        }
        for i in range(n)
    ]
    assert client.post("/v1/events", json={"events": events}, headers=auth(key)).status_code == 202


def click_and_open(client, mail, ip, ua):
    headers = {"User-Agent": ua, "X-Forwarded-For": ip}
    click = re.search(r'http://localhost:8000(/c/[^"]+)"', mail.html).group(1)
    pixel = re.search(r'http://localhost:8000(/o/[^"]+)"', mail.html).group(1)
    assert client.get(click, headers=headers, follow_redirects=False).status_code == 302
    assert client.get(pixel, headers=headers).status_code == 200
    return click


def webhook_events(client, mail, address, *names):
    body = [
        {
            "event": name,
            "email": address,
            "sg_event_id": f"{mail.idempotency_key}-{name}-{address}",
            "timestamp": 1763700000,
            "ip": "203.0.113.200",
            **mail.custom_args,
        }
        for name in names
    ]
    r = client.post("/webhooks/sendgrid", content=orjson.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["stored"] == len(names)


def subscriber_with_digest(client, key, provider, user_id, email, sub_id=None):
    """A subscriber (via the API) with events (via the API) and a sent digest."""
    sid = put_subscriber(client, key, user_id, email, sub_id)
    post_events(client, key, user_id)
    assert digest_send.process([factories.digest_run(sid)], provider=provider)["sent"] == 1
    return sid


def test_delete_erases_everything_but_the_suppression(client, admin_key, settings):
    settings(forwarded_allow_ips="*")  # TestClient's peer stands in for the proxy that sets X-Forwarded-For
    provider = Capture()
    sid = subscriber_with_digest(client, admin_key, provider, USER_ID, ADDRESS, SUB_ID)
    assert sid == SUB_ID
    bo = subscriber_with_digest(client, admin_key, provider, BO["user_id"], BO["email"])
    nl = factories.newsletter()
    start(nl)
    sender.send_batch(nl, provider=provider, reenqueue=False, budget_seconds=60)
    (digest, newsletter), (bo_digest, bo_newsletter) = provider.to(ADDRESS), provider.to(BO["email"])
    old_click = None
    for mail in (digest, newsletter):
        old_click = click_and_open(client, mail, IP, UA)
        webhook_events(client, mail, ADDRESS, "processed", "delivered", "open")
    for mail in (bo_digest, bo_newsletter):
        click_and_open(client, mail, BO["ip"], BO["ua"])
        webhook_events(client, mail, BO["email"], "delivered")
    webhook_apply.apply_events([i for (i,) in db.query("SELECT id FROM webhook_events WHERE event <> 'open'")])
    recorder.recorder().flush()
    db.query(
        "INSERT INTO legacy_link_codes (code, link_id, subscriber_id) SELECT 'OLD-1', id, %s FROM email_links "
        "WHERE mail_kind = 'newsletter'",
        (sid,),
    )
    # Everything the test is about really is there before the erasure.
    before = rows_mentioning(NEEDLES)
    for table in (
        "subscribers",
        "digest_events",
        "email_log",
        "email_links",
        "email_link_history",
        "webhook_events",
        "legacy_link_codes",
    ):
        assert table in before, f"nothing in {table} mentions the subscriber: the test proves nothing"
    assert db.query("SELECT count(*) FROM digest_runs WHERE subscriber_id = %s", (sid,)) == [(1,)]
    nl_stats = stats.mail_stats("newsletter", nl)
    assert nl_stats["clicks"]["human"] == 2 and nl_stats["opens"]["human"] == 2

    assert client.delete(f"/v1/subscribers/{USER_ID}", headers=auth(admin_key)).status_code == 204

    assert rows_mentioning(NEEDLES) == {
        "suppressions": [row for (row,) in db.query("SELECT s::text FROM suppressions s")]
    }
    assert db.query("SELECT email, reason FROM suppressions") == [(ADDRESS.lower(), "erased")]
    assert db.query("SELECT code, subscriber_id FROM legacy_link_codes") == [("OLD-1", None)]  # still resolves
    # Their digest is gone with its counters; the newsletter keeps anonymous totals.
    assert db.query("SELECT count(*) FROM digest_runs") == [(1,)]
    assert db.query("SELECT count(*) FROM mail_event_counts WHERE mail_kind = 'digest'") == [(1,)]  # Bo's
    after = stats.mail_stats("newsletter", nl)
    assert after["clicks"]["human"] == 2 and after["opens"]["human"] == 2
    assert after["clicks"]["unique_human"] == 1 and after["events"]["delivered"] == 2
    # Bo is untouched.
    bo_rows = rows_mentioning((BO["email"], BO["user_id"], BO["ip"]))
    assert {"subscribers", "digest_events", "email_log", "email_links", "email_link_history", "webhook_events"} <= set(
        bo_rows
    )
    assert db.query("SELECT count(*) FROM email_link_history WHERE subscriber_id = %s AND ip IS NOT NULL", (bo,)) == [
        (4,)
    ]

    # Afterwards: a click on the old newsletter mail, and SendGrid events still arriving.
    assert (
        client.get(old_click, headers={"User-Agent": UA, "X-Forwarded-For": IP}, follow_redirects=False).status_code
        == 302
    )
    recorder.recorder().flush()
    webhook_events(client, newsletter, ADDRESS, "click")
    webhook_apply.apply_events([i for (i,) in db.query("SELECT id FROM webhook_events")])
    assert rows_mentioning(NEEDLES).keys() == {"suppressions"}
    assert stats.mail_stats("newsletter", nl)["clicks"]["human"] == 3
    assert not [v for v in redis_values(config.get().redis_url) if ADDRESS.lower().encode() in v.lower()]


def test_delete_of_a_digest_link_makes_its_code_unresolvable(client, admin_key):
    provider = Capture()
    subscriber_with_digest(client, admin_key, provider, USER_ID, ADDRESS)
    click = click_and_open(client, provider.to(ADDRESS)[0], IP, UA)
    assert client.delete(f"/v1/subscribers/{USER_ID}", headers=auth(admin_key)).status_code == 204
    resolve.clear_caches()  # a web process's cache of links it resolved lives until restart
    assert client.get(click, follow_redirects=False).status_code == 404


def test_an_address_suppressed_before_keeps_its_reason_in_source(client, admin_key):
    put_subscriber(client, admin_key, USER_ID, ADDRESS)
    factories.suppression(ADDRESS.lower(), "bounce", source="sendgrid:bounce")
    assert client.delete(f"/v1/subscribers/{USER_ID}", headers=auth(admin_key)).status_code == 204
    assert db.query("SELECT email, reason, source FROM suppressions") == [
        (ADDRESS.lower(), "erased", "erasure, was bounce")
    ]


# -- every spelling of the address (issue 25, items 4 and 7) ---------------------------------------

SPELLED = "Ana@Bücher.example"
CANONICAL = "ana@xn--bcher-kva.example"
OTHER_SPELLINGS = (
    "ana@xn--bcher-kva.example",
    "ANA@BÜCHER.EXAMPLE",
    "ａｎａ@ｂüｃｈｅｒ.example",
    "ANA@XN--BCHER-KVA.EXAMPLE",
)


def post_webhook(client, *events):
    body = [
        {"sg_event_id": f"sg-{i}-{e['event']}-{e['email']}", "timestamp": 1763700000, **e} for i, e in enumerate(events)
    ]
    r = client.post("/webhooks/sendgrid", content=orjson.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["stored"] == len(events)


def test_erasure_deletes_the_webhook_events_of_every_spelling_and_keeps_the_canonical_suppression(client, admin_key):
    put_subscriber(client, admin_key, USER_ID, SPELLED)
    put_subscriber(client, admin_key, BO["user_id"], BO["email"])
    post_webhook(client, *({"event": "open", "email": e} for e in (SPELLED, *OTHER_SPELLINGS, BO["email"])))
    half = [i for (i,) in db.query("SELECT id FROM webhook_events ORDER BY id LIMIT 3")]
    webhook_apply.apply_events(half)  # processed or not: both go
    post_webhook(client, {"event": "bounce", "type": "bounce", "email": OTHER_SPELLINGS[1]})
    webhook_apply.apply_events([i for (i,) in db.query("SELECT id FROM webhook_events WHERE event = 'bounce'")])
    assert db.query("SELECT email, reason FROM suppressions") == [(CANONICAL, "bounce")]

    assert client.delete(f"/v1/subscribers/{USER_ID}", headers=auth(admin_key)).status_code == 204

    assert db.query("SELECT email FROM webhook_events") == [(BO["email"],)]
    assert db.query("SELECT email, reason, source FROM suppressions") == [(CANONICAL, "erased", "erasure, was bounce")]
    # Events SendGrid keeps sending under any spelling are applied, then forgotten.
    post_webhook(client, *({"event": "click", "email": e} for e in OTHER_SPELLINGS))
    webhook_apply.apply_events([i for (i,) in db.query("SELECT id FROM webhook_events")])
    assert db.query("SELECT email FROM webhook_events") == [(BO["email"],)]
    assert db.query("SELECT email, reason FROM suppressions") == [(CANONICAL, "erased")]


def test_erasure_finds_events_under_every_address_the_subscriber_was_mailed_at(client, admin_key):
    sid = put_subscriber(client, admin_key, USER_ID, SPELLED)
    nl = factories.newsletter()
    factories.outbox_row(nl, sid, email="Old.Address@Exämple.test")  # the address they had then
    post_webhook(
        client,
        {"event": "open", "email": "old.address@xn--exmple-cua.test"},
        {"event": "open", "email": "ＯＬＤ.ａｄｄｒｅｓｓ@exämple.test"},
    )
    assert client.delete(f"/v1/subscribers/{USER_ID}", headers=auth(admin_key)).status_code == 204
    assert db.query("SELECT count(*) FROM webhook_events") == [(0,)]


def test_erasure_removes_the_user_id_from_every_newsletter_audience(client, admin_key):
    put_subscriber(client, admin_key, USER_ID, SPELLED)
    put_subscriber(client, admin_key, BO["user_id"], BO["email"])
    everyone, chosen, others = factories.newsletter(), factories.newsletter(), factories.newsletter()
    requested = {"kind": "user_ids", "user_ids": sorted([USER_ID, BO["user_id"], "nobody"])}
    service.request_send(everyone, {"kind": "all"})
    service.request_send(chosen, requested)
    service.request_send(others, {"kind": "user_ids", "user_ids": [BO["user_id"]]})

    assert client.delete(f"/v1/subscribers/{USER_ID}", headers=auth(admin_key)).status_code == 204

    audiences = dict(db.query("SELECT id, audience FROM newsletters"))
    assert audiences == {
        everyone: {"kind": "all"},
        chosen: {"kind": "user_ids", "user_ids": sorted([BO["user_id"], "nobody"])},
        others: {"kind": "user_ids", "user_ids": [BO["user_id"]]},
    }
    assert USER_ID not in "".join(t for (t,) in db.query("SELECT n::text FROM newsletters n"))
    # The producer retrying its send request with the audience it sent is still the same request.
    assert service.request_send(chosen, requested) in ("queued", "sending")
    # A user_id with no subscriber (erased before, or never one) is removed all the same: 404.
    service.request_send(others, {"kind": "user_ids", "user_ids": [BO["user_id"]]})
    db.query(
        "UPDATE newsletters SET audience = %s WHERE id = %s",
        (orjson.dumps({"kind": "user_ids", "user_ids": ["ghost-1", "ghost-2"]}).decode(), others),
    )
    assert client.delete("/v1/subscribers/ghost-1", headers=auth(admin_key)).status_code == 404
    assert db.query("SELECT audience FROM newsletters WHERE id = %s", (others,)) == [
        ({"kind": "user_ids", "user_ids": ["ghost-2"]},)
    ]


def test_a_different_audience_is_still_a_conflict_after_an_erasure(client, admin_key):
    put_subscriber(client, admin_key, USER_ID, SPELLED)
    put_subscriber(client, admin_key, BO["user_id"], BO["email"])
    nl = factories.newsletter()
    service.request_send(nl, {"kind": "user_ids", "user_ids": sorted([USER_ID, BO["user_id"]])})
    assert client.delete(f"/v1/subscribers/{USER_ID}", headers=auth(admin_key)).status_code == 204
    put_subscriber(client, admin_key, "carla-1", "carla@example.test")
    for audience in ({"kind": "all"}, {"kind": "user_ids", "user_ids": sorted([BO["user_id"], "carla-1"])}):
        with pytest.raises(service.Conflict):
            service.request_send(nl, audience)
