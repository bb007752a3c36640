"""API keys of /sketch and /live: named keys read from PENCIL_API_KEYS (and its file), and
the name of the key a client presents, found by comparisons in constant time.

Keys are never logged and never put in an error message: a malformed entry is named by its
position and its name only."""

from __future__ import annotations

import hmac
import re

KEY_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
# URL-safe characters only, so that a key travels unchanged in a query string and as a
# WebSocket subprotocol token (secrets.token_urlsafe(32) makes one).
KEY_VALUE = re.compile(r"[A-Za-z0-9._~-]{16,256}")


def parse_api_keys(text: str) -> dict[str, str]:
    """{name: key} of 'name:key,name:key'; ValueError for a malformed entry, a short key, or
    a name or key given twice (which of two keys a name means would be a guess)."""
    keys: dict[str, str] = {}
    for position, entry in enumerate((part.strip() for part in text.split(",")), start=1):
        if not entry:
            continue
        name, colon, key = entry.partition(":")
        name, key = name.strip(), key.strip()
        if not colon or not KEY_NAME.fullmatch(name):
            raise ValueError(
                f"API key entry {position} is not 'name:key' with a name of 1 to 64 of A-Za-z0-9_.@- "
                "(PENCIL_API_KEYS, PENCIL_API_KEYS_FILE)"
            )
        if not KEY_VALUE.fullmatch(key):
            raise ValueError(f"the API key named {name!r} must be 16 to 256 of A-Za-z0-9._~- (e.g. a token_urlsafe)")
        if name in keys:
            raise ValueError(f"the API key name {name!r} is given twice")
        if key in keys.values():
            raise ValueError(f"the API key named {name!r} is also given under another name")
        keys[name] = key
    return keys


class ApiKeys:
    """The server's keys; `name_of` says whose key a client presented."""

    def __init__(self, keys: dict[str, str]) -> None:
        self._keys = [(name, key.encode()) for name, key in keys.items()]

    def __bool__(self) -> bool:
        """Whether keys are on (some key is configured)."""
        return bool(self._keys)

    def name_of(self, presented: str | None) -> str | None:
        """The name of the key `presented`, or None. Every key is compared, in constant time,
        whatever matched: the time taken says nothing about which key, or how much of one, matched."""
        if presented is None:
            return None
        given = presented.encode("utf-8", "surrogateescape")
        found = None
        for name, key in self._keys:
            if hmac.compare_digest(given, key) and found is None:
                found = name
        return found
