"""gpu/codec/encode.py: encode_image round trips (decoded back with Pillow, an independent
decoder), channel order, quality, and parse_encode_options."""

from __future__ import annotations

import numpy as np
import pytest
from pencil_testkit import MAGIC, decoded, open_image, photo, smooth_random

from gpu.codec.encode import ENCODE_OPTIONS, EXTENSIONS, MEDIA_TYPES, encode_image, parse_encode_options
from gpu.pencil.params import ParamError


def random_size(rng) -> tuple[int, int]:
    return int(rng.integers(64, 321)), int(rng.integers(64, 321))


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
@pytest.mark.parametrize("channels", [None, 3])
def test_round_trip_keeps_size(rng, fmt, channels):
    height, width = random_size(rng)
    image = smooth_random(rng, height, width, channels)
    data = encode_image(image, fmt, 90)
    back = open_image(data)
    assert back.format == {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}[fmt]
    assert back.size == (width, height)
    array = np.asarray(back)
    if fmt == "png":
        assert np.array_equal(array, image)  # lossless and same channel layout
        return
    reference = image if array.ndim == image.ndim else np.dstack([image] * 3)
    assert array.shape == reference.shape
    assert np.abs(array.astype(int) - reference.astype(int)).mean() < 4


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_round_trip_photo_keeps_rgb_order(fmt):
    image = photo("astronaut", 96)  # red suit, blue sky... plus pure patches below
    image = image.copy()
    image[:24, :24] = (220, 30, 30)
    image[:24, -24:] = (30, 30, 220)
    back = decoded(encode_image(image, fmt, 95))
    red, blue = back[4:20, 4:20].mean(axis=(0, 1)), back[4:20, -20:-4].mean(axis=(0, 1))
    assert red[0] > 180 and red[2] < 70, red
    assert blue[2] > 180 and blue[0] < 70, blue


def test_encode_does_not_modify_its_input(rng):
    image = smooth_random(rng, 80, 90)
    before = image.copy()
    for fmt in ("png", "jpeg", "webp"):
        encode_image(image, fmt)
    assert np.array_equal(image, before)


def test_magic_bytes(rng):
    image = smooth_random(rng, 64, 64)
    assert encode_image(image, "png").startswith(MAGIC["png"])
    assert encode_image(image, "jpeg").startswith(MAGIC["jpeg"])
    webp = encode_image(image, "webp")
    assert webp[:4] == b"RIFF" and webp[8:12] == b"WEBP"


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
def test_quality_orders_size_and_error(fmt):
    image = photo("chelsea", 200)
    low, high = (encode_image(image, fmt, q) for q in (10, 95))
    assert len(low) < len(high)
    error = [np.abs(decoded(d).astype(int) - image.astype(int)).mean() for d in (low, high)]
    assert error[0] > error[1]


def test_png_ignores_quality(rng):
    image = smooth_random(rng, 70, 50)
    assert encode_image(image, "png", 1) == encode_image(image, "png", 100)


def test_unknown_format_raises():
    with pytest.raises(ValueError):
        encode_image(np.full((32, 32), 100, np.uint8), "gif")


def test_tables_are_consistent():
    assert set(MEDIA_TYPES) == set(EXTENSIONS) == set(ENCODE_OPTIONS[0].choices)
    assert EXTENSIONS["jpeg"] == "jpg"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, ("png", 90)),
        ({"format": "", "quality": ""}, ("png", 90)),
        ({"format": None, "quality": None}, ("png", 90)),
        ({"format": "JPEG", "quality": "75"}, ("jpeg", 75)),
        ({"format": "webp", "quality": "100.0"}, ("webp", 100)),
        ({"format": "jpeg", "quality": 1}, ("jpeg", 1)),
        ({"mode": "color", "format": "png"}, ("png", 90)),
    ],
)
def test_parse_encode_options(raw, expected):
    assert parse_encode_options(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        {"format": "gif"},
        {"quality": "0"},
        {"quality": "101"},
        {"quality": "7.5"},
        {"quality": "nan"},
        {"quality": "best"},
    ],
)
def test_parse_encode_options_rejects(raw):
    with pytest.raises(ParamError) as caught:
        parse_encode_options(raw)
    assert caught.value.field == next(iter(raw))
    assert str(caught.value).startswith(f"{next(iter(raw))}:")
