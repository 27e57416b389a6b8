"""The one Mustache implementation (app/platform/mustache.py), for digests and newsletters alike:
its compiled renderer gives chevron's output, newsletters included (footers, the name fallback,
sections over strings, a delimiter change), and malformed templates are refused by name."""

from __future__ import annotations

import chevron
import pytest

from app.newsletter import template
from app.platform import i18n, mustache

pytestmark = pytest.mark.pure

TEMPLATES = [
    "plain text, no tags",
    "Hi {{name}} <{{email}}> {{{name}}} {{&name}}",
    "{{#name}}Dear {{.}}, {{name}}{{/name}}{{^name}}Hello there{{/name}}!",
    "{{#items}}[{{name}}{{#flag}}!{{/flag}}{{^flag}}-{{/flag}}]{{/items}}{{a.b.c}}{{a.missing}}",
    "{{! a comment }}before {{=<% %>=}}<% name %> <%={{ }}=%>{{email}} after",
    "  {{#name}}\n  standalone\n  {{/name}}\n{{user_id}}\n",
    "{{#n}}{{n}}{{/n}}|{{#zero}}z{{/zero}}|{{zero}}|{{#f}}f{{/f}}|{{f}}|{{#t}}{{name}}{{/t}}",
]
CONTEXTS = [
    {
        "name": 'Ana <b>"&"</b>',
        "email": "a@x.test",
        "user_id": "u\x01",
        "items": [{"name": "x", "flag": True}, {"name": "<y>"}],
        "a": {"b": {"c": 3}},
        "n": 7,
        "zero": 0,
        "f": False,
        "t": True,
    },
    {"name": None, "email": "", "items": [], "a": {}},
    {},
]


@pytest.mark.parametrize("source", TEMPLATES)
def test_compiled_output_equals_chevron(source):
    tokens = mustache.tokenize(source)
    compiled = mustache.Template(tokens)
    for context in CONTEXTS:
        assert compiled.render(context) == chevron.render(list(tokens), context), context


def test_newsletter_parts_render_as_chevron_would():
    compiled = template.Compiled(
        "Hi {{name}} {{#name}}({{.}}){{/name}}",
        "<style>p { color: red; }</style><p>{{#name}}Dear {{name}}{{/name}}{{^name}}Hi {{name}}{{/name}}</p>"
        "<p>{{email}} {{{user_id}}}</p>",
        None,
        postal_address="1 Road <Town>",
        name_fallback="there",
    )
    for context in (
        {"name": "<Bo>", "email": "b@x.test", "user_id": "u&1", "unsubscribe_url": "https://u/?a=1&b=2"},
        {"name": "", "email": "c@x.test", "user_id": "2", "unsubscribe_url": "https://u/", "preferences_url": "p"},
    ):
        rendered = compiled.render(context)
        words = template.footer_words(
            i18n.translator(None), context["unsubscribe_url"], context.get("preferences_url", "")
        )
        full = {**context, template.DISPLAY_NAME: context["name"] or "there", **words}
        assert rendered.html == chevron.render(list(compiled.html_tokens), full)
        assert rendered.text == chevron.render(list(compiled.text_tokens), full)
        assert rendered.subject == " ".join(chevron.render(list(compiled.subject_tokens), full).split())


@pytest.mark.parametrize("source", ["{{#name}}", "{{}}", "{{#a}}{{/b}}"])
def test_malformed_templates_are_refused(source):
    with pytest.raises(mustache.MustacheError):
        mustache.Template(mustache.tokenize(source))


def test_partials_are_refused():
    with pytest.raises(mustache.MustacheError, match="partial"):
        mustache.Template(mustache.tokenize("{{> header}}"))
