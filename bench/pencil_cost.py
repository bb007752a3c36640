"""GPU time of one drawing per mode, for the code of a checkout: what a change to the
pipeline costs on the device (issue 38: the new default within +0.3 ms at 1080p).

    python bench/pencil_cost.py [--tree DIR] [--size 1920x1080] [--repeats 50] [--rounds 3]
    python bench/pencil_cost.py --stages "fast flat" [--tree DIR]          # where one mode's time goes

--tree: the root of the checkout whose gpu/ package is timed (default: this one); run it
once for the old tree and once for the new, in separate processes, so that each gets its
own kernels. The photo is scikit-image's astronaut, resized (cubic) to --size. Each mode
is timed with CUDA events around gpu.pencil.cuda.render_device on a lease of the default
pool (device arrays in and out, decode and encode excluded), median of --repeats after a
warm-up, in --rounds rounds over the modes in turn; the table gives each mode's median
over the rounds and the spread of the rounds. --stages MODE: that mode's stages instead,
each branch on one stream (render_device's `serial` marks), median ms of --repeats per
stage (their sum exceeds the two-stream render's time by the overlap).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = {
    "lu flat": {"texture": "lu", "hatching": "flat"},
    "lu follow": {"texture": "lu", "hatching": "follow"},
    "fast flat": {"texture": "fast", "hatching": "flat"},
    "fast follow": {"texture": "fast", "hatching": "follow"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=HERE.parent, help="checkout whose gpu/ is timed")
    parser.add_argument("--size", default="1920x1080", help="WxH of the drawing")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stages", choices=list(MODES), default=None, help="time this mode's stages instead")
    args = parser.parse_args()
    sys.path[:0] = [str(args.tree.resolve()), str(HERE)]

    import cupy
    import cv2
    import skimage.data
    from timing import device_median_ms

    from gpu.pencil import cuda
    from gpu.pencil.params import PencilParams
    from gpu.pool import default_pool

    width, height = (int(v) for v in args.size.split("x"))
    image = cv2.resize(skimage.data.astronaut(), (width, height), interpolation=cv2.INTER_CUBIC)

    def measure(lease) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {name: [] for name in MODES}
        with cupy.cuda.Device(lease.device), lease.stream:
            d_image = cupy.asarray(image)
            for _ in range(args.rounds):
                for name, options in MODES.items():
                    params = PencilParams(**options)
                    draw = lambda params=params: cuda.render_device(lease, d_image, params)  # noqa: E731
                    times[name].append(device_median_ms(draw, args.repeats))
        return times

    def measure_stages(lease) -> dict[str, list[float]]:
        params = PencilParams(**MODES[args.stages])
        stages: dict[str, list[float]] = {}
        with cupy.cuda.Device(lease.device), lease.stream:
            d_image = cupy.asarray(image)
            for repeat in range(args.repeats + 1):
                marks: list = []
                cuda.render_device(lease, d_image, params, marks=marks, serial=True)
                marks[-1][1].synchronize()
                if repeat:  # the first is the warm-up
                    for (_, start), (name, stop) in zip(marks, marks[1:], strict=False):
                        stages.setdefault(name, []).append(cupy.cuda.get_elapsed_time(start, stop))
        return stages

    if args.stages:
        stages = default_pool().run(measure_stages)
        print(f"tree {args.tree.resolve()}: {args.stages}, {width}x{height}, stages on one stream, ms")
        print("| stage | ms |")
        print("|---|---|")
        for name, values in stages.items():
            print(f"| {name} | {statistics.median(values):.3f} |")
        print(f"| sum | {sum(statistics.median(v) for v in stages.values()):.3f} |")
        return
    times = default_pool().run(measure)
    print(f"tree {args.tree.resolve()}: GPU time of one {width}x{height} drawing, ms")
    print(f"(median of {args.repeats} after a warm-up, {args.rounds} rounds)")
    print("| mode | ms | rounds |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.3f} | {' '.join(f'{v:.3f}' for v in values)} |")


if __name__ == "__main__":
    main()
