"""JPEG decode and encode on the GPU (nvJPEG through nvImageCodec), on a lease's stream.

A JPEG upload crosses PCIe as its compressed bytes; the decoded pixels land in device
memory, and a JPEG answer is encoded from the drawing where it lies, so only the
compressed result comes back; both run in a fraction of the host codecs' time
(BENCHMARKS.md, "Figures behind choices in the code").

nvImageCodec (`nvidia-nvimgcodec-cu12` / `-cu13`, with the `cuda` / `cuda13` extras) is
optional: `available()` says whether it imports and has not failed the start-up round
trip of `warm()`; without it the host codecs (gpu/codec/decode.py, encode.py) do all
the work, logged once.

Each lease gets its own decoder and encoder (they are not shared between threads), made
on first use and kept by the lease; `warm(lease)` makes them at start-up.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import cupy

log = logging.getLogger("pencil.codec")

_state_lock = threading.Lock()
_stderr_lock = threading.Lock()  # file descriptor 2 is the process's: one redirection at a time
_module: Any = None
_checked = False

# Options of the nvJPEG decoder: fancy (smooth) chroma upsampling, as libjpeg-turbo
# (Pillow, OpenCV) does by default, so both paths see the same colour edges.
DECODER_OPTIONS = ":fancy_upsampling=1"
CODEC_THREADS = 1  # host threads per decoder: the server's processes already use every core


@contextmanager
def _library_chatter_to_debug_log():
    """nvImageCodec prints an [ERROR] line to stderr for each optional extension it cannot
    load (nvJPEG2000, nvTIFF: not ours to use) when it starts, once per process: those
    lines go to this module's debug log instead of alarming an operator, or to the warning
    log when the block fails (then they may say why). No redirection where no temporary
    file can be made."""
    with _stderr_lock:
        try:
            sink = tempfile.TemporaryFile()
        except OSError:
            yield
            return
        with sink:
            saved = os.dup(2)
            os.dup2(sink.fileno(), 2)
            failed = True
            try:
                yield
                failed = False
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                chatter = sink.read().decode(errors="replace").strip()
                if chatter:
                    log.log(logging.WARNING if failed else logging.DEBUG, "nvImageCodec said: %s", chatter)


def _nvimgcodec():
    """The nvidia.nvimgcodec module, or None when it is missing or broken (logged once)."""
    global _module, _checked
    with _state_lock:
        if not _checked:
            _checked = True
            try:
                with _library_chatter_to_debug_log():
                    from nvidia import nvimgcodec

                _module = nvimgcodec
                log.info("JPEG decode and encode on the GPU: nvImageCodec %s", getattr(nvimgcodec, "__version__", "?"))
            except Exception as exc:  # not installed, or its libraries do not load
                log.warning("nvImageCodec is not usable (%s): JPEG decode and encode stay on the CPU", exc)
        return _module


def available() -> bool:
    """Whether JPEGs can be decoded and encoded on the device in this process."""
    return _nvimgcodec() is not None


@dataclass
class DeviceCodecs:
    """One lease's nvImageCodec decoder and encoder, limited to its GPU backends (a JPEG
    they cannot take is decoded by our host path, not by nvImageCodec's CPU decoders)."""

    decoder: Any
    encoder: Any

    @classmethod
    def create(cls, device: int) -> DeviceCodecs:
        codec = _nvimgcodec()
        kinds = codec.BackendKind
        # The hardware JPEG engines first (A100, H100: baseline JPEGs, no host Huffman
        # decoding), then nvJPEG's CUDA decoder, then its hybrid one (progressive files).
        decoding = [codec.Backend(kind) for kind in (kinds.HW_GPU_ONLY, kinds.GPU_ONLY, kinds.HYBRID_CPU_GPU)]
        encoding = [codec.Backend(kind) for kind in (kinds.GPU_ONLY, kinds.HYBRID_CPU_GPU)]
        with _library_chatter_to_debug_log():
            decoder = codec.Decoder(
                device_id=device, max_num_cpu_threads=CODEC_THREADS, backends=decoding, options=DECODER_OPTIONS
            )
            encoder = codec.Encoder(device_id=device, max_num_cpu_threads=CODEC_THREADS, backends=encoding)
        return cls(decoder, encoder)


def codecs(lease) -> DeviceCodecs:
    """The device codecs of `lease` (a gpu.pool.Lease), made on first use."""
    return lease.resource("nvjpeg", lambda: DeviceCodecs.create(lease.device))


def warm(lease) -> None:
    """Make the lease's codecs and run one tiny decode and encode, so that the first
    request pays no library or handle set-up. A round trip that fails turns the device
    codecs off for this process (logged), rather than failing each request later."""
    global _module
    if not available():
        return
    try:
        with cupy.cuda.Device(lease.device), lease.stream:
            sample = cupy.zeros((64, 64, 3), cupy.uint8)
            sample[16:48, 16:48] = 200
            decoded = decode(lease, encode(lease, sample, 90), gray=False)
            lease.stream.synchronize()
        if decoded is None or decoded.shape != (64, 64, 3):
            raise RuntimeError(f"the round trip gave {None if decoded is None else decoded.shape}, not (64, 64, 3)")
    except Exception as exc:
        log.warning(
            "nvImageCodec failed its start-up check on device %d (%s): JPEG decode and encode stay on the CPU",
            lease.device,
            exc,
        )
        with _state_lock:
            _module = None


def decode(lease, data: bytes, gray: bool) -> cupy.ndarray | None:
    """JPEG bytes -> (H, W) uint8 luma (`gray`) or (H, W, 3) uint8 RGB on the lease's
    device, upright (EXIF orientation applied), ready in the order of `lease.stream`.
    None when the device decoders do not take this file (the caller decodes on the host,
    which also words any error)."""
    codec = _nvimgcodec()
    params = codec.DecodeParams(
        apply_exif_orientation=True, color_spec=codec.ColorSpec.GRAY if gray else codec.ColorSpec.SRGB
    )
    with cupy.cuda.Device(lease.device), lease.stream:
        try:
            image = codecs(lease).decoder.decode(codec.CodeStream(data), params=params, cuda_stream=lease.stream.ptr)
        except Exception as exc:  # nvImageCodec raises for streams it cannot parse
            log.debug("device JPEG decode refused the file: %s", exc)
            return None
        if image is None:
            return None
        # DLPack hands the buffer over in the order of the current stream (no host wait);
        # the copy into our own pool frees nvImageCodec's buffer with `image`.
        pixels = cupy.from_dlpack(image).copy()
    channels = 1 if gray else 3
    if pixels.ndim != 3 or pixels.shape[2] != channels:
        return None
    return pixels[:, :, 0] if gray else pixels


def encode(lease, image: cupy.ndarray, quality: int) -> bytes:
    """(H, W) uint8 gray or (H, W, 3) uint8 RGB on the lease's device -> JPEG bytes at
    `quality` (1..100, the IJG scale as OpenCV's), chroma 4:2:0 as OpenCV's default.
    The image must be ready in the order of `lease.stream`."""
    codec = _nvimgcodec()
    gray = image.ndim == 2
    subsampling = codec.ChromaSubsampling.CSS_GRAY if gray else codec.ChromaSubsampling.CSS_420
    params = codec.EncodeParams(
        quality_type=codec.QualityType.QUALITY, quality_value=float(quality), chroma_subsampling=subsampling
    )
    with cupy.cuda.Device(lease.device), lease.stream:
        image = cupy.ascontiguousarray(image)
        source = codec.as_image(image[:, :, None] if gray else image, cuda_stream=lease.stream.ptr)
        stream = codecs(lease).encoder.encode(source, "jpeg", params=params, cuda_stream=lease.stream.ptr)
    if stream is None:
        raise RuntimeError(f"nvImageCodec could not encode a {image.shape} image as JPEG")
    return bytes(stream)
