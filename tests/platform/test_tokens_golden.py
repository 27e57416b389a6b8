"""Subscriber tokens already sent in mails keep verifying: golden tokens made with a fixed key.
Add new ones when the format grows; never replace these (they are in people's inboxes)."""

from __future__ import annotations

import pytest

from app.platform import tokens

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)

KEY = "golden-fixture-key-never-change-0123456789"
GOLDEN = [
    ("unsubscribe", "djE6NDI6MQ.g-8-eYyRM3-pURygPv6nrg", (42, 1, None)),
    ("preferences", "djE6NDI6Mw.3FKnMFIiWkYDAxm78XVqFA", (42, 3, None)),
    ("unsubscribe", "djE6NzoyOmNhdGVnb3J5Omxpa2Vz.ytY-HhECJqA1rU9rkEtaeg", (7, 2, "category:likes")),
    ("unsubscribe", "djE6OToxOm5ld3NsZXR0ZXI6MTI.y_td8O5k0tcXLuEOi1qz6Q", (9, 1, "newsletter:12")),
    # streams (issue 11): each mail's own stream, and a digest's hosted copy
    ("unsubscribe", "djE6NDI6MTpkaWdlc3Rz.cI28xltrwa9o6_tm8EifMg", (42, 1, "digests")),
    ("unsubscribe", "djE6NDI6MTpuZXdzbGV0dGVycw.8hkZzQUen8mkCO9Y9govYA", (42, 1, "newsletters")),
    ("view", "djE6NDI6MTpydW46MTIzNA.qGfYCv48V5VIuZpqhf_vQg", (42, 1, "run:1234")),
]


@pytest.mark.parametrize("purpose, token, claims", GOLDEN)
def test_golden_token_still_verifies(settings, purpose, token, claims):
    settings(secret_key=KEY)
    got = tokens.verify(purpose, token)
    assert (got.subscriber_id, got.token_version, got.scope) == claims
    assert tokens.make(purpose, *claims) == token


@pytest.mark.parametrize("purpose, token, claims", GOLDEN)
def test_golden_token_verifies_after_a_key_rotation(settings, purpose, token, claims):
    settings(secret_key="a-brand-new-key-after-rotation-0123456789", secret_key_fallbacks=(KEY,))
    assert tokens.verify(purpose, token) is not None
    assert tokens.verify("preferences" if purpose == "unsubscribe" else "unsubscribe", token) is None
