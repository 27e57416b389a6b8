"""Is this open/click a person, or a machine acting on the mail (link scanner, privacy proxy)?

Machine traffic is recorded (an operator may want to see it) but flagged, with a reason, and stats
count it apart from human traffic. Rules decided here, in the request (no I/O):
  head_request     HEAD: scanners probe links; browsers GET them
  no_user_agent    no User-Agent at all
  scanner_agent    User-Agent of a known security scanner, bot, preview fetcher or HTTP library
  apple_mpp        opens from Apple Mail Privacy Protection (Apple's 17.0.0.0/8 network, or its
                   bare "Mozilla/5.0" agent): Apple prefetches every image at delivery
  proxy_prefetch   other image proxies that prefetch without a human (Yahoo)
One more rule needs the delivery time and is applied when the history is written
(tracking/recorder.py): soon_after_delivery — within TRACKING_SCANNER_SECONDS of the send.
"""

from __future__ import annotations

import ipaddress
import re

from app.platform import forwarded

_SCANNER_RE = re.compile(
    "|".join(
        [
            r"bot\b",
            r"bot/",
            r"crawler",
            r"spider",
            r"slurp",
            r"scanner",
            r"preview",
            r"barracuda",
            r"mimecast",
            r"proofpoint",
            r"urldefense",
            r"safelinks",
            r"symantec",
            r"messagelabs",
            r"trend ?micro",
            r"forcepoint",
            r"fireeye",
            r"ironport",
            r"sophos",
            r"zscaler",
            r"checkpoint",
            r"python-requests",
            r"python-urllib",
            r"aiohttp",
            r"httpx",
            r"curl/",
            r"wget",
            r"go-http-client",
            r"okhttp",
            r"java/",
            r"libwww",
            r"httpclient",
            r"headlesschrome",
            r"phantomjs",
            r"facebookexternalhit",
            r"whatsapp",
            r"skypeuripreview",
            r"microsoft office",
            r"ms-office",
        ]
    ),
    re.IGNORECASE,
)
_APPLE_NET = ipaddress.ip_network("17.0.0.0/8")
_PROXY_OPEN_RE = re.compile(r"yahoomailproxy", re.IGNORECASE)
_ua_cache: dict[str, bool] = {}
_ip_cache: dict[str, str | None] = {}


def _scanner_agent(user_agent: str) -> bool:
    hit = _ua_cache.get(user_agent)
    if hit is None:
        hit = bool(_SCANNER_RE.search(user_agent))
        if len(_ua_cache) > 10_000:  # agents repeat a lot; keep the cache bounded anyway
            _ua_cache.clear()
        _ua_cache[user_agent] = hit
    return hit


def client_ip(forwarded_for: str | None, peer: str | None) -> str | None:
    """The client address as Postgres inet accepts it, or None. Which X-Forwarded-For hop is
    believed is decided by FORWARDED_ALLOW_IPS (app/platform/forwarded.py), never by the client."""
    candidate = forwarded.client_host(forwarded_for, peer)
    if not candidate:
        return None
    if candidate in _ip_cache:  # parsing costs microseconds; the same clients come back
        return _ip_cache[candidate]
    hit = _inet(candidate)
    if len(_ip_cache) > 50_000:
        _ip_cache.clear()
    _ip_cache[candidate] = hit
    return hit


def _inet(text: str) -> str | None:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    # Python accepts an IPv6 zone ("fe80::1%eth0"), Postgres inet does not: one such header would
    # otherwise send a whole history batch down the slow row-by-row path.
    if getattr(ip, "scope_id", None):
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    return str(ip)


def classify_click(method: str, user_agent: str | None) -> str | None:
    """A machine reason, or None for (probably) a person."""
    if method == "HEAD":
        return "head_request"
    if not user_agent:
        return "no_user_agent"
    if _scanner_agent(user_agent):
        return "scanner_agent"
    return None


def classify_open(method: str, user_agent: str | None, ip: str | None) -> str | None:
    if method == "HEAD":
        return "head_request"
    if ip is not None:
        try:
            if ipaddress.ip_address(ip) in _APPLE_NET:
                return "apple_mpp"
        except ValueError:
            pass
    if user_agent is not None and user_agent.strip() == "Mozilla/5.0":
        return "apple_mpp"
    if not user_agent:
        return "no_user_agent"
    if _PROXY_OPEN_RE.search(user_agent):
        return "proxy_prefetch"
    if _scanner_agent(user_agent):
        return "scanner_agent"
    return None
