"""Scanner / privacy-proxy classification rules and the client address (pure functions)."""

from __future__ import annotations

import pytest

from tracking import machines

CHROME = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0 Safari/537.36"


@pytest.mark.parametrize(
    "method, ua, reason",
    [
        ("GET", CHROME, None),
        ("HEAD", CHROME, "head_request"),
        ("GET", None, "no_user_agent"),
        ("GET", "", "no_user_agent"),
        ("GET", "Mozilla/5.0 (compatible; Barracuda Sentinel (EE))", "scanner_agent"),
        ("GET", "Mimecast URL protect", "scanner_agent"),
        ("GET", "python-requests/2.31", "scanner_agent"),
        ("GET", "curl/8.4.0", "scanner_agent"),
        ("GET", "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "scanner_agent"),
        ("GET", "Microsoft Office/16.0 (Windows NT 10.0; Microsoft Outlook 16.0.17231; Pro)", "scanner_agent"),
    ],
)
def test_click_classification(method, ua, reason):
    assert machines.classify_click(method, ua) == reason


@pytest.mark.parametrize(
    "ua, ip, reason",
    [
        (CHROME, "198.51.100.1", None),
        ("Mozilla/5.0", "198.51.100.1", "apple_mpp"),
        (CHROME, "17.58.63.1", "apple_mpp"),
        (
            "Mozilla/5.0 (Windows NT 5.1; rv:11.0) Gecko Firefox/11.0 (via ggpht.com GoogleImageProxy)",
            "66.249.1.1",
            None,
        ),
        ("YahooMailProxy; https://help.yahoo.com/kb/yahoo-mail-proxy-SLN28749.html", "98.136.1.1", "proxy_prefetch"),
        (None, None, "no_user_agent"),
    ],
)
def test_open_classification(ua, ip, reason):
    assert machines.classify_open("GET", ua, ip) == reason


LB = "10.0.0.0/8"  # a load balancer's network, trusted in some cases below


@pytest.mark.parametrize(
    "allow, forwarded, peer, expected",
    [
        ("127.0.0.1,::1", None, "127.0.0.1", "127.0.0.1"),
        # An untrusted peer's X-Forwarded-For is whatever the client typed: ignored.
        ("127.0.0.1,::1", "203.0.113.9, 198.51.100.7", "10.0.0.1", "10.0.0.1"),
        ("127.0.0.1,::1", "2001:db8::1", "192.0.2.1", "192.0.2.1"),
        # Behind a trusted proxy: the right-most hop that is not a trusted proxy.
        (LB, "203.0.113.9, 198.51.100.7", "10.0.0.1", "198.51.100.7"),
        (LB, "203.0.113.9, 198.51.100.7, 10.1.2.3", "10.0.0.1", "198.51.100.7"),
        (LB, "2001:db8::1", "10.0.0.1", "2001:db8::1"),
        (LB, "198.51.100.7:5123", "10.0.0.1", "198.51.100.7"),
        (LB, "[2001:db8::1]:443", "10.0.0.1", "2001:db8::1"),
        (LB, "10.9.9.9, 10.1.1.1", "10.0.0.1", "10.9.9.9"),  # every hop trusted: the left-most
        ("*", "203.0.113.9, 198.51.100.7", "192.0.2.1", "203.0.113.9"),
        # What the trusted proxy reports is not an address: no client address at all, never a guess.
        ("127.0.0.1", "not-an-ip", "127.0.0.1", None),
        ("127.0.0.1", "198.51.100.7, unknown", "127.0.0.1", None),
        ("127.0.0.1", "fe80::1%eth0", "127.0.0.1", "fe80::1"),  # Postgres inet has no zones
        ("127.0.0.1", None, "testclient", None),
        ("127.0.0.1", "2001:db8::1", None, None),
        ("127.0.0.1", None, None, None),
    ],
)
def test_client_ip(settings, allow, forwarded, peer, expected):
    settings(forwarded_allow_ips=allow)
    assert machines.client_ip(forwarded, peer) == expected
