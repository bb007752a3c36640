"""Benchmark of the stencil job's nine CUDA variants, with the roofline and the CuPy anchor
measured in the same run, and the job's own path (cuda.simulate) with each boundary.

    python bench/stencil.py [--shapes 1024x256x256,2048x256x256,4096x256x256,7168x256x256,512x512x512]
                            [--variants all] [--seconds 1.0] [--zchunk N] [--no-energy] [--check-steps 4]
                            [--boundary none|sponge|cpml] [--width 20] [--sponge W]
                            [--job-boundaries none,sponge,cpml] [--job-steps 200] [--no-kernels]

Shapes are nx x ny x nz (x fastest, as the job's grids; the paper's 1024 .. 7168 x 256 x
256 and 512^3). Per shape, on GPU 0, fp32, no sponge (unless --sponge), random fields in a constant model:

- roofline: a device-to-device copy (cudaMemcpyAsync of 2 GiB) gives the bandwidth B
  (bytes read + written per second); a step needs at least 16 bytes a point (p, p_prev
  and c read, p_next written), so no variant beats B / 16 points per second.
- each variant: back-to-back steps on one stream for about --seconds (CUDA events), with
  NVML energy over the same window: ms/step, GPts/s (interior points updated per second),
  effective GB/s (16 B x GPts/s), % of the roofline, x the anchor, average W, GPts/J; for
  the z-marching variants the blocks' plan (cuda.march_plan: whole-column waves, then
  chunks; --zchunk N: N planes a block everywhere). Before the table: each kernel's
  registers and blocks per SM (the plans and the predictions depend on them).
- --boundary sponge|cpml (--width W cells, default 20; --sponge W is --boundary sponge
  --width W): the kernels with the sponge's damping term, or the CPML's step (cpml_shell
  on the layers' shell and the variant on the inner box, timed together: one step).
All of the above is kernel-only: bare launches on resident buffers, no source, receivers
or snapshots. Then, per shape and boundary of --job-boundaries:
- job path: gpu.stencil.cuda.simulate, what the job runs: the default receivers (every
  interior x on the source's line), the Ricker source, 4 snapshots, the boundary (--width
  cells), `auto`'s variant (its trial not timed, as in the job), --job-steps steps from
  rest: GPts/s from the stepping loop's GPU time (the job's `seconds`: kernels, receiver
  gathers, snapshot copies) and from its wall time, and each boundary's GPts/s against
  the run without one.
- anchor: the same step written with CuPy slicing (gpu/stencil/reference.py's Propagator on
  CuPy arrays: ~25 elementwise kernels, each a full pass over memory).
- check: every variant's field after --check-steps steps from the same start, against the
  anchor's (they round alike: expect 0).
- auto: what the job's `auto` trial (gpu/stencil/cuda.py: time_variants) picks here.
Times drift between machines and clocks: read the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy

from gpu.stencil import cuda, reference
from gpu.stencil.energy import EnergyMeter
from gpu.stencil.params import RADIUS, VARIANTS, ConstantModel, StencilParams

BOUNDARIES = ("none", "sponge", "cpml")

BYTES_PER_POINT = 16
SHAPES = "1024x256x256,2048x256x256,4096x256x256,7168x256x256,512x512x512"
CFL = 0.4


def copy_bandwidth(nbytes: int = 2 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting the read and the write."""
    src = cupy.ones(nbytes // 4, np.float32)
    dst = cupy.empty_like(src)
    stream = cupy.cuda.get_current_stream()
    times = []
    for i in range(repeats + 2):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        cupy.cuda.runtime.memcpyAsync(
            dst.data.ptr, src.data.ptr, nbytes, cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr
        )
        stop.record()
        stop.synchronize()
        if i >= 2:
            times.append(cupy.cuda.get_elapsed_time(start, stop) / 1000)
    del src, dst
    cupy.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / statistics.median(times)


def peak_bandwidth() -> float | None:
    """The memory's nominal bandwidth from the device attributes, bytes/s (DDR: x2), or
    None where the runtime no longer reports the memory clock."""
    try:
        attributes = cupy.cuda.Device().attributes
        return 2 * attributes["MemoryClockRate"] * 1e3 * attributes["GlobalMemoryBusWidth"] / 8
    except Exception:  # attribute missing or refused: the copy is what counts anyway
        return None


class Grid:
    """The buffers of one shape: p, pp (ping-pong), c, and the start (p0, pp0) every run
    begins from. Interior fields random, border 0, c = CFL^2 inside."""

    def __init__(self, nx: int, ny: int, nz: int, zchunk: int | None, sponge: int = 0, cpml: int = 0):
        self.shape = (nz, ny, nx)
        self.params = StencilParams(
            nx=nx,
            ny=ny,
            nz=nz,
            h=10.0,
            steps=1,
            f0=10.0,
            model=ConstantModel(2000.0),
            dt=CFL * 10.0 / 2000.0,
            snapshot_every=0,
            receivers=[(RADIUS,) * 3],
            sponge=sponge,
            cpml=cpml,
        )
        self.cpml = cuda.CpmlBuffers.of(self.params)
        self.eta_max = float(np.float32(self.params.eta_max))
        self.points = nx * ny * nz
        self.interior = self.params.interior_points
        self.zchunk = zchunk  # None: each z-marching variant's plan
        inner = (slice(RADIUS, -RADIUS),) * 3
        self.c = cupy.zeros(self.shape, np.float32)
        self.c[inner] = np.float32(CFL**2)
        self.c = self.c.ravel()
        generator = cupy.random.default_rng(1)
        self.p0 = cupy.zeros(self.shape, np.float32)
        self.pp0 = cupy.zeros(self.shape, np.float32)
        self.p0[inner] = generator.standard_normal(tuple(n - 2 * RADIUS for n in self.shape), dtype=np.float32)
        self.pp0[inner] = self.p0[inner] * np.float32(0.999)
        self.p0, self.pp0 = self.p0.ravel(), self.pp0.ravel()
        self.p = self.p0.copy()
        self.pp = self.pp0.copy()

    def reset(self) -> None:
        self.p[...] = self.p0
        self.pp[...] = self.pp0
        if self.cpml is not None:
            self.cpml.reset()

    def launch(self, variant: str, amp: float = 0.0) -> None:
        """One step without the swap (timing; the trial of `auto` calls this)."""
        cuda.launch(
            variant,
            self.p,
            self.pp,
            self.c,
            self.shape,
            self.params.source,
            amp,
            self.params.sponge,
            self.eta_max,
            self.zchunk,
            self.cpml,
        )

    def step(self, variant: str) -> None:
        self.launch(variant)
        self.p, self.pp = self.pp, self.p


def timed(run_step, seconds: float, energy: bool) -> tuple[float, float | None, float | None]:
    """(ms per step, joules, average watts) of back-to-back steps for about `seconds`."""
    for _ in range(3):
        run_step()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(5):
        run_step()
    stop.record()
    stop.synchronize()
    per_step = cupy.cuda.get_elapsed_time(start, stop) / 5
    steps = max(10, int(seconds * 1000 / max(per_step, 1e-3)))
    meter = EnergyMeter(cupy.cuda.Device().pci_bus_id) if energy else None
    if meter is not None:
        meter.start()
    start.record()
    for _ in range(steps):
        run_step()
    stop.record()
    stop.synchronize()
    reading = meter.stop() if meter is not None else None
    ms = cupy.cuda.get_elapsed_time(start, stop) / steps
    if reading is None or reading.joules is None:
        return ms, None, None
    return ms, reading.joules / steps, reading.average_watts


def anchor_for(grid: Grid) -> reference.Propagator:
    prop = reference.Propagator(grid.params, xp=cupy, c=grid.c)  # with the grid's sponge or CPML, if any
    prop.amplitudes[:] = 0
    return prop


def restart(anchor: reference.Propagator, grid: Grid) -> None:
    """The anchor back at the grid's start (fields, and the CPML's psi and zeta zeroed)."""
    anchor.p[...] = grid.p0
    anchor.pp[...] = grid.pp0
    if anchor.cpml is not None:
        for array in (*anchor.cpml.psi, *anchor.cpml.zeta):
            array.fill(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="nx x ny x nz, comma-separated")
    parser.add_argument("--variants", default="all", help="comma-separated variant names, or all")
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="timed window per variant (energy needs ~0.5 s or more)"
    )
    parser.add_argument(
        "--zchunk",
        type=int,
        default=None,
        help="planes per thread of the z-marching variants (default: as the job chooses)",
    )
    parser.add_argument("--check-steps", type=int, default=4, help="steps compared against the anchor (0: no check)")
    parser.add_argument("--no-energy", action="store_true")
    parser.add_argument("--boundary", choices=BOUNDARIES, default="none", help="the kernels' boundary (kernel-only)")
    parser.add_argument("--width", type=int, default=20, help="cells of the sponge or the CPML")
    parser.add_argument("--sponge", type=int, default=0, help="older form of --boundary sponge --width W")
    parser.add_argument(
        "--job-boundaries",
        default="none,sponge,cpml",
        help="boundaries of the job-path rows (comma-separated; '' none)",
    )
    parser.add_argument("--job-steps", type=int, default=200, help="steps of each job-path run")
    parser.add_argument("--no-kernels", action="store_true", help="only the job-path rows")
    args = parser.parse_args()
    if args.sponge:
        args.boundary, args.width = "sponge", args.sponge
    variants = VARIANTS if args.variants == "all" else tuple(args.variants.split(","))
    for variant in variants:
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant}; choose from {', '.join(VARIANTS)}")
    job_boundaries = [b for b in args.job_boundaries.split(",") if b]
    for boundary in job_boundaries:
        if boundary not in BOUNDARIES:
            parser.error(f"unknown boundary {boundary}; choose from {', '.join(BOUNDARIES)}")
    widths = layer_widths(args.boundary, args.width)
    energy = not args.no_energy
    properties = cupy.cuda.runtime.getDeviceProperties(0)
    copy = copy_bandwidth()
    ceiling = copy / BYTES_PER_POINT / 1e9
    print(
        f"# stencil benchmark: {properties['name'].decode()}, {properties['multiProcessorCount']} SMs, CuPy "
        f"{cupy.__version__}, fp32, 13-point 4th-order, {args.seconds:g} s per variant"
    )
    nominal = peak_bandwidth()
    print(
        f"# memory: nominal {f'{nominal / 1e9:.0f}' if nominal else 'n/a'} GB/s; measured D2D copy "
        f"{copy / 1e9:.0f} GB/s (read + write) -> roofline {ceiling:.1f} GPts/s at {BYTES_PER_POINT} B/pt/step"
    )
    shapes = args.shapes.split(",")
    if not args.no_kernels:
        kernel_tables(args, shapes, variants, widths, energy, ceiling)
    if job_boundaries:
        job_table(shapes, job_boundaries, args.width, args.job_steps)


def layer_widths(boundary: str, width: int) -> dict[str, int]:
    """StencilParams' sponge and cpml widths for a boundary."""
    return {"sponge": width if boundary == "sponge" else 0, "cpml": width if boundary == "cpml" else 0}


def kernel_tables(args, shapes, variants, widths: dict[str, int], energy: bool, ceiling: float) -> None:
    """The kernel-only rows: bare launches of every variant, the anchor, auto's trial."""
    if energy:
        probe = EnergyMeter(cupy.cuda.Device().pci_bus_id)
        probe.start()
        time.sleep(0.05)
        reading = probe.stop()
        print(f"# energy: {reading.method or 'none'}{' (' + reading.note + ')' if reading.note else ''}")
    else:
        print("# energy: not measured (--no-energy)")
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    names = [cuda.kernel_name(variant, widths["sponge"]) for variant in variants]
    if widths["cpml"]:
        names.append("cpml_shell")
    for name in names:
        kernel = cuda._k(name)
        print(
            f"# kernel {name}: {kernel.num_regs} registers, {kernel.shared_size_bytes} B shared, "
            f"{kernel.local_size_bytes} B local, {cuda.resident_blocks(name) // sms} blocks of 256 per SM"
        )
    layer = next((f"{kind} {w} cells" for kind, w in widths.items() if w), "none")
    print(f"# kernel-only (bare launches; no source, receivers or snapshots); boundary: {layer}")
    print(
        "shape | variant | plan | ms/step | GPts/s | eff. GB/s | % roofline | x anchor | W | GPts/J | "
        "max |diff| vs anchor"
    )
    for text in shapes:
        bench_shape(text, variants, args, energy, ceiling, widths)
        cupy.get_default_memory_pool().free_all_blocks()


class BenchLease:
    """What cuda.simulate needs of a gpu.pool.Lease: device 0 and a stream of its own."""

    def __init__(self) -> None:
        self.device = 0
        self.stream = cupy.cuda.Stream(non_blocking=True)


def job_table(shapes: list[str], boundaries: list[str], width: int, steps: int) -> None:
    """The job path: cuda.simulate (auto's variant, receivers, snapshots, source, the
    boundary) from rest, per shape and boundary, GPts/s against the run without a layer."""
    print(
        f"# job path (gpu.stencil.cuda.simulate: auto's variant, Ricker source, default receivers, 4 snapshots, "
        f"{steps} steps from rest; GPU s = the job's `seconds`)"
    )
    print("shape | boundary | variant | receivers | GPU s | wall s | GPts/s (GPU) | GPts/s (wall) | vs none")
    lease = BenchLease()
    for text in shapes:
        nx, ny, nz = (int(v) for v in text.lower().split("x"))
        baseline = None
        for boundary in boundaries:
            params = StencilParams(
                nx=nx,
                ny=ny,
                nz=nz,
                h=10.0,
                steps=steps,
                f0=8.0,
                model=ConstantModel(2000.0),
                **layer_widths(boundary, min(width, (min(nx, ny, nz) - 2 * RADIUS) // 2)),
            )
            cuda.simulate(lease, params, variant="auto", measure_energy=False)  # auto's trial, compiled kernels
            run = cuda.simulate(lease, params, variant="auto", measure_energy=False)
            updates = params.interior_points * steps
            gpts, wall = updates / run.kernel_seconds / 1e9, updates / run.wall_seconds / 1e9
            if boundary == "none":
                baseline = gpts
            versus = f"{100 * (gpts / baseline - 1):+.1f}%" if baseline else "-"
            layer = f"{boundary} {params.boundary_width}" if params.boundary_width else boundary
            print(
                f"{text} | {layer} | {run.variant} | {len(params.receivers)} | {run.kernel_seconds:.3f} | "
                f"{run.wall_seconds:.3f} | {gpts:.1f} | {wall:.1f} | {versus}"
            )
            del run
            cupy.get_default_memory_pool().free_all_blocks()


def bench_shape(
    text: str, variants: tuple[str, ...], args: argparse.Namespace, energy: bool, ceiling: float, widths: dict[str, int]
) -> None:
    """One shape: the anchor, each variant, the check against the anchor, auto's pick."""
    nx, ny, nz = (int(v) for v in text.lower().split("x"))
    grid = Grid(nx, ny, nz, args.zchunk, **widths)
    anchor = anchor_for(grid)
    restart(anchor, grid)
    anchor_ms, anchor_j, anchor_w = timed(lambda a=anchor: a.step(0), args.seconds, energy)
    expected = None
    if args.check_steps:
        restart(anchor, grid)
        for _ in range(args.check_steps):
            anchor.step(0)
        expected = anchor.p.copy()
    del anchor
    cupy.get_default_memory_pool().free_all_blocks()

    def row(variant: str, plan: str, ms: float, joules: float | None, watts: float | None, diff: str) -> None:
        gpts = grid.interior / ms / 1e6
        per_joule = f"{grid.interior / joules / 1e9:.2f}" if joules else "-"
        print(
            f"{text} | {variant} | {plan} | {ms:.3f} | {gpts:.1f} | {gpts * BYTES_PER_POINT:.0f} | "
            f"{100 * gpts / ceiling:.1f} | {anchor_ms / ms:.2f} | {f'{watts:.0f}' if watts else '-'} | "
            f"{per_joule} | {diff}"
        )

    row("cupy-slicing anchor", "-", anchor_ms, anchor_j, anchor_w, "-")
    results = {}
    for variant in variants:
        diff = "-"
        if expected is not None:
            grid.reset()
            for _ in range(args.check_steps):
                grid.step(variant)
            diff = f"{float(cupy.abs(grid.p - expected).max()):.3g}"
        grid.reset()
        ms, joules, watts = timed(lambda v=variant: grid.step(v), args.seconds, energy)
        results[variant] = ms
        plan = cuda.march_plan(variant, grid.shape, grid.zchunk, widths["sponge"], widths["cpml"])
        row(variant, plan.describe() if plan else "-", ms, joules, watts, diff)
    grid.reset()
    trial = cuda.time_variants(grid, variants)
    best = min(results, key=results.get)
    picked = min(trial, key=trial.get)
    best_gpts = grid.interior / results[best] / 1e6
    verdict = (
        "the same" if picked == best else f"{100 * (results[picked] / results[best] - 1):.1f}% slower in the long run"
    )
    print(
        f"# {text}: best {best} {best_gpts:.1f} GPts/s = {100 * best_gpts / ceiling:.0f}% of the roofline, "
        f"{anchor_ms / results[best]:.1f}x the CuPy anchor; auto's trial picks {picked} ({verdict})"
    )


if __name__ == "__main__":
    main()
