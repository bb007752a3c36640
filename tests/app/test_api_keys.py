"""app/api_keys.py: named keys parsed from PENCIL_API_KEYS, bad entries refused without
echoing a key, and the name of a presented key found among all of them."""

from __future__ import annotations

import secrets

import pytest

from app.api_keys import ApiKeys, parse_api_keys


def test_named_keys_are_parsed_with_spaces_and_empty_entries_ignored():
    alice, bob = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    assert parse_api_keys(f" alice:{alice} , ,bob.ci@example:{bob},") == {"alice": alice, "bob.ci@example": bob}
    assert parse_api_keys("") == {}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("alice", "entry 1"),  # no colon
        ("ok:0123456789abcdef, :0123456789abcdef", "entry 2"),  # no name
        ("al ice:0123456789abcdef", "entry 1"),
        ("alice:short", "16 to 256"),
        ("alice:0123456789abcdef/+=", "16 to 256"),  # not URL-safe: cannot be a subprotocol token
        ("alice:0123456789abcdef,alice:fedcba9876543210", "given twice"),
        ("alice:0123456789abcdef,bob:0123456789abcdef", "another name"),
    ],
)
def test_malformed_entries_are_refused_naming_the_entry_not_the_key(text, words):
    with pytest.raises(ValueError) as refused:
        parse_api_keys(text)
    assert words in str(refused.value)
    for part in text.split(","):
        key = part.partition(":")[2].strip()
        if len(key) >= 8:
            assert key not in str(refused.value)


def test_a_presented_key_is_known_by_its_name():
    alice, bob = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    keys = ApiKeys({"alice": alice, "bob": bob})
    assert keys and not ApiKeys({})
    assert keys.name_of(alice) == "alice" and keys.name_of(bob) == "bob"
    assert keys.name_of(None) is None
    assert keys.name_of("") is None
    assert keys.name_of(alice[:-1]) is None  # a prefix is not the key
    assert keys.name_of(alice + "x") is None
    assert keys.name_of("é" + alice) is None  # not ASCII: compared as bytes, not an error
