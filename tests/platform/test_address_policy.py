"""One address policy (app/platform/addresses.py) from the API to the envelope, and headers as the email
package's policy writes them."""

from __future__ import annotations

import email
import email.policy
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.platform import mail
from app.platform.providers.base import OutgoingMail
from app.platform.providers.smtp import SMTPProvider
from tests.conftest import auth
from tests.digest_support import SmtpSink


def _mail(**changes) -> OutgoingMail:
    values = {
        "to": "ana@example.com",
        "subject": "Hello",
        "html": "<p>h</p>",
        "text": "h",
        "idempotency_key": "k-1",
        "to_name": "Ana Lima",
        "headers": mail.unsubscribe_headers("https://x.test/u/TOKEN"),
    }
    return OutgoingMail(**{**values, **changes})


# A domain that is not an IDNA name ("ü" * 70: a label too long) is refused at the door since
# issue 25.4 (tests/subscribers/test_address_identity.py); the builder still hands one stored before to the relay.
@pytest.mark.parametrize("address", ["jö@example.com", "ana@exämple.com", "ana@xn--exmple-cua.com"])
def test_internationalised_addresses_are_accepted(client, admin_key, address):
    r = client.put("/v1/subscribers/intl", json={"email": address}, headers=auth(admin_key))
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "body, field",
    [
        ({"email": "ana@example.com\n"}, "email"),
        ({"email": "ana@example.com\r\nBcc: x@y.z"}, "email"),
        ({"email": "ana@example.com", "name": "Eve\r\nBcc: victim@example.com"}, "name"),
        ({"email": "ana@example.com", "name": "bell\x07"}, "name"),
    ],
)
def test_unsendable_addresses_and_control_characters_get_a_422_naming_the_field(client, admin_key, body, field):
    r = client.put("/v1/subscribers/bad", json=body, headers=auth(admin_key))
    assert r.status_code == 422 and [e["field"] for e in r.json()["errors"]] == [field]


@pytest.mark.parametrize(
    "sender, ok",
    [
        ("News <news@example.com>", True),
        ("news@example.com", True),
        ("a@example.com, b@example.com", False),
        ("News <news@example.com>, Other <o@example.com>", False),
        ("News\r\nBcc: x@y.z <news@example.com>", False),
        ("News <nöws@example.com>", False),  # the sender must be plain ASCII
    ],
)
def test_newsletter_from_must_be_exactly_one_mailbox(client, admin_key, sender, ok):
    r = client.post(
        "/v1/newsletters",
        json={"subject": "S", "html": "<p>{{unsubscribe_url}}</p>", "from": sender},
        headers=auth(admin_key),
    )
    assert r.status_code == (201 if ok else 422), r.text
    if not ok:
        assert [e["field"] for e in r.json()["errors"]] == ["from"]


def test_an_ascii_local_part_at_a_unicode_domain_goes_out_with_the_idna_domain():
    sink = SmtpSink(enable_SMTPUTF8=False).start()
    try:
        p = SMTPProvider(sink.url, pool_size=1)
        (result,) = p.send_batch([_mail(to="ana@exämple.com")])
        p.close()
        assert result.ok, result.error
        assert sink.envelopes[0][1] == ["ana@xn--exmple-cua.com"]
        assert sink.messages()[0]["To"].addresses[0].addr_spec == "ana@xn--exmple-cua.com"
    finally:
        sink.stop()


def test_a_domain_idna_cannot_encode_needs_smtputf8_and_fails_alone_without_it():
    sink = SmtpSink(enable_SMTPUTF8=False).start()
    try:
        p = SMTPProvider(sink.url, pool_size=1)
        bad, good = p.send_batch([_mail(to="ana@" + "ü" * 70 + ".com"), _mail(idempotency_key="k-2")])
        p.close()
        assert good.ok and not bad.ok and bad.permanent and "SMTPUTF8" in bad.error
    finally:
        sink.stop()


def test_headers_are_the_email_policys_even_for_unicode_names_and_subjects():
    raw = mail.build(_mail(to_name="Çelik, Söhne & Co", subject="Olá — a long subject " + " ".join(["word"] * 20)))
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert msg["To"].addresses[0].display_name == "Çelik, Söhne & Co"
    assert msg["Subject"] == "Olá — a long subject " + " ".join(["word"] * 20)
    assert all(len(line) <= 78 for line in raw.split(b"\r\n\r\n")[0].split(b"\r\n"))
    assert raw.isascii()


def test_a_long_list_unsubscribe_url_stays_one_url_not_encoded_words():
    """The SMTP policy would fold a long URL into RFC 2047 encoded words, which mail clients do not
    decode in List-Unsubscribe: such values stay on one line (RFC 5322 allows 998)."""
    url = "https://notify.example.com/u/" + "a" * 150
    raw = mail.build(_mail(headers=mail.unsubscribe_headers(url)))
    assert f"List-Unsubscribe: <{url}>\r\n".encode() in raw


_WORD = st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=12)
_TOKEN = st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=40)
_UNSTRUCTURED = st.text(
    alphabet=string.ascii_letters + string.digits + string.punctuation + " ", min_size=1, max_size=70
)
# What build() writes under each name: free text for the subject, and the shapes of the others.
_VALUES = {
    "Subject": _UNSTRUCTURED,
    "To": st.builds(
        lambda n, local, d: f"{' '.join(n)} <{local}@{d}.com>" if n else f"{local}@{d}.com",
        st.lists(_WORD, max_size=3),
        _TOKEN.filter(lambda t: t[0] not in ".-" and t[-1] != "." and ".." not in t),
        _WORD,
    ),
    "Message-ID": st.builds(
        lambda k, h, d: f"<{k}.{h}@{d}.example>", _TOKEN, st.text("0123456789abcdef", min_size=12, max_size=12), _WORD
    ),
    "List-Unsubscribe": st.builds(lambda t: f"<https://x.example/u/{t}>", _TOKEN),
    "Content-Type": st.builds(
        lambda h: f'multipart/alternative; boundary="=_{h}"', st.text("0123456789abcdef", min_size=24, max_size=24)
    ),
}


@settings(max_examples=400, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(_VALUES)))
def test_the_plain_ascii_fast_path_is_byte_identical_to_the_policy(data, name):
    value = data.draw(_VALUES[name])
    if not mail._PLAIN_VALUE.fullmatch(value) or "=?" in value or len(name) + len(value) >= 76:
        return  # not the fast path: the policy writes it
    policy = email.policy.SMTP
    assert mail._header(name, value) == policy.fold_binary(name, policy.header_store_parse(name, value)[1])
