"""Benchmark of the PNG encoder (gpu/codec/png.py, issue 18) against its anchors, on one core.

    python bench/png.py [--repeats 30] [--cpu 0] [--cache /tmp/pencil-png-drawings] [--sweep]

Inputs: pencil drawings at 1920x1080 made by the CPU backend (gpu.pencil.reference) from
scikit-image's astronaut, coffee, chelsea and rocket resized with INTER_CUBIC: gray with
texture lu (the default) and fast, and mode=color (RGB). Rendered once and cached as .npy.

For each drawing: median wall time over --repeats runs (after one warm-up) and bytes of
- ours: gpu.codec.png.encode_png (its default filter and level),
- cv2 default: cv2.imencode(".png", img) with no flags,
- cv2 level 3: IMWRITE_PNG_COMPRESSION 3, the service's encoder before issue 18,
- Pillow: Image.save(format="PNG") with its defaults,
then ours / anchor for time and size. The cv2 anchors get BGR arrays converted beforehand
(the conversion is not timed). Every PNG of ours is decoded by cv2 and compared.

--sweep also times the design space: every filter of gpu.codec.png times each deflate
library and level installed (python-isal, zlib-ng, libdeflate via `deflate`, zlib), filter
(in strips, as encode_png does it) and one-shot deflate of the whole timed apart; a row
gives the mean over the drawings of (filter + deflate) ms and the range of the size ratio
(zlib stream + 57 bytes of PNG container, over cv2 level 3).

One core: the process pins itself to --cpu (as `taskset -c`) and sets OpenCV to one
thread; ISA-L, zlib-ng, libdeflate, zlib and NumPy's elementwise ops run on one thread.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import median_ms

from gpu.codec import png

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
VARIANTS = {"gray-lu": {}, "gray-fast": {"texture": "fast"}, "color": {"mode": "color"}}
SIZE = (1920, 1080)  # width, height
CONTAINER_BYTES = 57  # signature, IHDR, one IDAT's header and CRC, IEND


def drawings(cache: Path) -> dict[str, np.ndarray]:
    """name -> (1080, 1920) uint8 gray or (1080, 1920, 3) uint8 RGB drawing."""
    import skimage.data

    from gpu.pencil import reference
    from gpu.pencil.params import PencilParams

    cache.mkdir(parents=True, exist_ok=True)
    result = {}
    for photo_name in PHOTOS:
        photo = None
        for variant, options in VARIANTS.items():
            path = cache / f"{photo_name}_{variant}_{SIZE[0]}x{SIZE[1]}.npy"
            if not path.exists():
                if photo is None:
                    photo = cv2.resize(getattr(skimage.data, photo_name)(), SIZE, interpolation=cv2.INTER_CUBIC)
                np.save(path, reference.render(photo, PencilParams(**options)))
            result[f"{photo_name} {variant}"] = np.load(path)
    return result


def cv2_png(image: np.ndarray, flags: list[int]) -> bytes:
    ok, buffer = cv2.imencode(".png", image, flags)
    assert ok
    return buffer.tobytes()


def pillow_png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def compare(images: dict[str, np.ndarray], repeats: int) -> None:
    encoders = {
        "ours": lambda img, bgr: png.encode_png(img),
        "cv2 default": lambda img, bgr: cv2_png(bgr, []),
        "cv2 level 3": lambda img, bgr: cv2_png(bgr, [cv2.IMWRITE_PNG_COMPRESSION, 3]),
        "Pillow": lambda img, bgr: pillow_png(img),
    }
    anchors = [name for name in encoders if name != "ours"]
    print(
        f"{'drawing':18s}"
        + "".join(f" | {name:>17s}" for name in encoders)
        + "".join(f" | ours/{name:<11s}" for name in anchors)
    )
    print(
        f"{'':18s}"
        + " | {:>6s} {:>10s}".format("ms", "bytes") * len(encoders)
        + " | {:>5s} {:>5s}".format("time", "size") * len(anchors)
    )
    for name, image in images.items():
        bgr = cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if image.ndim == 3 else image
        figures = {}
        for encoder, encode in encoders.items():
            data = encode(image, bgr)
            figures[encoder] = (
                median_ms(lambda encode=encode, image=image, bgr=bgr: encode(image, bgr), repeats),
                len(data),
            )
        decoded = cv2.imdecode(np.frombuffer(png.encode_png(image), np.uint8), cv2.IMREAD_UNCHANGED)
        assert np.array_equal(decoded, bgr), f"{name}: our PNG does not decode to the drawing"
        ours_ms, ours_bytes = figures["ours"]
        line = f"{name:18s}" + "".join(f" | {ms:6.2f} {size:10d}" for ms, size in figures.values())
        line += "".join(f" | {ours_ms / figures[a][0]:5.2f} {ours_bytes / figures[a][1]:5.3f}" for a in anchors)
        print(line, flush=True)


def deflaters() -> dict[str, Callable[[np.ndarray], bytes]]:
    """name -> (uint8 array -> zlib stream), for each library installed."""
    import zlib

    from isal import isal_zlib

    result: dict[str, Callable[[np.ndarray], bytes]] = {
        f"isal {level}": (lambda d, level=level: isal_zlib.compress(d, level)) for level in range(4)
    }
    try:
        from zlib_ng import zlib_ng
    except ImportError:
        pass
    else:

        def zng_strategy(strategy: int) -> Callable[[np.ndarray], bytes]:
            def compress(data: np.ndarray) -> bytes:
                stream = zlib_ng.compressobj(1, zlib_ng.DEFLATED, 15, 9, strategy)
                return stream.compress(data) + stream.flush()

            return compress

        result.update({f"zlib-ng {level}": (lambda d, level=level: zlib_ng.compress(d, level)) for level in (1, 2, 3)})
        result["zlib-ng huffman"] = zng_strategy(zlib_ng.Z_HUFFMAN_ONLY)
        result["zlib-ng rle"] = zng_strategy(zlib_ng.Z_RLE)
    try:
        import deflate
    except ImportError:
        pass
    else:
        result.update(
            {f"libdeflate {level}": (lambda d, level=level: deflate.zlib_compress(d, level)) for level in (1, 2, 4)}
        )
    result["zlib 1"] = lambda d: zlib.compress(d, 1)
    return result


def sweep(images: dict[str, np.ndarray], repeats: int) -> None:
    compressors = deflaters()
    for kind in ("gray", "color"):
        group = {name: image for name, image in images.items() if ("color" in name) == (kind == "color")}
        reference_bytes = {
            name: len(
                cv2_png(
                    cv2.cvtColor(img, cv2.COLOR_RGB2BGR) if img.ndim == 3 else img, [cv2.IMWRITE_PNG_COMPRESSION, 3]
                )
            )
            for name, img in group.items()
        }
        print(
            f"\n{kind}: {len(group)} drawings; ms = mean over them of median(filter) + median(deflate); size / "
            "cv2 level 3: min .. max"
        )
        print(f"{'filter':8s} {'filter ms':>9s}" + "".join(f" | {name:>16s}" for name in compressors))
        for row_filter in png.FILTER_TYPES:
            filter_ms, total_ms, ratios = [], {c: [] for c in compressors}, {c: [] for c in compressors}
            for name, image in group.items():
                rows = np.concatenate(list(png.filtered_strips(image, row_filter)))
                filter_ms.append(
                    median_ms(
                        lambda image=image, row_filter=row_filter: list(png.filtered_strips(image, row_filter)), repeats
                    )
                )
                for compressor, compress in compressors.items():
                    total_ms[compressor].append(
                        filter_ms[-1] + median_ms(lambda compress=compress, rows=rows: compress(rows), repeats)
                    )
                    ratios[compressor].append((len(compress(rows)) + CONTAINER_BYTES) / reference_bytes[name])
            line = f"{row_filter:8s} {statistics.mean(filter_ms):9.2f}"
            line += "".join(
                f" | {statistics.mean(total_ms[c]):5.1f} {min(ratios[c]):.2f}..{max(ratios[c]):.2f}"
                for c in compressors
            )
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed runs per figure")
    parser.add_argument("--cpu", type=int, default=0, help="the core to pin the process to")
    parser.add_argument(
        "--cache", type=Path, default=Path("/tmp/pencil-png-drawings"), help="folder of the rendered drawings"
    )
    parser.add_argument("--sweep", action="store_true", help="also time every filter x deflate library x level")
    args = parser.parse_args()

    images = drawings(args.cache)  # rendering may use every core; timing does not
    os.sched_setaffinity(0, {args.cpu})
    cv2.setNumThreads(1)
    print(
        f"{platform.processor() or platform.machine()}, pinned to cpu {args.cpu}; OpenCV {cv2.__version__}; "
        f"median of {args.repeats} runs"
    )
    compare(images, args.repeats)
    if args.sweep:
        sweep(images, args.repeats)


if __name__ == "__main__":
    main()
