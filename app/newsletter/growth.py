"""More send chains while they mostly wait: the number of concurrent send loops per newsletter adapts
to the provider's latency instead of being a knob to tune per relay.

A newsletter starts with NEWSLETTER_SEND_CHAINS chains. A chain that spent more than half of its
time so far waiting for the provider, on a host with CPU to spare, adds one chain — at most one per
newsletter per GROW_INTERVAL_SECONDS, and at most NEWSLETTER_SEND_CHAINS_MAX - NEWSLETTER_SEND_CHAINS
extra chains per newsletter per hour (a Redis counter: a flushed Redis only lets it grow again).
Chains never multiply otherwise, and each ends when the work runs out, so growth stops by itself:
as chains are added the CPU fills up, the idle share drops below its threshold, and no chain forks
any more. "Waiting for the provider" includes the SMTP client's own work on its event-loop thread,
so a loopback relay at 0 ms grows a few chains too, until the CPU is busy. scripts/bench/knobs.py
compares the defaults with fixed chain counts and hand-tuned settings (BENCHMARKS.md, "defaults vs
hand-tuned").

Both signals are read cheaply: the chain's own provider time (measured around the provider call)
and the host's idle CPU share (app/platform/host.py: /proc/stat, sampled at most once a second per
process; without /proc it counts as idle, so latency alone decides).
"""

from __future__ import annotations

import logging

import redis as redis_lib

from app.newsletter import kick

log = logging.getLogger("app.newsletter.growth")

GROW_INTERVAL_SECONDS = 1.0
WAIT_SHARE = 0.5  # a chain that waited for the provider more than this share of its time
IDLE_SHARE = 0.2  # ... on a host with more than this share of its CPU idle, adds a chain
MIN_OBSERVED_SECONDS = 0.2  # judge a chain only after this much of its time
EXTRA_TTL_SECONDS = 3600


def extra_key(newsletter_id: int) -> str:
    return f"notify:newsletter:{newsletter_id}:extra_chains"


def _grow_key(newsletter_id: int) -> str:
    return f"notify:newsletter:{newsletter_id}:grew"


def wants_more(provider_seconds: float, elapsed_seconds: float, idle_share: float) -> bool:
    """The decision, from the chain's provider time and elapsed time and the host's idle share."""
    return (
        elapsed_seconds >= MIN_OBSERVED_SECONDS
        and provider_seconds > WAIT_SHARE * elapsed_seconds
        and idle_share > IDLE_SHARE
    )


def grow(newsletter_id: int, start_chains: int, max_chains: int) -> bool:
    """Enqueue one more chain unless one was added within GROW_INTERVAL_SECONDS or the newsletter has
    had its extra chains this hour. True when a chain was added."""
    if max_chains <= start_chains:
        return False
    try:
        client = kick.redis_client()
        if not client.set(_grow_key(newsletter_id), b"1", nx=True, px=int(GROW_INTERVAL_SECONDS * 1000)):
            return False
        with client.pipeline() as pipe:
            extra, _ = pipe.incr(extra_key(newsletter_id)).expire(extra_key(newsletter_id), EXTRA_TTL_SECONDS).execute()
        if extra > max_chains - start_chains:
            return False
        kick.continue_chain(newsletter_id)
    except redis_lib.RedisError as exc:  # growth is an optimisation; the chain goes on as it was
        log.warning("newsletter %s: could not add a send chain: %s", newsletter_id, exc)
        return False
    log.info("newsletter %s: send chains mostly wait for the provider; one more (%d extra)", newsletter_id, extra)
    return True
