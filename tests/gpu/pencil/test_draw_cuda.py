"""gpu/pencil/draw.py on CUDA: the device codec path (JPEG decoded and encoded by
nvImageCodec) draws what the CPU path draws, within the pipeline's parity bounds, for
the JPEGs users upload. CUDA and nvImageCodec only (marker `gpu`)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from jpeg_variants import VARIANTS, jpeg, photo
from PIL import Image

from gpu.backend import cuda_devices
from gpu.codec.decode import load_pixels, open_image
from gpu.pencil import draw_bytes
from gpu.pencil.params import PencilParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")]

MAX_PIXELS = 50_000_000
NAMES = ("astronaut", "coffee", "chelsea", "rocket")


@pytest.fixture(scope="module")
def pool():
    from gpu.codec import nvjpeg
    from gpu.pool import DevicePool

    if not nvjpeg.available():
        pytest.skip("nvImageCodec is not installed")
    return DevicePool(streams_per_device=4)


def decoded(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    return np.asarray(image.convert("RGB") if image.mode not in ("L", "RGB") else image)


def assert_same_drawing(got: np.ndarray, expected: np.ndarray) -> None:
    """Looser than tests/gpu/pencil/pencil_parity.py's bounds (the pipeline's own): here the
    two sides also start from different pixels, the device and host JPEG decoders' inverse
    DCTs rounding a level or two apart, which the gradient and the strokes carry on."""
    assert got.shape == expected.shape and got.dtype == np.uint8
    difference = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert difference.mean() <= 1.0, f"mean |diff| {difference.mean():.3f} grey levels"
    assert (difference <= 2).mean() >= 0.99, f"{(difference > 2).mean():.4f} of pixels off by more than 2"


def test_device_decode_is_the_host_decode_up_to_idct_rounding(pool, rng):
    from gpu.codec import nvjpeg

    for variant in ("color", "gray", "exif_rotated"):
        data = jpeg(photo(str(rng.choice(NAMES)), rng, int(rng.integers(300, 900))), variant)
        host = load_pixels(open_image(data, MAX_PIXELS))
        with pool.lease() as lease:
            device = nvjpeg.decode(lease, data, gray=host.ndim == 2)
            got = device.get(stream=lease.stream) if device is not None else None
            lease.stream.synchronize()
        assert got is not None, variant
        assert got.shape == host.shape, variant
        difference = np.abs(got.astype(np.int16) - host.astype(np.int16))
        assert difference.mean() <= 1.0 and difference.max() <= 16, (variant, difference.mean(), difference.max())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("texture", ["lu", "fast"])
def test_gpu_codec_path_draws_what_the_cpu_path_draws(pool, rng, variant, texture):
    data = jpeg(photo(str(rng.choice(NAMES)), rng, int(rng.integers(400, 1100))), variant)
    params = PencilParams(
        texture=texture,
        mode=str(rng.choice(["gray", "color"])),
        tone=str(rng.choice(["auto", "light", "medium", "dark"])),
        hatching=str(rng.choice(["flat", "follow"])),
    )
    gpu = draw_bytes(data, open_image(data, MAX_PIXELS), params, "png", 90, "cuda", pool)
    cpu = draw_bytes(data, open_image(data, MAX_PIXELS), params, "png", 90, "cpu")
    assert gpu.decoded_on == ("cpu" if variant in ("cmyk", "progressive") else "gpu")
    assert (gpu.width, gpu.height) == (cpu.width, cpu.height)
    assert_same_drawing(decoded(gpu.data), decoded(cpu.data))


@pytest.mark.parametrize("mode", ["gray", "color"])
def test_jpeg_encoded_on_the_device_is_the_drawing(pool, rng, mode):
    data = jpeg(photo(str(rng.choice(NAMES)), rng, 800), "color")
    params = PencilParams(mode=mode)
    as_jpeg = draw_bytes(data, open_image(data, MAX_PIXELS), params, "jpeg", 95, "cuda", pool)
    as_png = draw_bytes(data, open_image(data, MAX_PIXELS), params, "png", 95, "cuda", pool)
    assert (as_jpeg.decoded_on, as_jpeg.encoded_on) == ("gpu", "gpu")
    assert as_jpeg.data[:3] == b"\xff\xd8\xff"
    jpeg_pixels, exact = decoded(as_jpeg.data), decoded(as_png.data)
    assert jpeg_pixels.shape == exact.shape
    # A pencil texture is high-frequency: JPEG at q95 keeps it within a few levels.
    difference = np.abs(jpeg_pixels.astype(np.int16) - exact.astype(np.int16))
    assert difference.mean() <= 4.0, difference.mean()


def test_max_side_and_png_inputs_take_the_host_decoder(pool, rng):
    image = photo("coffee", rng, 900)
    data = jpeg(image, "color")
    shrunk = draw_bytes(data, open_image(data, MAX_PIXELS), PencilParams(max_side=450), "jpeg", 90, "cuda", pool)
    assert shrunk.decoded_on == "cpu" and shrunk.width == 450
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    png = buffer.getvalue()
    drawn = draw_bytes(png, open_image(png, MAX_PIXELS), PencilParams(), "png", 90, "cuda", pool)
    assert (drawn.decoded_on, drawn.encoded_on) == ("cpu", "cpu")


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_turns_as_on_the_host(pool, rng, orientation):
    """The device decoder applies mirrors and half turns too (the shape check in draw.py
    only sees quarter turns): the drawings of both paths agree."""
    data = jpeg(photo(str(rng.choice(NAMES)), rng, 480), "exif_rotated", orientation=orientation)
    params = PencilParams(texture="fast", mode="color")
    gpu = draw_bytes(data, open_image(data, MAX_PIXELS), params, "png", 90, "cuda", pool)
    cpu = draw_bytes(data, open_image(data, MAX_PIXELS), params, "png", 90, "cpu")
    assert gpu.decoded_on == "gpu"
    assert_same_drawing(decoded(gpu.data), decoded(cpu.data))
