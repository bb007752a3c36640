"""POST /sketch (app/sketch.py): uploads in every accepted way, every option, the
response headers, and the request-level errors (missing field, wrong body type, bad
options). Decoder-level inputs are in test_decode.py; body limits in test_errors.py."""

from __future__ import annotations

import numpy as np
import pytest
from pencil_testkit import (
    MAGIC,
    MEDIA,
    PHOTOS,
    assert_api_error,
    decoded,
    encode,
    open_image,
    photo,
    photo_bytes,
    sketch_files,
)

from gpu.codec.encode import ENCODE_OPTIONS
from gpu.pencil.params import PENCIL_OPTIONS

UPLOAD_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}


def post(client, data: bytes, filename: str = "photo.jpg", content_type: str = "image/jpeg", params=None, **options):
    return client.post(
        "/sketch",
        files=sketch_files(data, filename, content_type),
        data={k: str(v) for k, v in options.items()},
        params=params,
    )


def drawing_mean(response) -> float:
    assert response.status_code == 200, response.text
    return float(decoded(response.content).astype(np.float64).mean())


# ------------------------------------------------------------------- success --


@pytest.mark.parametrize("name", PHOTOS)
@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp"])
def test_accepts_jpeg_png_webp_photos(client, rng, name, fmt):
    width = int(rng.integers(64, 161))
    source = photo(name, width, rng=rng)
    response = post(client, encode(source, fmt), f"{name}.{fmt}", UPLOAD_TYPES[fmt])
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    assert response.content.startswith(MAGIC["png"])
    out = decoded(response.content)
    assert out.shape == source.shape[:2]  # gray mode by default: 2-D, same size
    assert out.dtype == np.uint8
    assert out.std() > 5, "a photo gives a drawing with structure, not a flat image"


def test_response_headers(client, rng):
    source = photo("chelsea", 150, rng=rng)
    response = post(client, encode(source, "jpeg"), "My cat.jpg")
    assert response.status_code == 200, response.text
    assert response.headers["x-backend"] == "cpu"
    render_ms = float(response.headers["x-render-ms"])
    assert render_ms > 0
    assert float(response.headers["x-queue-ms"]) >= 0
    width, height = map(int, response.headers["x-image-size"].split("x"))
    assert open_image(response.content).size == (width, height) == (source.shape[1], source.shape[0])
    assert response.headers["content-length"] == str(len(response.content))
    assert response.headers["cache-control"] == "no-store"
    # a space is not kept in the plain filename; the exact name travels as RFC 5987 UTF-8
    assert (
        response.headers["content-disposition"]
        == "inline; filename=\"My_cat-sketch.png\"; filename*=UTF-8''My%20cat-sketch.png"
    )


def test_content_disposition_cannot_inject_header_text(client):
    response = post(client, photo_bytes("coffee", "jpeg", 96), 'a"b;\r\nX-Evil: 1.jpg')
    assert response.status_code == 200, response.text
    disposition = response.headers["content-disposition"]
    plain, extended = disposition.split("; filename*=")
    assert plain.startswith('inline; filename="') and plain.endswith('-sketch.png"')
    assert plain.count('"') == 2
    assert extended.startswith("UTF-8''") and all(c not in extended for c in ' ";\r\n')
    assert "x-evil" not in {k.lower() for k in response.headers}


def test_unicode_filename_is_accepted(make_client):
    client = make_client(raise_server_exceptions=False)
    response = post(client, photo_bytes("astronaut", "jpeg", 96), "фото.jpg")
    assert response.status_code == 200, response.text
    assert (
        response.headers["content-disposition"]
        == "inline; filename=\"____-sketch.png\"; filename*=UTF-8''%D1%84%D0%BE%D1%82%D0%BE-sketch.png"
    )


@pytest.mark.parametrize("name", ["astronaut", "camera"])
def test_mode_gray_and_color(client, rng, name):
    data = photo_bytes(name, "png", 120, rng=rng)
    gray = decoded(post(client, data, "p.png", "image/png", mode="gray").content)
    color_response = post(client, data, "p.png", "image/png", mode="color")
    assert color_response.status_code == 200, color_response.text
    color = decoded(color_response.content)
    assert gray.ndim == 2
    assert color.ndim == 3 and color.shape == gray.shape + (3,)
    if name == "camera":  # a gray photo has no chroma: the colour drawing is gray
        assert np.array_equal(color[..., 0], color[..., 1]) and np.array_equal(color[..., 1], color[..., 2])
    else:  # the astronaut's colours survive
        spread = color.astype(np.int16).max(axis=2) - color.astype(np.int16).min(axis=2)
        assert spread.mean() > 5


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
@pytest.mark.parametrize("mode", ["gray", "color"])
def test_output_formats(client, rng, fmt, mode):
    source = photo("coffee", 128, rng=rng)
    response = post(client, encode(source, "jpeg"), "coffee.jpg", format=fmt, mode=mode)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == MEDIA[fmt]
    body = response.content
    if fmt == "webp":
        assert body[:4] == b"RIFF" and body[8:12] == b"WEBP"
    else:
        assert body.startswith(MAGIC[fmt])
    image = open_image(body)
    assert image.format == {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}[fmt]
    assert image.size == (source.shape[1], source.shape[0])
    assert response.headers["x-image-size"] == f"{source.shape[1]}x{source.shape[0]}"
    extension = {"png": "png", "jpeg": "jpg", "webp": "webp"}[fmt]
    assert response.headers["content-disposition"].endswith(f'-sketch.{extension}"')
    if mode == "color":
        assert image.mode == "RGB"
    elif fmt != "webp":  # WebP has no gray mode; PNG and JPEG keep one channel
        assert image.mode == "L"


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
def test_quality_changes_size(client, rng, fmt):
    data = photo_bytes("astronaut", "jpeg", 160, rng=rng)
    sizes = []
    for quality in (5, 50, 95):
        response = post(client, data, format=fmt, quality=quality)
        assert response.status_code == 200, response.text
        sizes.append(len(response.content))
    assert sizes[0] < sizes[1] < sizes[2]


def test_quality_is_ignored_for_png(client):
    data = photo_bytes("chelsea", "jpeg", 100)
    low, high = (post(client, data, format="png", quality=q) for q in (1, 100))
    assert low.status_code == high.status_code == 200
    assert low.content == high.content


@pytest.mark.parametrize("name", PHOTOS)
@pytest.mark.parametrize("texture", ["lu", "fast"])
def test_tone_presets_order_brightness(client, rng, name, texture):
    data = photo_bytes(name, "jpeg", 128, rng=rng)
    light, medium, dark = (
        drawing_mean(post(client, data, tone=tone, texture=texture)) for tone in ("light", "medium", "dark")
    )
    assert light > medium > dark


def test_textures_lu_and_fast_differ(client, rng):
    data = photo_bytes("coffee", "jpeg", 128, rng=rng)
    lu, fast = (post(client, data, texture=t) for t in ("lu", "fast"))
    assert lu.status_code == fast.status_code == 200
    a, b = decoded(lu.content), decoded(fast.content)
    assert a.shape == b.shape
    assert not np.array_equal(a, b)


def test_rendering_is_deterministic(client, rng):
    data = photo_bytes("chelsea", "png", 112, rng=rng)
    first, second = (post(client, data, "c.png", "image/png") for _ in range(2))
    assert first.status_code == second.status_code == 200
    assert first.content == second.content


@pytest.mark.parametrize("option", ["stroke_gamma", "tone_gamma"])
@pytest.mark.parametrize("name", ["astronaut", "camera"])
def test_higher_gamma_is_darker(client, rng, option, name):
    data = photo_bytes(name, "jpeg", 128, rng=rng)
    means = [drawing_mean(post(client, data, **{option: value})) for value in (0.1, 1.0, 5.0)]
    assert means[0] > means[1] > means[2]


def test_line_frac_bounds_and_effect(client, rng):
    data = photo_bytes("astronaut", "jpeg", 160, rng=rng)
    short, long = (post(client, data, line_frac=f) for f in (0.005, 0.2))
    assert short.status_code == long.status_code == 200
    assert not np.array_equal(decoded(short.content), decoded(long.content))


def test_stroke_width_bounds_and_effect(client, rng):
    data = photo_bytes("astronaut", "jpeg", 160, rng=rng)
    # long lines so that the widths are distinguishable at this size
    thin, wide = (drawing_mean(post(client, data, line_frac=0.1, stroke_width=w)) for w in (0, 5))
    assert thin > wide


@pytest.mark.parametrize(
    ("size", "max_side"), [((320, 200), 100), ((200, 320), 100), ((300, 300), 64), ((250, 97), 17)]
)
def test_max_side_downscales_keeping_aspect(client, rng, size, max_side):
    width, height = size
    response = post(
        client, encode(photo("chelsea", width, height, rng=rng), "png"), "c.png", "image/png", max_side=max_side
    )
    assert response.status_code == 200, response.text
    out_w, out_h = open_image(response.content).size
    assert response.headers["x-image-size"] == f"{out_w}x{out_h}"
    assert max(out_w, out_h) == max_side
    assert abs(out_w / out_h - width / height) < 0.05 * (width / height) + 1 / min(out_w, out_h)


def test_max_side_never_upscales(client):
    response = post(client, photo_bytes("coffee", "jpeg", 120), max_side=1000)
    assert response.status_code == 200, response.text
    assert response.headers["x-image-size"] == "120x80"


def test_options_as_query_parameters(client, rng):
    data = photo_bytes("astronaut", "jpeg", 128, 128, rng=rng)
    response = client.post(
        "/sketch", params={"mode": "color", "format": "jpeg", "max_side": "64"}, files=sketch_files(data)
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/jpeg"
    assert response.headers["x-image-size"] == "64x64"
    assert open_image(response.content).mode == "RGB"


def test_form_field_wins_over_query(client):
    data = photo_bytes("chelsea", "jpeg", 120)
    response = post(client, data, params={"format": "jpeg", "max_side": "40"}, format="webp", max_side=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/webp"
    assert response.headers["x-image-size"].startswith("60x")


def test_invalid_query_option_is_rejected_even_with_valid_form_fields(client):
    # the form wins, so a bad query value for an option the form also sets is ignored...
    data = photo_bytes("chelsea", "jpeg", 96)
    assert post(client, data, params={"tone": "pitch-black"}, tone="dark").status_code == 200
    # ...but a bad query value for an option the form leaves alone is an error
    body = assert_api_error(
        post(client, data, params={"tone": "pitch-black"}, mode="gray"), 422, "invalid_parameter", client
    )
    assert "tone" in body["detail"]


def test_choices_are_case_insensitive_and_empty_means_default(client):
    data = photo_bytes("coffee", "jpeg", 96)
    default = post(client, data)
    explicit = post(client, data, mode=" GRAY ", tone="Auto", texture="LU", format="PNG", line_frac="", max_side="")
    assert default.status_code == explicit.status_code == 200, explicit.text
    assert default.content == explicit.content


def test_unknown_fields_and_query_parameters_are_ignored(client):
    response = post(client, photo_bytes("coffee", "jpeg", 96), params={"colour": "blue"}, brightness="9000")
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("content_type", ["image/jpeg", "image/png", "application/octet-stream"])
def test_raw_body_upload(client, rng, content_type):
    # the type of the body is decided from its bytes, whatever image/* type was sent
    source = photo("astronaut", 100, rng=rng)
    response = client.post(
        "/sketch", content=encode(source, "jpeg"), headers={"content-type": content_type}, params={"tone": "dark"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-image-size"] == f"{source.shape[1]}x{source.shape[0]}"
    assert response.headers["content-disposition"] == 'inline; filename="image-sketch.png"'
    multipart = post(client, encode(source, "jpeg"), tone="dark")
    assert response.content == multipart.content


def test_raw_body_with_query_options(client):
    response = client.post(
        "/sketch",
        content=photo_bytes("chelsea", "png", 140),
        headers={"content-type": "image/png"},
        params={"format": "jpeg", "mode": "color", "max_side": "70"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/jpeg"
    image = open_image(response.content)
    assert image.mode == "RGB" and max(image.size) == 70


# ------------------------------------------------------------ request errors --


def test_wrong_field_name_is_missing_image(client):
    response = client.post("/sketch", files={"file": ("photo.jpg", photo_bytes(), "image/jpeg")})
    body = assert_api_error(response, 400, "missing_image", client)
    assert "file" in body["detail"]  # the fields that were sent are named


def test_image_given_as_text_field_is_missing_image(client):
    response = client.post("/sketch", files={"mode": (None, "gray")}, data={"image": "not a file"})
    assert_api_error(response, 400, "missing_image", client)


def test_form_without_any_field(client):
    response = client.post("/sketch", files={"mode": (None, "gray")})
    assert_api_error(response, 400, "missing_image", client)


def test_urlencoded_form_is_unsupported_media_type(client):
    response = client.post("/sketch", data={"image": "photo.jpg", "mode": "gray"})
    assert response.request.headers["content-type"] == "application/x-www-form-urlencoded"
    body = assert_api_error(response, 415, "unsupported_media_type", client)
    assert "multipart/form-data" in body["detail"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/json"])
def test_body_that_is_neither_form_nor_image(client, content_type):
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/sketch", content=photo_bytes("camera", "jpeg", 64), headers=headers)
    assert_api_error(response, 415, "unsupported_media_type", client)


def test_multipart_without_boundary_is_bad_request(client):
    response = client.post("/sketch", content=b"--x\r\n", headers={"content-type": "multipart/form-data"})
    assert_api_error(response, 400, "bad_request", client)


def test_too_many_files_is_bad_request(client):
    image = photo_bytes("coffee", "jpeg", 64)
    response = client.post("/sketch", files=[("image", ("a.jpg", image, "image/jpeg"))] * 5)
    assert_api_error(response, 400, "bad_request", client)


def test_oversized_text_field_is_bad_request(client):
    response = post(client, photo_bytes("coffee", "jpeg", 64), mode="x" * 100_000)
    assert_api_error(response, 400, "bad_request", client)


@pytest.mark.parametrize("count", [2, 4])
def test_two_image_parts_are_duplicate_field(client, count):
    """Which photo to draw would be a guess (the last was taken silently)."""
    parts = [("image", (f"{i}.jpg", photo_bytes(name, "jpeg", 64), "image/jpeg")) for i, name in enumerate(PHOTOS)]
    body = assert_api_error(client.post("/sketch", files=parts[:count]), 400, "duplicate_field", client)
    assert "'image'" in body["detail"] and str(count) in body["detail"]


def test_image_part_and_image_text_field_are_duplicate_field(client):
    response = client.post("/sketch", files=sketch_files(photo_bytes("coffee", "jpeg", 64)), data={"image": "x"})
    assert_api_error(response, 400, "duplicate_field", client)


@pytest.mark.parametrize(("name", "values"), [("format", ["png", "jpeg"]), ("max_side", ["64", "64"])])
def test_option_twice_in_the_form_is_duplicate_field(client, name, values):
    response = client.post(
        "/sketch", files=sketch_files(photo_bytes("coffee", "jpeg", 96)), data={name: values, "mode": "gray"}
    )
    body = assert_api_error(response, 400, "duplicate_field", client)
    assert name in body["detail"] and "form" in body["detail"] and "mode" not in body["detail"]


@pytest.mark.parametrize("raw_body", [False, True])
def test_option_twice_in_the_query_is_duplicate_field(client, raw_body):
    data = photo_bytes("coffee", "jpeg", 96)
    query = [("format", "png"), ("format", "jpeg"), ("tone", "dark")]
    if raw_body:
        response = client.post("/sketch", content=data, headers={"content-type": "image/jpeg"}, params=query)
    else:
        response = client.post("/sketch", files=sketch_files(data), params=query)
    body = assert_api_error(response, 400, "duplicate_field", client)
    assert "format" in body["detail"] and "query string" in body["detail"]


def test_option_once_in_the_form_and_once_in_the_query_is_no_duplicate(client):
    response = post(client, photo_bytes("coffee", "jpeg", 96), params={"format": "jpeg"}, format="webp")
    assert response.status_code == 200 and response.headers["content-type"] == "image/webp"


def test_raw_empty_body_is_empty_file(client):
    response = client.post("/sketch", content=b"", headers={"content-type": "image/jpeg"})
    assert_api_error(response, 400, "empty_file", client)


BAD_OPTIONS = [
    ("mode", "sepia"),
    ("tone", "pitch-black"),
    ("texture", "charcoal"),
    ("hatching", "crosshatch"),
    ("format", "gif"),
    ("line_frac", "0.5"),
    ("line_frac", "0.001"),
    ("line_frac", "nan"),
    ("line_frac", "inf"),
    ("line_frac", "a third"),
    ("stroke_width", "6"),
    ("stroke_width", "-1"),
    ("stroke_width", "1.5"),
    ("stroke_width", "wide"),
    ("stroke_gamma", "0"),
    ("stroke_gamma", "5.5"),
    ("stroke_gamma", "NaN"),
    ("tone_gamma", "-inf"),
    ("tone_gamma", "10"),
    ("tone_gamma", "dark"),
    ("max_side", "8"),
    ("max_side", "70000"),
    ("max_side", "100.5"),
    ("quality", "0"),
    ("quality", "101"),
    ("quality", "high"),
    # numbers are ASCII: float() would take all of these
    ("max_side", "\u0665\u0660"),  # Arabic-Indic 50
    ("max_side", "\uff11\uff10\uff10"),  # fullwidth 100
    ("max_side", "1_000"),
    ("quality", "\u0669\u0660"),  # Arabic-Indic 90
    ("line_frac", "\u0660.\u0660\u0665"),
    ("stroke_width", "\uff12"),
]


@pytest.mark.parametrize("where", ["form", "query"])
@pytest.mark.parametrize(("name", "value"), BAD_OPTIONS)
def test_invalid_option_is_422_naming_it(client, name, value, where):
    data = photo_bytes("coffee", "jpeg", 64)
    if where == "form":
        response = post(client, data, **{name: value})
    else:
        response = client.post("/sketch", params={name: value}, files=sketch_files(data))
    body = assert_api_error(response, 422, "invalid_parameter", client)
    assert body["detail"].startswith(f"{name}:"), body


def test_every_option_is_covered_by_the_bad_option_cases():
    assert {o.name for o in PENCIL_OPTIONS + ENCODE_OPTIONS} == {name for name, _ in BAD_OPTIONS}


@pytest.mark.parametrize("option", PENCIL_OPTIONS + ENCODE_OPTIONS, ids=lambda o: o.name)
def test_extreme_valid_values_render(client, option):
    data = photo_bytes("chelsea", "jpeg", 72)
    values = list(option.choices) if option.choices else [option.minimum, option.maximum]
    for value in values:
        value = int(value) if option.type is int else value
        response = post(client, data, **{option.name: value})
        assert response.status_code == 200, f"{option.name}={value}: {response.text}"


@pytest.mark.parametrize(("fmt", "width"), [("webp", 16384), ("jpeg", 65501)])
def test_drawing_too_wide_for_the_format_is_422_before_rendering(client, monkeypatch, fmt, width):
    """WebP holds at most 16383 px a side and JPEG 65500: refused before any render work."""
    import gpu.pencil

    def must_not_render(*args, **kwargs):
        raise AssertionError("rendered a drawing that cannot be encoded")

    monkeypatch.setattr(gpu.pencil, "render", must_not_render)
    strip = np.tile(np.linspace(0, 255, width, dtype=np.uint8), (16, 1))
    response = post(client, encode(strip, "png"), "strip.png", "image/png", format=fmt)
    detail = assert_api_error(response, 422, "too_large_for_format", client)["detail"]
    assert f"{width}x16" in detail and "max_side" in detail


def test_max_side_brings_a_wide_photo_within_the_format(client):
    strip = np.tile(np.linspace(0, 255, 16400, dtype=np.uint8), (32, 1))
    response = post(client, encode(strip, "png"), "strip.png", "image/png", format="webp", max_side=16000)
    assert response.status_code == 200, response.text
    assert response.headers["x-image-size"] == "16000x31"
