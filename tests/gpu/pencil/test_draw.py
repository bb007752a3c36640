"""gpu/pencil/draw.py on the CPU backend: bytes in, the reference drawing encoded out,
and which uploads the device JPEG decoder would take."""

from __future__ import annotations

import io

import numpy as np
import pytest
from jpeg_variants import VARIANTS, jpeg, photo
from PIL import Image

from gpu.codec.decode import load_pixels, open_image
from gpu.codec.errors import ImageError
from gpu.pencil import draw_bytes, reference
from gpu.pencil.draw import device_decodable, upright_size
from gpu.pencil.params import PencilParams

MAX_PIXELS = 50_000_000


def decoded(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


@pytest.mark.parametrize("variant", VARIANTS)
def test_cpu_draw_is_the_reference_drawing(rng, variant):
    data = jpeg(photo("coffee", rng, 200), variant)
    photo_header = open_image(data, MAX_PIXELS)
    params = PencilParams(texture=str(rng.choice(["lu", "fast"])), mode=str(rng.choice(["gray", "color"])))
    drawing = draw_bytes(data, photo_header, params, "png", 90, "cpu")
    expected = reference.render(load_pixels(open_image(data, MAX_PIXELS)), params)
    np.testing.assert_array_equal(decoded(drawing.data), expected)
    assert (drawing.height, drawing.width) == expected.shape[:2] == upright_size(photo_header)
    assert (drawing.decoded_on, drawing.encoded_on) == ("cpu", "cpu")


def test_exif_rotation_swaps_the_drawn_size(rng):
    image = photo("astronaut", rng, 240)
    data = jpeg(image, "exif_rotated")
    drawing = draw_bytes(data, open_image(data, MAX_PIXELS), PencilParams(texture="fast"), "jpeg", 80, "cpu")
    assert (drawing.width, drawing.height) == (image.shape[0], image.shape[1])
    assert decoded(drawing.data).shape == (image.shape[1], image.shape[0])


@pytest.mark.parametrize(
    ("variant", "takes"),
    [("color", True), ("gray", True), ("exif_rotated", True), ("progressive", False), ("cmyk", False)],
)
def test_device_decoder_takes_8_bit_gray_and_ycbcr_jpegs(rng, variant, takes):
    data = jpeg(photo("chelsea", rng, 160), variant)
    assert device_decodable(open_image(data, MAX_PIXELS), data, PencilParams()) is takes


def test_device_decoder_leaves_truncated_png_and_shrunk_photos_to_the_host(rng):
    image = photo("chelsea", rng, 300)
    data = jpeg(image, "color")
    truncated = data[: len(data) * 2 // 3]
    assert not device_decodable(open_image(truncated, MAX_PIXELS), truncated, PencilParams())
    with pytest.raises(ImageError) as caught:
        draw_bytes(truncated, open_image(truncated, MAX_PIXELS), PencilParams(), "png", 90, "cpu")
    assert caught.value.code == "corrupt_image"
    assert not device_decodable(open_image(data, MAX_PIXELS), data, PencilParams(max_side=100))
    assert device_decodable(open_image(data, MAX_PIXELS), data, PencilParams(max_side=300))
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    png = buffer.getvalue()
    assert not device_decodable(open_image(png, MAX_PIXELS), png, PencilParams())


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_is_drawn_upright(rng, orientation):
    image = photo("astronaut", rng, 160)
    data = jpeg(image, "exif_rotated", orientation=orientation)
    photo_header = open_image(data, MAX_PIXELS)
    drawing = draw_bytes(data, photo_header, PencilParams(texture="fast"), "png", 90, "cpu")
    swapped = orientation >= 5
    assert (drawing.height, drawing.width) == ((image.shape[1], image.shape[0]) if swapped else image.shape[:2])
    assert (drawing.height, drawing.width) == upright_size(photo_header)
