"""Where one request's time goes inside the server's render job (X-Render-Ms), phase by
phase, on one idle GPU lease: host decode, device decode, render, device or host encode.

    python bench/draw_phases.py [--sizes 1920x1080,1000x872] [--repeats 20]

Medians over `repeats` after a warm-up, real photographs (scikit-image's astronaut, coffee),
for JPEG -> JPEG and PNG -> PNG, textures lu and fast. CUDA only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy
import cv2
import skimage.data

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import median_ms

from gpu.codec import nvjpeg
from gpu.codec.decode import open_image
from gpu.codec.encode import encode_image
from gpu.pencil import cuda, draw_bytes, warm_up
from gpu.pencil.draw import host_pixels
from gpu.pencil.params import PencilParams
from gpu.pool import DevicePool

MAX_PIXELS = 50_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1920x1080,1000x872")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", type=int, default=0, help="the CUDA device to time [0]")
    args = parser.parse_args()
    pool = DevicePool([args.device], streams_per_device=1)
    warm_up("cuda", pool)
    lease = pool.leases()[0]
    print(
        f"# phases of one request on an idle lease of device {args.device}, median of {args.repeats} ms; "
        f"nvImageCodec: {nvjpeg.available()}"
    )
    print(
        "| size | texture | in -> out | host decode | device decode | render | download | host encode "
        "| device encode | draw_bytes total |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        width, height = (int(v) for v in size.split("x"))
        image = cv2.resize(skimage.data.astronaut(), (width, height), interpolation=cv2.INTER_CUBIC)
        jpeg = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
        png = cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))[1].tobytes()
        for texture in ("lu", "fast"):
            params = PencilParams(texture=texture)
            for label, data, fmt in (("jpeg -> jpeg", jpeg, "jpeg"), ("png -> png", png, "png")):
                host_decode = median_ms(
                    lambda data=data, params=params: host_pixels(data, open_image(data, MAX_PIXELS), params),
                    args.repeats,
                )
                device_decode = render = download = host_encode = device_encode = float("nan")
                with cupy.cuda.Device(lease.device), lease.stream:
                    d_image = cuda.upload(lease, host_pixels(data, open_image(data, MAX_PIXELS), params))
                    out = cuda.render_device(lease, d_image, params)

                    def synced(work):
                        def run():
                            result = work()
                            lease.stream.synchronize()
                            return result

                        return run

                    if fmt == "jpeg" and nvjpeg.available():
                        device_decode = median_ms(
                            synced(lambda data=data: nvjpeg.decode(lease, data, gray=False)), args.repeats
                        )
                        device_encode = median_ms(synced(lambda out=out: nvjpeg.encode(lease, out, 90)), args.repeats)
                    render = median_ms(
                        synced(lambda d_image=d_image, params=params: cuda.render_device(lease, d_image, params)),
                        args.repeats,
                    )
                    download = median_ms(lambda out=out: cuda.download(lease, out), args.repeats)
                host = cuda.download(lease, out)
                host_encode = median_ms(lambda host=host, fmt=fmt: encode_image(host, fmt, 90), args.repeats)
                total = median_ms(
                    lambda data=data, params=params, fmt=fmt: draw_bytes(
                        data, open_image(data, MAX_PIXELS), params, fmt, 90, "cuda", pool
                    ),
                    args.repeats,
                )
                print(
                    f"| {size} | {texture} | {label} | {host_decode:.1f} | {device_decode:.2f} | {render:.2f} "
                    f"| {download:.2f} | {host_encode:.1f} | {device_encode:.2f} | {total:.1f} |"
                )


if __name__ == "__main__":
    main()
