"""Newsletter sends: a per-recipient outbox (email_log) claimed in batches and sent through a provider.

Life of a newsletter (newsletters.status):
  draft --send--> queued --outbox actor starts--> sending --nothing pending/sending left--> done
  queued/sending --pause--> paused --resume--> sending;  any but done --cancel--> cancelled
Life of an outbox row (email_log.status):
  pending --claim--> sending --provider accepted--> sent
                             --rejected-----------> failed (retry-failed puts it back to pending)
                             --transient/429------> pending (next_attempt_at = backoff)
  pending --unsubscribed/suppressed at creation or at claim--> suppressed
  pending --cancel--> cancelled;  sending --stuck past RECLAIM_AFTER_SECONDS--> pending (reclaim)

Settings: SEND_BATCH_SIZE (rows per claim and per provider call; 0 = the provider's preferred size, capped by its
max_batch: 1000 for SendGrid), NEWSLETTER_SEND_CHAINS (concurrent send loops per newsletter),
NEWSLETTER_MAX_ATTEMPTS (transient failures before `failed`), PROVIDER_RATE_PER_SECOND (shared
ceiling; 429s lower it adaptively), RECLAIM_AFTER_SECONDS (when a `sending` row is presumed lost).
Progress: `python -m app newsletter-status ID`. Benchmark: scripts/bench/newsletter.py.

Modules: service (API operations + status), template (compile once, render per recipient),
outbox (row creation), sender (claim/render/send/mark loop), ratelimit (adaptive, shared via
Redis), reclaim (scheduler tick hook), kick (enqueue helpers), schedule (scheduled and local-time sends).
"""
