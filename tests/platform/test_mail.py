"""MIME building: structure, Message-ID from the idempotency key, RFC 8058 headers, DKIM."""

from __future__ import annotations

import base64
import email
import email.policy
from datetime import UTC, datetime

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from app.platform import mail
from app.platform.providers.base import OutgoingMail

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)


def _mail(**kw):
    base = {
        "to": "ana@example.test",
        "to_name": "Ána Lima",
        "subject": "Your daily digest: Ána & 3 others",
        "html": '<p>Héllo <a href="https://x.test/a?b=1&amp;c=2">link</a></p>\n' + "<p>x</p>" * 100,
        "text": "Héllo\n.leading dot\nline with trailing space \n" + "y" * 300,
        "idempotency_key": "digest-run-42",
        "headers": mail.unsubscribe_headers("https://x.test/u/TOKEN"),
    }
    base.update(kw)
    return OutgoingMail(**base)


def parse(raw: bytes):
    return email.message_from_bytes(raw, policy=email.policy.default)


def test_message_parses_back_with_both_parts_and_headers():
    m = _mail()
    raw = mail.build(m)
    assert b"\r\n" in raw and b"\n" not in raw.replace(b"\r\n", b"")  # CRLF only
    msg = parse(raw)
    assert msg.get_content_type() == "multipart/alternative" and not msg.defects
    assert msg["To"] == "Ána Lima <ana@example.test>"
    assert msg["Subject"] == m.subject
    assert msg["List-Unsubscribe"] == "<https://x.test/u/TOKEN>"
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    parts = [p.get_content_type() for p in msg.iter_parts()]
    assert parts == ["text/plain", "text/html"]  # HTML last: clients prefer the last they can show
    assert msg.get_body(("plain",)).get_content().replace("\r\n", "\n") == m.text
    assert msg.get_body(("html",)).get_content().replace("\r\n", "\n") == m.html


def test_message_id_is_derived_from_the_idempotency_key():
    a1, a2 = parse(mail.build(_mail())), parse(mail.build(_mail()))
    b = parse(mail.build(_mail(idempotency_key="digest-run-43")))
    assert a1["Message-ID"] == a2["Message-ID"] != b["Message-ID"]
    assert a1["Message-ID"].startswith("<digest-run-42.") and a1["Message-ID"].endswith("@localhost>")
    assert mail.message_id_of(_mail()) == a1["Message-ID"].strip("<>")


def test_mailto_unsubscribe_is_added_when_configured(settings):
    settings(unsubscribe_mailto="unsubscribe@example.test")
    headers = mail.unsubscribe_headers("https://x.test/u/T")
    assert headers["List-Unsubscribe"] == "<https://x.test/u/T>, <mailto:unsubscribe@example.test>"


@pytest.mark.parametrize(
    "bad",
    [
        {"subject": "hi\r\nBcc: victim@example.test"},
        {"to": "victim@example.test\r\nBcc: x@y.z"},
        {"to": "not-an-address"},
        {"headers": {"Bcc": "x@example.test"}},
        {"headers": {"X-Ok": "a\nb"}},
    ],
)
def test_header_injection_and_bad_addresses_are_refused(bad):
    with pytest.raises(mail.MailBuildError):
        mail.build(_mail(**bad))


@pytest.fixture
def dkim_key(settings, tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    record = b"v=DKIM1; k=rsa; p=" + base64.b64encode(public)

    def dnsfunc(name, timeout=5):
        assert name == b"sel1._domainkey.example.test."
        return record

    settings(
        dkim_domain="example.test", dkim_selector="sel1", dkim_private_key=pem, mail_from="Notify <notify@example.test>"
    )
    return pem, dnsfunc


def test_dkim_signature_verifies_and_covers_list_unsubscribe(dkim_key):
    _, dnsfunc = dkim_key
    raw = mail.build(_mail())
    assert raw.startswith(b"DKIM-Signature:")
    assert dkim.verify(raw, dnsfunc=dnsfunc)
    sig = parse(raw)["DKIM-Signature"].replace(" ", "").lower()
    signed = sig.split("h=")[1].split(";")[0].split(":")
    assert {"from", "subject", "message-id", "list-unsubscribe", "list-unsubscribe-post"} <= set(signed)
    tampered = raw.replace(b"https://x.test/u/TOKEN", b"https://evil.test/u/TOKEN")
    assert not dkim.verify(tampered, dnsfunc=dnsfunc)


def test_a_dkimpy_without_the_wrapped_names_is_left_to_sign_alone(caplog):
    """Another dkimpy (its primitive renamed) is not patched, and signing stays dkimpy's own."""
    import types

    other = types.SimpleNamespace(sign=lambda *a, **kw: b"")
    with caplog.at_level("WARNING", logger="app.platform.mail"):
        mail._openssl_rsa.__wrapped__(other)
    assert vars(other) == {"sign": other.sign}
    assert "dkimpy alone" in caplog.text


def test_dkim_signs_with_openssl_the_bytes_dkimpy_would(dkim_key, monkeypatch):
    """RSASSA-PKCS1-v1_5 is deterministic: the signature made through OpenSSL (mail._openssl_rsa) is
    byte for byte dkimpy's own, for the same message at the same second; and it verifies."""
    _, dnsfunc = dkim_key
    signed = mail.build(_mail(), now=datetime(2026, 11, 28, 12, 0, tzinfo=UTC))
    unsigned = signed[signed.index(b"\r\nFrom:") + 2 :]  # without the signature build() put first
    with monkeypatch.context() as m:
        m.setattr(dkim.time, "time", lambda: 1_790_000_000.0)
        fast = mail.dkim_sign(unsigned)
        assert hasattr(dkim.RSASSA_PKCS1_v1_5_sign, "original")
        m.setattr(dkim, "RSASSA_PKCS1_v1_5_sign", dkim.RSASSA_PKCS1_v1_5_sign.original)
        slow = mail.dkim_sign(unsigned)
    assert fast == slow and fast.startswith(b"DKIM-Signature:")
    assert dkim.verify(fast, dnsfunc=dnsfunc)


def test_dkim_key_can_be_a_file_path(dkim_key, settings, tmp_path):
    pem, dnsfunc = dkim_key
    path = tmp_path / "dkim.pem"
    path.write_text(pem)
    settings(dkim_private_key=str(path))
    assert dkim.verify(mail.build(_mail()), dnsfunc=dnsfunc)


def test_no_dkim_without_configuration():
    assert not mail.build(_mail()).startswith(b"DKIM-Signature")


@pytest.mark.parametrize(
    "subject",
    [
        "Short and plain",
        "Eli, Bo and 4 others followed Launch notes - and 8 more updates about things you follow",
        "Eli, Bo and 4 others followed Launch notes — and 8 more updates",
        "Ána, Bø and 3 others liked «Grüße aus Köln» — and 1 more update " * 3,
        "😀" * 60 + " emoji " + "中文标题" * 20,
        "x" * 90 + " then a very long word",
        "two  spaces and a trailing one ",
        "looks like =?utf-8?q?an_encoded_word?= but is not",
        "A" * 76,
        "",
        " ",
    ],
)
def test_subjects_of_any_length_and_script_parse_back_exactly(subject):
    raw = mail.build(_mail(subject=subject))
    head = raw.split(b"\r\n\r\n", 1)[0]
    assert all(len(line) <= 998 for line in head.split(b"\r\n"))
    lines = b"Subject: " + raw.split(b"\r\nSubject: ", 1)[1].split(b"\r\nDate:", 1)[0]
    assert all(len(line) <= 78 for line in lines.split(b"\r\n"))
    msg = parse(raw)
    assert msg["Subject"] == subject and not msg.defects


@hypothesis_settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=300))
def test_any_subject_text_parses_back_exactly(subject):
    msg = parse(mail.build(_mail(subject=subject)))
    assert msg["Subject"] == subject


def _part_of(raw: bytes, subtype: str):
    return parse(raw).get_body((subtype,))


@pytest.mark.parametrize(
    "html, text, encodings",
    [
        ("<p>plain ASCII, a = sign</p>", "plain text\n.leading dot", ("7bit", "7bit")),
        ("<p>H&#233;llo</p>", "Héllo", ("7bit", "quoted-printable")),  # text not ASCII
        ("<p>" + "x" * 999 + "</p>", "y" * 998, ("quoted-printable", "7bit")),  # a line over 998 octets
        ("<p>a\0b</p>", "", ("quoted-printable", "7bit")),  # NUL is not 7bit
    ],
)
def test_ascii_parts_go_as_7bit_and_the_rest_as_quoted_printable(html, text, encodings):
    raw = mail.build(_mail(html=html, text=text))
    assert all(len(line) <= 998 for line in raw.split(b"\r\n"))
    assert b"\n" not in raw.replace(b"\r\n", b"")  # CRLF only
    for subtype, body, cte in zip(("html", "plain"), (html, text), encodings):
        part = _part_of(raw, subtype)
        assert part["Content-Transfer-Encoding"] == cte
        assert part.get_content().replace("\r\n", "\n") == body


@hypothesis_settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_any_part_text_parses_back_exactly(body):
    raw = mail.build(_mail(html=body, text=body))
    expected = body.replace("\r\n", "\n").replace("\r", "\n")
    for subtype in ("html", "plain"):
        assert _part_of(raw, subtype).get_content().replace("\r\n", "\n") == expected


def test_ascii_html_writes_other_characters_as_references_outside_style_and_script():
    import html as html_lib

    page = '<title>Ána — news</title><p title="Zoë">😀 · ok</p>'
    out = mail.ascii_html(page)
    assert out.isascii() and html_lib.unescape(out) == page
    assert mail.ascii_html("<p>ascii</p>") == "<p>ascii</p>"
    for raw_text in ('<style>p:before{content:"→"}</style><p>é</p>', "<SCRIPT>var s = 'é';</SCRIPT>"):
        assert mail.ascii_html(raw_text) == raw_text  # a reference would show there as written


def test_a_template_written_in_ascii_as_it_renders_is_ascii_html_of_its_document():
    """digest/render.py writes digest.html in ASCII as it renders (a locale's words kept once written)
    only where mail.renders_as_ascii says that is the document ascii_html would make."""
    import chevron

    from app.platform import mustache

    ctx = {"a": "Отписаться <b> & “ok”", "b": "مرحبا", "c": "ascii", "items": [{"x": "日本"}, {"x": "é"}]}
    same = (
        "<p>Zoë · {{a}}</p>{{#items}}<i>{{x}} — {{c}}</i>{{/items}}<title>{{b}}</title>",
        '<style>p { color: red }</style><SCRIPT>var s = "a";</SCRIPT><p>{{a}} {{b}}</p>',
        "<p>ascii {{c}}</p>",
    )
    for source in same:
        tokens = mustache.tokenize(source)
        assert mail.renders_as_ascii(tokens), source
        for _ in range(2):  # written, then kept
            out = mustache.Template(tokens, ascii=True).render(ctx)
            assert out == mail.ascii_html(mustache.Template(tokens).render(ctx)) and out.isascii(), source
    not_same = (
        "<p>{{{a}}}</p>",  # a raw value may open a <style> of its own
        "<style>p:before { content: '{{b}}' }</style><p>{{a}}</p>",  # a value inside <style>
        '<style>p:before { content: "→" }</style><p>{{a}}</p>',  # ascii_html leaves this document as it is
        "<script>{{#items}}{{/items}}</script>",
        "<scr{{c}}>x</script><p>{{a}}</p>",  # a tag name cut by a value
        "<p>{{a}}</p></style>",
        "<style>p { color: red }</style><sty{{c}}>x</style><p>{{a}}</p>",
    )
    for source in not_same:
        assert not mail.renders_as_ascii(chevron.tokenizer.tokenize(source)), source


@hypothesis_settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=12), min_size=3, max_size=3), st.text(max_size=12))
def test_any_values_written_in_ascii_as_they_render_are_what_ascii_html_makes(values, literal):
    from app.platform import mustache

    source = literal.replace("{", "(").replace("<", "[") + "<p>{{a}}</p>{{#items}}<i>{{x}}</i>{{/items}} · {{b}}"
    tokens = mustache.tokenize(source)
    assert mail.renders_as_ascii(tokens)
    ctx = {"a": values[0], "b": values[1], "items": [{"x": values[2]}, {"x": values[0]}]}
    plain = mustache.Template(tokens).render(ctx)
    assert mustache.Template(tokens, ascii=True).render(ctx) == mail.ascii_html(plain)
