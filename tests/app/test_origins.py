"""app/origins.py: a page's Origin against the server's own and the allow-list."""

from __future__ import annotations

import pytest

from app.origins import allowed_origins, origin_allowed, same_origin


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://localhost:8000", "localhost:8000", True),
        ("https://draw.example.com", "draw.example.com", True),  # 443 on both sides
        ("http://draw.example.com", "draw.example.com:80", True),
        ("https://draw.example.com", "draw.example.com:8443", False),
        ("http://localhost:8001", "localhost:8000", False),
        ("http://127.0.0.1:8000", "localhost:8000", False),  # another name is another origin
        ("https://evil.example", "draw.example.com", False),
        ("null", "localhost:8000", False),  # sandboxed frames and files
        ("ftp://localhost:8000", "localhost:8000", False),
        ("http://localhost:port", "localhost:8000", False),
    ],
)
def test_same_origin(origin, host, same):
    assert same_origin(origin, host) is same


def test_the_allow_list():
    allowed = allowed_origins(" https://App.example.com/ , http://localhost:5173,")
    assert allowed == {"https://app.example.com", "http://localhost:5173"}
    assert origin_allowed("https://app.example.com", "draw.example.com", allowed)
    assert not origin_allowed("https://app.example.org", "draw.example.com", allowed)
    assert origin_allowed("https://draw.example.com", "draw.example.com", frozenset())  # its own page
    assert origin_allowed(None, "draw.example.com", frozenset())  # no Origin: not a browser page
    assert origin_allowed("https://any.example", None, allowed_origins("*"))
    assert not origin_allowed("https://any.example", None, frozenset())
