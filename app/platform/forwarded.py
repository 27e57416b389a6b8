"""Which address a request came from when proxies stand in front (setting FORWARDED_ALLOW_IPS).

Every proxy appends the address it received the request from to X-Forwarded-For, so the header
reads "what the client claims, …, proxy 1's peer, proxy 2's peer". Anything left of the first hop
we trust may have been typed by the client, so:

  * the direct peer is not a trusted proxy: the peer address; the header is ignored (anyone can
    send one);
  * otherwise the header is read right to left, skipping trusted proxies: the first address that
    is not one is the client (its own claims further left are ignored);
  * every hop is trusted: the left-most entry;
  * FORWARDED_ALLOW_IPS="*" trusts every peer and hop: the left-most entry.

FORWARDED_ALLOW_IPS is a comma-separated list of IP addresses and CIDR networks, default
"127.0.0.1,::1" — uvicorn reads the same variable with the same rules for its proxy headers, so one
setting describes the deployment to both.
"""

from __future__ import annotations

import functools
import ipaddress

from app.platform import config
from app.platform.config import ConfigError

MAX_HOPS = 32  # a longer header is junk; only its right-most hops are read


class TrustedProxies:
    def __init__(self, spec: str):
        entries = [e.strip() for e in spec.split(",") if e.strip()]
        self.trust_all = "*" in entries
        self.addresses, self.networks = set(), []
        for entry in entries:
            if entry == "*":
                continue
            try:
                if "/" in entry:
                    self.networks.append(ipaddress.ip_network(entry, strict=False))
                else:
                    self.addresses.add(ipaddress.ip_address(entry))
            except ValueError:
                raise ConfigError(f"FORWARDED_ALLOW_IPS: {entry!r} is not an IP address or network") from None
        self.trusts = functools.lru_cache(maxsize=4096)(self._trusts)

    def _trusts(self, host: str) -> bool:
        if self.trust_all:
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False  # not an address (junk, "unknown", a unix socket): never a proxy of ours
        return ip in self.addresses or any(ip in net for net in self.networks)


@functools.lru_cache(maxsize=4)
def _proxies(spec: str) -> TrustedProxies:
    return TrustedProxies(spec)


def trusted_proxies() -> TrustedProxies:
    """The parsed setting; ConfigError when malformed (the web app calls this at start-up)."""
    return _proxies(config.get().forwarded_allow_ips)


def strip_port(entry: str) -> str:
    """ "1.2.3.4:80" → "1.2.3.4", "[2001:db8::1]:443" → "2001:db8::1"; anything else as it is."""
    entry = entry.strip()
    if entry.startswith("["):
        end = entry.find("]")
        return entry[1:end] if end > 0 else entry
    if entry.count(":") == 1:
        return entry.split(":", 1)[0]
    return entry


def client_host(forwarded_for: str | None, peer: str | None) -> str | None:
    """The client's address as the trusted proxies reported it (not validated: may be junk)."""
    proxies = trusted_proxies()
    if not forwarded_for or peer is None or not proxies.trusts(peer):
        return peer
    hops = [strip_port(h) for h in forwarded_for.split(",")[-MAX_HOPS:]]
    if not proxies.trust_all:
        for hop in reversed(hops):
            if not proxies.trusts(hop):
                return hop
    return hops[0] or None
