"""The tracking domain: tracking codes and link rewriting, click and open history (people and
machines apart, per-mail statistics), and SendGrid's event webhook: signature, intake, apply.

Modules: codes, links, hrefs, resolve, legacy, machines, recorder, stats, signature, webhook_intake,
webhook_events, webhook_apply, messages. Its routes are entry points: app/web/tracking.py (click
redirect, open pixel) and app/web/webhooks.py; legacy links are imported by app/cli/tracking.py
(tracking/legacy.py). The click path's contract: tracking/README.md.
"""
