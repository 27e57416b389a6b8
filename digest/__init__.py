"""The digest domain: events in, digests out, and the in-app feed.

In the order of the flow:
  ingest      events in: the Event model and its group-commit writer (2xx = committed)
  events      the one owner of digest_events: the insert, events marked one by one, erasure
  plan        slots and planning, the checker that enqueues due runs, the watchdog, digest-now
  immediate   send-now runs (cadence `immediately`, priority high, "send now" categories)
  claim       a batch of due runs claimed, with the claim-time checks
  build       load -> group -> rank -> cap -> render -> rewrite links, one mail per run, from
              load, marks (what a digest handled), group, details, wording, context and render
  send        a batch handed to the provider, every outcome recorded in one transaction
  runs        the one owner of digest_runs: statuses, transitions, every statement that writes it
  feed, seen  the in-app feed, and its seen/read state (the owner of feed_state, feed_state_all)
  hosted      a sent digest re-rendered for "View in your browser"
  messages    the domain's queue messages

Templates in digest/templates/. Each module's line: docs/layout.md.
"""
