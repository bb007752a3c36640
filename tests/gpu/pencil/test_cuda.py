"""gpu/pencil/cuda.py against gpu/pencil/reference.py, stage by stage and end to end.

CUDA only (marker `gpu`; skipped without a device). Real photographs from scikit-image,
fresh random seeds (printed on failure through the test id), every device plane
poisoned with NaN / 0xFF before a kernel writes it. Every option over its whole range:
each mode x tone x texture x hatching, stroke_width 0..5, line_frac and both gammas at
their ends, max_side on a 12 MP photo, and the CPU fallback for line kernels too large
for the GPU passes. The drawing bounds and the reference's side of the stage tests are
in pencil_parity.py; test_emulated.py runs the same kernels on the CPU emulator in CI.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from pencil_parity import (
    OPTIONS,
    PHOTOS,
    assert_same_drawing,
    crossed_log_texture,
    expected_labels,
    option_range,
    photo,
    random_params,
    reference_merge,
    reference_strokes,
    strokes_given_labels,
)

from gpu.backend import cuda_devices
from gpu.pencil import reference as ref
from gpu.pencil.params import PencilParams

STROKE_WIDTHS = range(int(option_range("stroke_width")[0]), int(option_range("stroke_width")[1]) + 1)
WIDEST = STROKE_WIDTHS[-1]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device"),
    pytest.mark.pool(streams_per_device=8),
]


@pytest.fixture(scope="module")
def cuda(poison):
    from gpu.pencil import cuda

    return cuda


def upload(image: np.ndarray):
    import cupy

    return cupy.asarray(image)


# ------------------------------------------------------------------ stages --


@pytest.mark.parametrize("name", PHOTOS)
@pytest.mark.parametrize(("height", "width"), [(97, 131), (1, 257), (333, 1), (480, 640)])
def test_luma_histogram_median_gradient_are_bit_exact(cuda, lease, name, height, width):
    image = photo(name, height, width)
    planes = cuda.luma_and_histogram(upload(image))
    luma, _ = ref.split_luma(image)
    np.testing.assert_array_equal(planes.luma.get(), luma)
    np.testing.assert_array_equal(planes.histogram.get(), ref.histogram(luma))

    halo = 5
    padded = cuda.gradient_padded(planes.luma, halo).get()  # 255 M, whole numbers
    expected = ref.gradient(ref.median3(luma))
    assert expected.any()
    interior = padded[halo : halo + height, halo : halo + width]
    np.testing.assert_array_equal(interior, np.rint(expected * 255))  # the reference's M, up to its rounding
    border = padded.copy()
    border[halo : halo + height, halo : halo + width] = 0
    assert not border.any(), "the padding must be zero"


@pytest.mark.parametrize("name", PHOTOS[:3])
@pytest.mark.parametrize(
    ("height", "width", "line_frac"), [(97, 131, 1 / 30), (240, 321, 1 / 15), (600, 450, 0.2), (1, 300, 1 / 30)]
)
def test_label_is_the_argmax_up_to_near_ties(cuda, lease, name, height, width, line_frac):
    luma, _ = ref.split_luma(photo(name, height, width))
    params = PencilParams(line_frac=line_frac)
    length = params.line_length(height, width)
    plan = cuda.assets(lease.device).line_plan(length, 0)
    magnitude = ref.gradient(ref.median3(luma))
    label, packed = cuda.classify(cuda.gradient_padded(upload(luma), plan.halo), plan, height, width)
    label = label.get()

    expected, clear = expected_labels(magnitude, length)  # only near-ties may differ
    assert clear.mean() > 0.5
    np.testing.assert_array_equal(label[clear], expected[clear])

    # The packed plane carries 255 M exactly, with the label in its 3 low bits.
    interior = packed.get()[plan.halo : plan.halo + height, plan.halo : plan.halo + width]
    bits = interior.view(np.uint32)
    np.testing.assert_array_equal(bits & 7, label)
    np.testing.assert_array_equal((bits & ~np.uint32(7)).view(np.float32), np.rint(magnitude * 255))


@pytest.mark.parametrize("stroke_width", STROKE_WIDTHS)
@pytest.mark.parametrize(("height", "width"), [(131, 97), (300, 401), (1, 200)])
def test_stroke_map_matches_the_reference_given_the_same_labels(cuda, lease, rng, stroke_width, height, width):
    luma, _ = ref.split_luma(photo(str(rng.choice(PHOTOS)), height, width))
    length = PencilParams().line_length(height, width)
    assets = cuda.assets(lease.device)
    thin, wide = assets.line_plan(length, 0), assets.line_plan(length, stroke_width)
    label, packed = cuda.classify(cuda.gradient_padded(upload(luma), thin.halo), thin, height, width)
    strokes, extrema = cuda.strokes(packed, wide, height, width)
    strokes = strokes.get()

    magnitude = ref.gradient(ref.median3(luma))
    expected = strokes_given_labels(magnitude, label.get(), length, stroke_width)
    assert np.isfinite(strokes).all()
    np.testing.assert_allclose(strokes, expected, rtol=0, atol=2e-5 * float(expected.max()))
    low, high = extrema.get().view(np.float32)
    assert (low, high) == (strokes.min(), strokes.max())


def test_untiled_line_passes_agree_with_the_tiled_ones(cuda, lease, monkeypatch):
    luma, _ = ref.split_luma(photo("astronaut", 203, 317))
    assets = cuda.assets(lease.device)
    length = PencilParams().line_length(*luma.shape)
    thin, wide = assets.line_plan(length, 0), assets.line_plan(length, 2)

    def run():
        label, packed = cuda.classify(cuda.gradient_padded(upload(luma), thin.halo), thin, *luma.shape)
        strokes, _ = cuda.strokes(packed, wide, *luma.shape)
        return label.get(), strokes.get()

    tiled = run()
    monkeypatch.setattr(cuda, "FORCE_UNTILED_LINE_PASSES", True)
    untiled = run()
    # Tiled, four directions sum from prefix sums: the same sums, rounded differently.
    assert (tiled[0] == untiled[0]).mean() > 0.999
    np.testing.assert_allclose(tiled[1], untiled[1], rtol=0, atol=1e-5 * float(untiled[1].max()))


@pytest.mark.parametrize("tone", ["light", "medium", "dark"])
@pytest.mark.parametrize(("height", "width"), [(97, 131), (480, 640), (17, 2000)])
def test_tone_map_lut_is_exact_and_j_within_rounding(cuda, lease, rng, tone, height, width):
    luma, _ = ref.split_luma(photo(str(rng.choice(PHOTOS)), height, width))
    params = PencilParams(tone=tone, tone_gamma=float(rng.uniform(0.5, 2.0)))
    planes = cuda.luma_and_histogram(upload(luma))
    cdf, _ = cuda.fit_tone(planes, cuda.assets(lease.device), params.tone_shift)  # a preset: auto's fit, moved
    j, log_j, lut = cuda.tone(planes, cdf, params.tone_blur_size(height, width), params.tone_gamma, with_log=True)
    np.testing.assert_array_equal(
        lut.get(), ref.matching_lut(ref.histogram(luma), ref.tone_target(ref.histogram(luma), params.tone))
    )
    expected = ref.tone_map(luma, params)
    np.testing.assert_allclose(j.get(), expected, rtol=0, atol=2e-6)
    np.testing.assert_allclose(log_j.get(), np.log(np.maximum(expected, np.float32(ref.TONE_FLOOR))), rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", [*PHOTOS, "moon", "hubble_deep_field", "rocket", "random"])
def test_auto_tone_fit_matches_the_reference(cuda, lease, rng, name):
    """The fitted layer set and weights, and the matching LUT built on them: the same as
    the reference's (float64 on both sides, summed in another order)."""
    if name == "random":  # a histogram no photo has: random counts on a random range
        luma = rng.integers(int(rng.integers(0, 100)), int(rng.integers(150, 256)), (123, 77), dtype=np.uint8)
    else:
        luma, _ = ref.split_luma(photo(name, 240, 320))
    planes = cuda.luma_and_histogram(upload(luma))
    cdf, fit = cuda.fit_tone(planes, cuda.assets(lease.device))
    layer, weights = ref.fit_tone(ref.histogram(luma))
    fit = fit.get()
    assert int(fit[0]) == layer
    np.testing.assert_allclose(fit[1:], weights, rtol=0, atol=1e-9)
    expected_cdf = np.cumsum(ref.tone_target(ref.histogram(luma), "auto"))
    np.testing.assert_allclose(cdf.get(), expected_cdf, rtol=0, atol=1e-12)
    _, _, lut = cuda.tone(planes, cdf, 5, 1.0, with_log=False)
    counts = ref.histogram(luma)
    np.testing.assert_array_equal(lut.get(), ref.matching_lut(counts, ref.tone_target(counts, "auto")))


@pytest.mark.parametrize(("height", "width"), [(97, 131), (480, 640), (1, 333), (211, 1), (1080, 1920)])
def test_turned_texture_matches_the_reference(cuda, lease, rng, height, width):
    """hatching="follow": the structure tensor, the turn and the two bilinear samples (as
    OpenCV's remap) of the reference, on the device."""
    luma, _ = ref.split_luma(photo(str(rng.choice(PHOTOS)), height, width))
    params = PencilParams(hatching="follow")
    device_luma = upload(luma)
    planes = cuda.oriented_texture(device_luma, params, cuda.assets(lease.device), with_log=False)
    logs = cuda.oriented_texture(device_luma, params, cuda.assets(lease.device), with_log=True)
    assert planes.log_texture is None and logs.texture is None  # "fast" reads H, "lu" ln H
    expected = ref.oriented_texture(luma, params)
    got = planes.texture.get()
    difference = np.abs(got - expected)
    print(f"turned texture: max |diff| {difference.max():.2e}, mean {difference.mean():.2e}")
    assert difference.mean() < 1e-5 and np.mean(difference > 1e-3) < 1e-4
    np.testing.assert_allclose(logs.log_texture.get(), np.log(got), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("height", "width"), [(97, 131), (480, 640), (1, 333)])
def test_conjugate_gradient_reaches_the_reference_solution(cuda, lease, rng, height, width):
    luma, _ = ref.split_luma(photo(str(rng.choice(PHOTOS)), height, width))
    params = PencilParams(tone=str(rng.choice(["light", "medium", "dark"])))
    tone = ref.tone_map(luma, params)
    log_tone = np.log(np.maximum(tone, np.float32(ref.TONE_FLOOR)))
    log_texture = np.log(ref.texture_for(height, width))
    expected, iterations = ref.solve_beta_lu(log_texture, log_tone)

    assets = cuda.assets(lease.device)
    beta, scalars = cuda.solve_beta(upload(log_tone), assets, lease.staging("cg", 8))
    beta, scalars = beta.get(), scalars.get()
    assert np.isfinite(beta).all()
    assert abs(scalars[6] - iterations) <= max(3, 0.2 * iterations)
    drawn = np.exp(beta * log_texture)
    wanted = np.exp(expected * log_texture)
    assert np.abs(drawn - wanted).mean() < 1.5e-3
    energy, reference_energy = (
        ref.lu_energy(beta, log_texture, log_tone),
        ref.lu_energy(expected, log_texture, log_tone),
    )
    assert energy <= reference_energy * 1.01 + 1e-6


@pytest.mark.parametrize("texture", ["fast", "lu"])
@pytest.mark.parametrize("hatching", ["flat", "follow"])
@pytest.mark.parametrize(("name", "mode"), [("coffee", "color"), ("camera", "color"), ("chelsea", "gray")])
def test_merge_matches_the_reference_on_the_same_inputs(cuda, lease, rng, texture, hatching, name, mode):
    """Stages 9-10 alone (the merge kernel): the reference's S', J, beta and turned texture
    in, on both sides; the only differences left are powf / expf against NumPy's, an ulp
    that moves a pixel on a rounding edge by one grey level. A gray photo in colour mode
    repeats the drawing in R, G and B."""
    import cupy

    height, width = int(rng.integers(90, 300)), int(rng.integers(90, 300))
    image = photo(name, height, width)
    params = random_params(rng, texture=texture, hatching=hatching, mode=mode)
    luma, _ = ref.split_luma(image)
    strokes, _ = reference_strokes(luma, params)
    tone = ref.tone_map(luma, params)
    hatched = ref.oriented_texture(luma, params) if hatching == "follow" else None
    log_texture = crossed_log_texture(tone, hatched)
    beta = None
    if texture == "lu":
        beta, _ = ref.solve_beta_lu(log_texture, np.log(np.maximum(tone, np.float32(ref.TONE_FLOOR))))
    expected = reference_merge(image, params, strokes, tone, beta, hatched)

    extrema = cupy.asarray(np.array([strokes.min(), strokes.max()], np.float32).view(np.uint32))
    device_texture = cuda.assets(lease.device)
    if hatched is not None:
        device_texture = cuda.TexturePlanes(None, upload(np.log(hatched)))
    d_tone = upload(tone)
    crossed = cuda.cross_hatch(device_texture, d_tone, cuda.assets(lease.device))
    np.testing.assert_allclose(crossed.get(), log_texture, rtol=0, atol=1e-6)
    length = params.line_length(height, width)
    floor = cuda.stroke_floor(length, params.stroke_width)
    d_strokes = upload(strokes)
    means = cuda.stroke_darkness_means(d_strokes, extrema, floor, params.stroke_gamma, d_tone, length)
    got = cuda.merge(
        d_strokes,
        extrema,
        floor,
        params.stroke_gamma,
        means,
        d_tone,
        None if beta is None else upload(beta),
        crossed,
        upload(image),
        mode == "color",
    ).get()
    assert got.shape == expected.shape
    difference = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert np.ptp(expected) > 50  # a drawing, not a flat page (a light one may have little spread)
    assert difference.max() <= 1 and (difference > 0).mean() <= 1e-3, (
        f"{params}: {(difference > 0).mean():.5f} of values differ, max {difference.max()}"
    )


# -------------------------------------------------------------- end to end --


@pytest.mark.parametrize("name", PHOTOS)
@pytest.mark.parametrize(("height", "width"), [(97, 131), (1, 301), (257, 1), (480, 640), (769, 1023)])
@pytest.mark.parametrize("texture", ["fast", "lu"])
def test_render_matches_the_reference(cuda, lease, rng, name, height, width, texture):
    image = photo(name, height, width)
    params = random_params(rng, texture=texture)
    got = cuda.render_on(lease, image, params)
    assert_same_drawing(got, ref.render(image, params))


def test_defaults_on_a_large_photo(cuda, lease):
    image = photo("astronaut", 1920, 2560)
    params = PencilParams()
    assert_same_drawing(cuda.render_on(lease, image, params), ref.render(image, params))


def test_max_side_downscales_like_the_reference(cuda, lease):
    image = photo("coffee", 400, 600)
    params = PencilParams(max_side=300, mode="color")
    got = cuda.render_on(lease, image, params)
    assert got.shape == (200, 300, 3)
    assert_same_drawing(got, ref.render(image, params))


def test_concurrent_renders_equal_serial_renders_byte_for_byte(cuda, pool, rng):
    jobs = [
        (photo(PHOTOS[i % 4], int(rng.integers(200, 700)), int(rng.integers(200, 700))), random_params(rng))
        for i in range(24)
    ]
    serial = [pool.run(lambda lease, job=job: cuda.render_on(lease, *job)) for job in jobs]
    results: list[np.ndarray | None] = [None] * len(jobs)

    def work(index: int) -> None:
        results[index] = pool.run(lambda lease: cuda.render_on(lease, *jobs[index]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for got, expected in zip(results, serial, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert sum(row["leases_granted"] for row in pool.snapshot()) >= 2 * len(jobs)


def test_render_through_the_package_entry_point(cuda, pool):
    from gpu import pencil

    image = photo("chelsea", 300, 451)
    params = PencilParams(texture="fast")
    assert_same_drawing(pencil.render(image, params, "cuda", pool=pool), ref.render(image, params))


# ------------------------------------------------ every option over its range --


@pytest.mark.parametrize("hatching", OPTIONS["hatching"].choices)
@pytest.mark.parametrize("texture", OPTIONS["texture"].choices)
@pytest.mark.parametrize("tone", OPTIONS["tone"].choices)
@pytest.mark.parametrize("mode", OPTIONS["mode"].choices)
def test_every_choice_draws_as_the_reference(cuda, lease, rng, mode, tone, texture, hatching):
    """Each mode x tone x texture x hatching, the numeric options drawn over their whole
    ranges, on a photo (colour or gray) of a random size."""
    image = photo(str(rng.choice(PHOTOS)), int(rng.integers(150, 420)), int(rng.integers(150, 420)))
    params = random_params(rng, mode=mode, tone=tone, texture=texture, hatching=hatching)
    assert_same_drawing(cuda.render_on(lease, image, params), ref.render(image, params))


@pytest.mark.parametrize("stroke_width", STROKE_WIDTHS)
def test_every_stroke_width_draws_as_the_reference(cuda, lease, rng, stroke_width):
    image = photo(str(rng.choice(PHOTOS)), 360, 480)
    params = random_params(rng, stroke_width=stroke_width, line_frac=float(rng.uniform(0.02, 0.08)))
    assert_same_drawing(cuda.render_on(lease, image, params), ref.render(image, params))


@pytest.mark.parametrize(
    ("end", "height", "width", "fixed"),
    [
        pytest.param("low", 240, 320, {}, id="low-3px"),  # the shortest line: clamped to 3 px
        pytest.param("low", 1200, 1600, {"texture": "fast"}, id="low-7px"),  # 0.005 of 1200 px
        pytest.param("high", 97, 131, {}, id="high-19px"),  # a fifth of a thumbnail's side
        # 97 px lines at the widest stroke: the largest line tables a VGA photo builds
        pytest.param("high", 480, 640, {"stroke_width": WIDEST, "texture": "fast"}, id="high-97px-widest"),
    ],
)
def test_line_frac_at_its_ends_draws_as_the_reference(cuda, lease, rng, end, height, width, fixed):
    low, high = option_range("line_frac")
    params = random_params(rng, line_frac=low if end == "low" else high, **fixed)
    image = photo(str(rng.choice(PHOTOS)), height, width)
    assert_same_drawing(cuda.render_on(lease, image, params), ref.render(image, params))


@pytest.mark.parametrize("gamma", ["stroke_gamma", "tone_gamma"])
@pytest.mark.parametrize("end", ["low", "high"])
def test_gammas_at_their_ends_draw_as_the_reference(cuda, lease, rng, gamma, end):
    low, high = option_range(gamma)
    params = random_params(rng, **{gamma: low if end == "low" else high})
    image = photo(str(rng.choice(PHOTOS)), 300, 400)
    assert_same_drawing(cuda.render_on(lease, image, params), ref.render(image, params))


@pytest.mark.parametrize("max_side", [int(option_range("max_side")[0]), 1024, 2000])
def test_max_side_on_a_large_photo(cuda, lease, rng, max_side):
    """A 12 MP photo shrunk for max_side: to the smallest side allowed (16 px), and to
    1024 and 2000 px."""
    image = photo(str(rng.choice(PHOTOS)), 3024, 4032)
    params = random_params(rng, max_side=max_side, texture="fast", hatching="flat")
    got = cuda.render_on(lease, image, params)
    scale = min(1.0, max_side / 4032)
    assert got.shape[:2] == (max(1, round(3024 * scale)), round(4032 * scale))
    assert_same_drawing(got, ref.render(image, params))


def test_line_kernels_too_large_for_shared_memory_render_on_the_cpu(cuda, pool, rng, monkeypatch, caplog):
    """The fallback for line kernels the GPU passes cannot hold (a huge photo's longest
    lines): with the device's shared memory made one byte short of what the smaller of the
    two line passes (tiled, untiled) needs, cuda.render and draw_bytes raise
    LineKernelTooLarge inside the lease and draw on the reference instead, byte for byte
    its drawing."""
    from gpu import kernels
    from gpu.codec.decode import open_image
    from gpu.codec.encode import encode_image
    from gpu.pencil import draw

    image = photo(str(rng.choice(PHOTOS)), 240, 320)
    params = random_params(rng, stroke_width=WIDEST)
    with pool.lease() as lease:
        plan = cuda.assets(lease.device).line_plan(params.line_length(240, 320), params.stroke_width)
    fits = min(plan.shared_bytes(True), plan.shared_bytes(False))
    assert fits <= kernels.max_shared_bytes()  # on the real device it fits
    monkeypatch.setattr(kernels, "max_shared_bytes", lambda: fits - 1)
    expected = ref.render(image, params)
    with caplog.at_level(logging.WARNING, logger="pencil.cuda"):
        np.testing.assert_array_equal(cuda.render(image, params, pool), expected)
    assert any("rendering on the CPU" in record.getMessage() for record in caplog.records)

    data = encode_image(image, "png", 90)
    drawing = draw.draw_bytes(data, open_image(data, 1 << 30), params, "png", 90, "cuda", pool)
    assert (drawing.decoded_on, drawing.encoded_on) == ("cpu", "cpu")
    assert drawing.data == encode_image(expected, "png", 90)


# --------------------------------------------------------- explicit tone LUT --


@pytest.mark.parametrize("texture", ["fast", "lu"])
@pytest.mark.parametrize("mode", ["gray", "color"])
def test_an_explicit_tone_lut_draws_as_the_reference(cuda, lease, rng, texture, mode):
    """render_on with a tone LUT (a video's steady tone: here another photo's own LUT)
    against reference.render with the same LUT; and the photo's own LUT draws what its
    tone option draws."""
    image = photo(str(rng.choice(PHOTOS)), int(rng.integers(97, 480)), int(rng.integers(131, 640)))
    other = photo(str(rng.choice(PHOTOS)), 240, 320)
    counts = ref.histogram(ref.split_luma(other)[0])
    lut = ref.matching_lut(counts, ref.tone_target(counts, "auto"))
    params = PencilParams(texture=texture, mode=mode, tone=str(rng.choice(["auto", "medium"])))
    expected = ref.render(image, params, lut)
    assert_same_drawing(cuda.render_on(lease, image, params, tone_lut=lut), expected)
    own = ref.histogram(ref.split_luma(image)[0])
    own_lut = ref.matching_lut(own, ref.tone_target(own, params.tone))
    np.testing.assert_array_equal(
        cuda.render_on(lease, image, params, tone_lut=own_lut), cuda.render_on(lease, image, params)
    )
