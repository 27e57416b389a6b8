"""Newsletter sends: a per-recipient outbox (email_log) claimed in batches and sent through a provider.

The life of a newsletter (newsletters.status: draft, scheduled, queued, sending, paused, done,
cancelled) and of an outbox row (email_log.status: pending, sending, sent, failed, suppressed,
cancelled), every transition: app/newsletter/rows.py, their one owner.

Settings: SEND_BATCH_SIZE (rows per claim and per provider call; 0 = the provider's preferred size, capped by its
max_batch: 1000 for SendGrid), NEWSLETTER_SEND_CHAINS (concurrent send loops per newsletter),
NEWSLETTER_MAX_ATTEMPTS (transient failures before `failed`), PROVIDER_RATE_PER_SECOND (shared
ceiling; 429s lower it adaptively), RECLAIM_AFTER_SECONDS (when a `sending` row is presumed lost).
Progress: `python -m app newsletter-status ID`. Benchmark: scripts/bench/newsletter.py.

Modules: service (API operations + status), rows (the statements), template (compile once, render
per recipient), outbox (row creation), sender (claim/render/send/mark loop), growth (more send
chains while they wait), ratelimit (adaptive, shared via Redis), reclaim (scheduler tick hook),
schedule (scheduled and local-time sends), variants (which language each recipient gets), kick
(enqueue helpers), test_send (a test to a few addresses), messages (queue messages).
"""
