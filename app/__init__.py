"""Notify, a digest-first notification service: the platform, two of the domains and the entry points.

  platform/     what any service of this kind needs: settings, the database, queue, migrations,
                HTTP and route declarations, tokens, API keys, metrics, mail building, providers
  subscribers/  DOMAIN: the people we mail (records, suppressions, "may we mail", categories, streams)
  newsletter/   DOMAIN: newsletter sends through a per-recipient outbox
  operations/   OPERATIONS: changes that span domains, one function each (erasure, opt-out, the
                emergency stop, suppression removal), with their transaction and audit row
  web/          ENTRY: the web process (JSON API, tracking, webhooks, subscriber pages, dashboard)
  cli/          ENTRY: `notify` (= `python -m app`, __main__.py) and the scheduler process

The other domains are the top-level packages digest/ (events in, digests out, the in-app feed) and
tracking/; the Dramatiq worker's actors are actors/. Every module: docs/layout.md.
"""
