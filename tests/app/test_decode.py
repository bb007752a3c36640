"""gpu/codec/decode.py: `sniff_format` and `decode_image` directly, then the same inputs
through POST /sketch (statuses, error codes, and that the server keeps answering)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from pencil_testkit import (
    assert_api_error,
    decoded,
    encode,
    open_image,
    photo,
    photo_bytes,
    png_with_header,
    sketch_files,
    smooth_random,
)
from PIL import Image

from app.errors import IMAGE_ERROR_STATUS
from gpu.codec.decode import decode_image, sniff_format, to_array
from gpu.codec.errors import ImageError

MAX_PIXELS = 50_000_000  # the default of Settings.max_pixels


def orientation_jpeg(image: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(image, "jpeg", exif=exif.tobytes())


def two_band(width: int = 200, height: int = 100) -> np.ndarray:
    """Dark top half (30), light bottom half (220): shows where a rotation put the top."""
    image = np.full((height, width, 3), 220, np.uint8)
    image[: height // 2] = 30
    return image


def sixteen_bit_png(rng, width=120, height=90) -> tuple[bytes, np.ndarray]:
    ramp = np.linspace(1000, 64000, width)[None, :] * np.ones((height, 1))
    values = np.clip(ramp + rng.normal(0, 500, (height, width)), 0, 65535).astype(np.uint16)
    image = Image.fromarray(values)
    assert image.mode == "I;16"
    return encode(image, "png"), values


def palette_png_with_transparency(rng) -> bytes:
    image = Image.fromarray(photo("chelsea", 120, rng=rng)).quantize(64)
    image.info["transparency"] = 0
    return encode(image, "png", transparency=0)


def rgba_png(alpha: int | np.ndarray, rng, width=96, height=80) -> bytes:
    rgb = smooth_random(rng, height, width)
    a = np.broadcast_to(np.asarray(alpha, np.uint8), (height, width))
    return encode(np.dstack([rgb, a]), "png")


def cmyk_jpeg(rng) -> bytes:
    return encode(Image.fromarray(photo("coffee", 120, rng=rng)).convert("CMYK"), "jpeg")


def truncated_jpeg(rng) -> bytes:
    data = photo_bytes("astronaut", "jpeg", 160, rng=rng)
    return data[: len(data) // 2]


# ---------------------------------------------------------------- sniff_format --


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [("jpeg", "JPEG"), ("png", "PNG"), ("webp", "WEBP"), ("gif", None), ("bmp", None), ("tiff", None)],
)
def test_sniff_format_of_real_files(fmt, expected):
    assert sniff_format(photo_bytes("chelsea", fmt, 64)) == expected


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xd8",
        b"\x89PNG",
        b"RIFF\x00\x00\x00\x00WEBX",
        b"RIFF\x00\x00\x00\x00WEB",
        b"hello, this is text\n",
        b"<svg xmlns='http://www.w3.org/2000/svg'/>",
    ],
)
def test_sniff_format_rejects_non_images_and_short_prefixes(data):
    assert sniff_format(data) is None


def test_sniff_format_decides_from_bytes_only():
    assert sniff_format(b"\xff\xd8\xff" + b"\x00" * 10) == "JPEG"
    assert sniff_format(b"\x89PNG\r\n\x1a\n") == "PNG"
    assert sniff_format(b"RIFF\x10\x00\x00\x00WEBPVP8 ") == "WEBP"


# ---------------------------------------------------------------- decode_image --


@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp"])
@pytest.mark.parametrize(("name", "ndim"), [("astronaut", 3), ("coffee", 3), ("camera", 2)])
def test_decode_photo(rng, fmt, name, ndim):
    width, height = int(rng.integers(64, 200)), int(rng.integers(64, 200))
    source = photo(name, width, height, rng=rng)
    array = decode_image(encode(source, fmt), MAX_PIXELS)
    assert array.dtype == np.uint8 and array.flags.c_contiguous
    # WebP stores gray as RGB; every other path keeps the channel count
    expected = (height, width) if ndim == 2 and fmt != "webp" else (height, width, 3)
    assert array.shape == expected
    if fmt == "png":
        assert np.array_equal(array, source)
    else:
        reference = source if array.ndim == source.ndim else np.dstack([source] * 3)
        assert np.abs(array.astype(int) - reference.astype(int)).mean() < 6


def test_decode_sixteen_bit_gray_png(rng):
    data, values = sixteen_bit_png(rng)
    array = decode_image(data, MAX_PIXELS)
    assert array.shape == values.shape and array.dtype == np.uint8
    expected = np.round(values / 65535.0 * 255.0)
    assert np.abs(array.astype(float) - expected).max() <= 1
    assert array.std() > 20


def test_decode_cmyk_jpeg(rng):
    data = cmyk_jpeg(rng)
    assert open_image(data).mode == "CMYK"
    array = decode_image(data, MAX_PIXELS)
    assert array.ndim == 3 and array.shape[2] == 3 and array.dtype == np.uint8
    assert array.std() > 10


def test_decode_grayscale_jpeg(rng):
    source = photo("camera", 100, 90, rng=rng)
    array = decode_image(encode(source, "jpeg"), MAX_PIXELS)
    assert array.shape == (90, 100) and array.dtype == np.uint8


def test_decode_palette_png_with_transparency_composites_on_white(rng):
    data = palette_png_with_transparency(rng)
    assert open_image(data).mode == "P"
    array = decode_image(data, MAX_PIXELS)
    assert array.ndim == 3 and array.shape[2] == 3
    palette_image = Image.open(io.BytesIO(data))
    transparent = np.asarray(palette_image) == 0
    assert transparent.any()
    assert (array[transparent] == 255).all()  # the transparent colour became white


def test_decode_rgba_composites_on_white(rng):
    alpha = np.zeros((80, 96), np.uint8)
    alpha[:, 48:] = 255
    array = decode_image(rgba_png(alpha, rng), MAX_PIXELS)
    assert array.shape == (80, 96, 3)
    assert (array[:, :48] == 255).all()  # transparent half: white
    assert array[:, 48:].mean() < 240  # opaque half: the picture


def test_decode_half_transparent_is_blended(rng):
    rgb = smooth_random(rng, 64, 64)
    data = encode(np.dstack([rgb, np.full((64, 64), 128, np.uint8)]), "png")
    array = decode_image(data, MAX_PIXELS).astype(float)
    expected = rgb * (128 / 255) + 255 * (127 / 255)
    assert np.abs(array - expected).max() <= 2


def test_decode_gray_with_alpha(rng):
    gray = smooth_random(rng, 64, 72, channels=None)
    alpha = np.zeros_like(gray)
    alpha[32:] = 255
    image = Image.fromarray(np.dstack([gray, alpha]), "LA")
    array = decode_image(encode(image, "png"), MAX_PIXELS)
    assert array.shape == (64, 72)
    assert (array[:32] == 255).all() and np.array_equal(array[32:], gray[32:])


def test_decode_bilevel_png(rng):
    bits = Image.fromarray(smooth_random(rng, 64, 64, channels=None) > 128)
    assert bits.mode == "1"
    array = decode_image(encode(bits, "png"), MAX_PIXELS)
    assert array.shape == (64, 64) and set(np.unique(array)) <= {0, 255}


@pytest.mark.parametrize(
    ("orientation", "dark_side"),
    [(1, "top"), (3, "bottom"), (6, "right"), (8, "left")],
)
def test_decode_applies_exif_orientation(orientation, dark_side):
    array = decode_image(orientation_jpeg(two_band(200, 100), orientation), MAX_PIXELS)
    if orientation in (6, 8):
        assert array.shape[:2] == (200, 100)  # portrait now: 100 wide, 200 tall
    else:
        assert array.shape[:2] == (100, 200)
    h, w = array.shape[:2]
    halves = {
        "top": (array[: h // 2], array[h // 2 :]),
        "bottom": (array[h // 2 :], array[: h // 2]),
        "left": (array[:, : w // 2], array[:, w // 2 :]),
        "right": (array[:, w // 2 :], array[:, : w // 2]),
    }
    dark, light = halves[dark_side]
    assert dark.mean() < 60 and light.mean() > 190


def test_decode_ignores_broken_exif(rng):
    data = encode(photo("coffee", 120, 80, rng=rng), "jpeg", exif=b"Exif\x00\x00garbage-that-is-not-tiff")
    assert decode_image(data, MAX_PIXELS).shape == (80, 120, 3)


def test_to_array_16_bit_gray_modes():
    """16-bit gray PNGs decode as I;16 (or I in older Pillow): scaled to 8 bits."""
    ramp = np.linspace(0.1, 0.9, 64 * 64).reshape(64, 64)
    sixteen = Image.fromarray((ramp * 65535).astype(np.uint16))
    assert sixteen.mode == "I;16"
    for image in (sixteen, sixteen.convert("I")):
        unit = to_array(image)
        assert unit.dtype == np.uint8 and unit.shape == (64, 64)
        assert abs(int(unit[0, 0]) - 26) <= 1 and abs(int(unit[-1, -1]) - 230) <= 1


def test_png_with_trns_colour_is_composited_on_white():
    """A gray or RGB PNG may mark one colour transparent (tRNS): it becomes paper white."""
    for mode, transparent in (("L", 0), ("RGB", (0, 0, 0))):
        pixels = np.full((32, 32) if mode == "L" else (32, 32, 3), 120, np.uint8)
        pixels[:8, :8] = 0
        buffer = io.BytesIO()
        Image.fromarray(pixels, mode).save(buffer, "PNG", transparency=transparent)
        decoded_pixels = decode_image(buffer.getvalue(), MAX_PIXELS)
        assert (decoded_pixels[:8, :8] == 255).all() and (decoded_pixels[8:, 8:] == 120).all()


@pytest.mark.parametrize(
    ("make", "status", "code"),
    [
        (lambda rng: b"", 400, "empty_file"),
        (lambda rng: b"this is a text file with a .jpg name\n" * 20, 415, "unsupported_format"),
        (lambda rng: photo_bytes("chelsea", "gif", 64), 415, "unsupported_format"),
        (lambda rng: photo_bytes("chelsea", "bmp", 64), 415, "unsupported_format"),
        (lambda rng: photo_bytes("chelsea", "tiff", 64), 415, "unsupported_format"),
        (truncated_jpeg, 400, "corrupt_image"),
        (lambda rng: b"\xff\xd8\xff" + bytes(rng.integers(1, 256, 2000, dtype=np.uint8)), 400, "corrupt_image"),
        (lambda rng: photo_bytes("coffee", "png", 120)[:300], 400, "corrupt_image"),
        (lambda rng: png_with_header(200, 200), 400, "corrupt_image"),  # header fine, pixels missing
        (lambda rng: encode(np.full((1, 1, 3), 128, np.uint8), "png"), 400, "image_too_small"),
        (lambda rng: photo_bytes("camera", "png", 15, 400), 400, "image_too_small"),
        (lambda rng: png_with_header(60000, 60000), 413, "too_many_pixels"),  # Pillow's bomb guard
        (lambda rng: png_with_header(8000, 8000), 413, "too_many_pixels"),  # over our limit, under Pillow's
    ],
    ids=[
        "empty",
        "text",
        "gif",
        "bmp",
        "tiff",
        "truncated-jpeg",
        "jpeg-signature-noise",
        "truncated-png",
        "png-no-pixels",
        "1x1",
        "15px-wide",
        "60000x60000",
        "8000x8000",
    ],
)
def test_decode_rejects(rng, make, status, code):
    with pytest.raises(ImageError) as caught:
        decode_image(make(rng), MAX_PIXELS)
    assert (IMAGE_ERROR_STATUS[caught.value.code], caught.value.code) == (status, code)
    assert caught.value.detail


def test_decode_pixel_limit_is_configurable():
    data = photo_bytes("astronaut", "png", 100, 100)
    assert decode_image(data, 10_000).shape == (100, 100, 3)  # exactly at the limit
    with pytest.raises(ImageError) as caught:
        decode_image(data, 9_999)
    assert (IMAGE_ERROR_STATUS[caught.value.code], caught.value.code) == (413, "too_many_pixels")
    assert "100x100" in caught.value.detail


def test_decode_minimum_side_is_accepted():
    assert decode_image(photo_bytes("chelsea", "png", 16, 16), MAX_PIXELS).shape == (16, 16, 3)


# ------------------------------------------------------------- through /sketch --


def upload(client, data: bytes, filename: str = "photo.jpg", content_type: str = "image/jpeg", **options):
    return client.post("/sketch", files=sketch_files(data, filename, content_type), data=options)


def test_http_empty_file(client):
    assert_api_error(upload(client, b""), 400, "empty_file", client)


def test_http_text_file_named_jpg(client):
    response = upload(client, b"just some notes, not a photo\n" * 10, "notes.jpg", "image/jpeg")
    assert_api_error(response, 415, "unsupported_format", client)


@pytest.mark.parametrize("fmt", ["gif", "bmp"])
def test_http_gif_and_bmp(client, rng, fmt):
    response = upload(client, encode(photo("astronaut", 96, rng=rng), fmt), f"photo.{fmt}", f"image/{fmt}")
    assert_api_error(response, 415, "unsupported_format", client)


def test_http_truncated_jpeg(client, rng):
    assert_api_error(upload(client, truncated_jpeg(rng)), 400, "corrupt_image", client)


def test_http_one_pixel_png(client):
    response = upload(client, encode(np.full((1, 1), 200, np.uint8), "png"), "dot.png", "image/png")
    body = assert_api_error(response, 400, "image_too_small", client)
    assert "1x1" in body["detail"]


def test_http_decompression_bomb_header(client):
    data = png_with_header(60000, 60000)
    assert len(data) < 200
    response = upload(client, data, "bomb.png", "image/png")
    assert_api_error(response, 413, "too_many_pixels", client)


def test_http_pixel_limit_from_settings(make_client):
    client = make_client(max_pixels=100 * 100)
    assert upload(client, photo_bytes("coffee", "png", 100, 100), "ok.png", "image/png").status_code == 200
    response = upload(client, photo_bytes("coffee", "png", 101, 100), "big.png", "image/png")
    body = assert_api_error(response, 413, "too_many_pixels", client)
    assert "101x100" in body["detail"]


def test_http_sixteen_bit_gray_png(client, rng):
    data, values = sixteen_bit_png(rng)
    response = upload(client, data, "deep.png", "image/png")
    assert response.status_code == 200, response.text
    out = decoded(response.content)
    assert out.shape == values.shape
    assert out.std() > 5 and out.min() < out.max()


def test_http_cmyk_jpeg(client, rng):
    response = upload(client, cmyk_jpeg(rng), "print.jpg", "image/jpeg", mode="color")
    assert response.status_code == 200, response.text
    out = decoded(response.content)
    assert out.ndim == 3 and out.std() > 5


def test_http_palette_png_with_transparency(client, rng):
    response = upload(client, palette_png_with_transparency(rng), "p.png", "image/png")
    assert response.status_code == 200, response.text
    assert decoded(response.content).std() > 5


def test_http_rgba_png(client, rng):
    alpha = np.full((80, 96), 255, np.uint8)
    alpha[:, :30] = 0
    response = upload(client, rgba_png(alpha, rng), "rgba.png", "image/png")
    assert response.status_code == 200, response.text
    assert decoded(response.content).shape == (80, 96)


def test_http_fully_transparent_image_draws_white_fast_texture(client, rng):
    response = upload(client, rgba_png(0, rng), "clear.png", "image/png", texture="fast")
    assert response.status_code == 200, response.text
    out = decoded(response.content)
    assert out.shape == (80, 96)
    assert out.mean() > 240, out.mean()
    opaque = upload(client, rgba_png(255, rng), "opaque.png", "image/png", texture="fast")
    assert decoded(opaque.content).mean() < out.mean()


@pytest.mark.parametrize("kind", ["transparent", "solid-gray"])
def test_http_flat_image_draws_white_default_texture(make_client, rng, kind):
    client = make_client(raise_server_exceptions=False)
    data = rgba_png(0, rng) if kind == "transparent" else encode(np.full((64, 64, 3), 128, np.uint8), "png")
    response = upload(client, data, "flat.png", "image/png")
    assert response.status_code == 200, response.text
    assert decoded(response.content).mean() > 200


def test_http_grayscale_jpeg(client, rng):
    source = photo("camera", 128, rng=rng)
    response = upload(client, encode(source, "jpeg"), mode="color")
    assert response.status_code == 200, response.text
    out = decoded(response.content)
    assert out.shape == source.shape + (3,)


def test_http_exif_rotated_jpeg(client):
    response = upload(client, orientation_jpeg(two_band(200, 100), 6))
    assert response.status_code == 200, response.text
    assert response.headers["x-image-size"] == "100x200"
    assert open_image(response.content).size == (100, 200)


def test_http_webp_upload(client, rng):
    source = photo("chelsea", 128, rng=rng)
    response = upload(client, encode(source, "webp"), "cat.webp", "image/webp")
    assert response.status_code == 200, response.text
    assert decoded(response.content).shape == source.shape[:2]


def test_http_many_bad_inputs_in_a_row_then_a_good_one(client, rng):
    bad = [
        b"",
        b"GIF89a....",
        truncated_jpeg(rng),
        png_with_header(60000, 60000),
        encode(np.full((2, 2), 9, np.uint8), "png"),
    ]
    for data in bad:
        assert upload(client, data).status_code in (400, 413, 415)
    response = upload(client, photo_bytes("coffee", "jpeg", 96))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("name", ["astronaut", "camera", "coffee"])
def test_plain_png_decodes_through_libpng_as_through_pillow(rng, name, monkeypatch):
    import imagecodecs

    from gpu.codec.decode import decode_pixels, load_pixels

    data = photo_bytes(name, "png", int(rng.integers(100, 400)), rng=rng)
    expected = load_pixels(open_image(data))
    fast = []
    decode = imagecodecs.png_decode
    monkeypatch.setattr(imagecodecs, "png_decode", lambda data: fast.append(1) or decode(data))
    got = decode_pixels(data, open_image(data))
    assert fast == [1]  # the fast path, not Pillow's
    assert got.dtype == np.uint8 and got.flags.c_contiguous and got.flags.writeable
    np.testing.assert_array_equal(got, expected)


def test_a_png_libpng_refuses_is_left_to_pillow(rng):
    from gpu.codec import decode

    data = photo_bytes("coffee", "png", 200, rng=rng)
    cut = data[: len(data) // 2]  # the header is whole, the pixels are not
    with pytest.raises(ImageError) as caught:
        decode.decode_pixels(cut, decode.open_image(cut, 10**8))
    assert caught.value.code == "corrupt_image"


def test_http_truncated_png(client, rng):
    data = photo_bytes("coffee", "png", 200, rng=rng)
    for cut in (len(data) // 2, len(data) // 3):
        response = client.post("/sketch", files={"image": ("cut.png", data[:cut], "image/png")})
        assert response.status_code == 400 and response.json()["error"] == "corrupt_image", response.text


def test_png_with_imagemagick_exif_text_is_turned_upright():
    from PIL import PngImagePlugin

    from gpu.codec.decode import decode_pixels

    exif = Image.Exif()
    exif[0x0112] = 6
    raw = b"Exif\x00\x00" + exif.tobytes()
    text = f"\nexif\n{len(raw):8d}\n{raw.hex()}\n"
    info = PngImagePlugin.PngInfo()
    info.add_text("Raw profile type exif", text)
    data = encode(two_band(), "png", pnginfo=info)
    assert decode_pixels(data, open_image(data)).shape == (200, 100, 3)


def test_png_with_an_exif_orientation_is_turned_upright():
    from gpu.codec.decode import decode_pixels

    image = two_band()
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encode(image, "png", exif=exif.tobytes())
    got = decode_pixels(data, open_image(data))
    assert got.shape == (200, 100, 3)
    assert (got[:, 50:] == 30).all() and (got[:, :50] == 220).all()  # turned clockwise: the dark top is on the right


# EXIF whose orientation tag is 6 and whose make tag was mangled (type byte 0x06 -> 0x01 in
# a count field, found by fuzzing): Pillow's exif_transpose raises struct.error on it.
MANGLED_EXIF = bytes.fromhex(
    "4578696600004d4d002a00000008000201060002000000070000002601120003000000010006000000000000b8616d6572610000"
)


def test_a_photo_with_mangled_exif_is_drawn_as_stored(make_client):
    data = encode(photo("coffee", 120, 80), "jpeg", exif=MANGLED_EXIF)
    pixels = decode_image(data, MAX_PIXELS)
    assert pixels.shape[:2] in ((80, 120), (120, 80))
    response = make_client().post("/sketch", files=sketch_files(data))
    assert response.status_code == 200, response.text


def adam7_png(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of `pixels`, interlaced (Adam7), written by hand: neither Pillow nor
    OpenCV writes one. Every scanline of the seven passes with filter 0 (none)."""
    import struct
    import zlib

    height, width, _ = pixels.shape
    passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
    raw = b"".join(
        b"\x00" + pixels[y, x0::dx].tobytes() for x0, y0, dx, dy in passes if x0 < width for y in range(y0, height, dy)
    )

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 1)  # 8-bit RGB, interlace method 1
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def test_an_interlaced_png_goes_through_pillow(rng, monkeypatch):
    """libpng prints a warning for Adam7 PNGs, past the JSON logs: Pillow decodes them."""
    import imagecodecs

    from gpu.codec import decode

    pixels = np.ascontiguousarray(rng.integers(0, 256, (37, 45, 3), dtype=np.uint8))
    data = adam7_png(pixels)
    image = decode.open_image(data, 10**8)
    assert image.info.get("interlace")
    monkeypatch.setattr(imagecodecs, "png_decode", lambda data: pytest.fail("libpng used"))
    np.testing.assert_array_equal(decode.decode_pixels(data, image), pixels)
