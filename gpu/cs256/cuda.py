"""CS256 SpMV and SpMM on the GPU: the kernels of cs256.cu launched through CuPy on the
current device and stream (a job runs them inside its lease's device and stream).

`make_plan` picks the kernel and its launch for a matrix and a number of vectors; `spmm`
(and `spmv`, the same for one vector) runs it. The matrix must be a CS256 with CuPy arrays
(`CS256.to_device()`); x is in the matrix's storage dtype (bfloat16: uint16 patterns),
shape (n,) or (n, k) with k <= 16; y comes back in that dtype, (m,) or (m, k).

Variants:
- "group" (default): G lanes per row split the row's W-entry chunks round-robin, each lane
  streaming its chunks through a ring of registers (loads always in flight while it
  computes), x (or slices of it) in shared memory, 512-thread blocks striding over the rows;
  K = 1, 2, 4, 8 or 16 vectors per launch (other k are padded with zero vectors).
- "split4": the appendix kernel as written (4 threads per row, one tile of each group of
  four each), one vector only.

Importing this module needs CuPy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cupy
import numpy as np

from gpu import kernels
from gpu.cs256.format import CS256, STORAGE, CS256Error
from gpu.cs256.reference import MAX_VECTORS

SOURCE = Path(__file__).with_name("cs256.cu")
GROUP_BLOCK = 512  # mirrored from cs256.cu
SPLIT4_BLOCK, SPLIT4_ROWS = 256, 64
K_SIZES = (1, 2, 4, 8, 16)  # vectors per launch the kernels are built for
CHUNKS = (4, 8)  # entries per vector load of the group kernel
LANES = (1, 2, 4, 8, 16, 32)
VARIANTS = ("group", "split4")
SHARED_BUDGET = 64 * 1024  # x held in shared memory per block before it is cut into slices
RING = 2  # chunks each lane keeps in flight (cs256.cu's R, but for 16 float32 vectors)
FILL = 1.6  # default lanes: the rows' groups should cover this multiple of the resident threads
TAGS = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


@dataclass(frozen=True)
class Plan:
    """A kernel and its launch. chunk: entries per vector load (W); lanes: threads per row
    (G); slice_tiles: tiles of x in shared memory at once (>= T: all of x); k: vectors asked
    for, k_padded: vectors the kernel computes."""

    variant: str
    kernel: str
    block: int
    grid: int
    shared_bytes: int
    chunk: int
    lanes: int
    slice_tiles: int
    k: int
    k_padded: int
    blocks_per_sm: int

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def default_lanes(cs: CS256, chunk: int, resident_threads: int) -> int:
    """Threads per row (G): the smallest power of two up to 32 whose row groups fill the
    device, m x G >= FILL x resident_threads (the grid strides over the rows about twice,
    faster than one pass of fewer lanes: BENCHMARKS.md, "Figures behind choices in the
    code"), but no more than leave each lane RING chunks of an average row (so its ring
    fills). 14336 x 4096 on 132 SMs x 1024 threads: 16; 4096 rows: 32."""
    average = cs.stored / (cs.m * chunk)
    cap = 1 << max(0, min(5, math.floor(math.log2(max(1.0, average / RING)))))
    lanes = 1
    while lanes < 32 and cs.m * lanes < FILL * resident_threads:
        lanes *= 2
    return min(lanes, cap)


def make_plan(
    cs: CS256,
    k: int = 1,
    variant: str = "group",
    lanes: int | None = None,
    chunk: int | None = None,
    slice_tiles: int | None = None,
    blocks_per_sm: int | None = None,
) -> Plan:
    """The launch of `variant` for `cs` times k vectors, on the current device. Overrides
    (for tests and tuning): lanes (1..32, power of two), chunk (4 or 8, dividing vec),
    slice_tiles (>= T, or a multiple of 4), blocks_per_sm."""
    if variant not in VARIANTS:
        raise CS256Error(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    if not 1 <= k <= MAX_VECTORS:
        raise CS256Error(f"k must be 1 to {MAX_VECTORS}; got {k}")
    tag = TAGS[cs.dtype]
    sms = kernels.device_attribute("MultiProcessorCount")
    itemsize = STORAGE[cs.dtype].itemsize
    t = cs.tiles_per_row
    if variant == "split4":
        if k != 1:
            raise CS256Error("the split4 kernel multiplies one vector; use the group kernel for several")
        name = f"cs256_split4_{tag}_v{cs.vec}"
        function = kernels.kernel(SOURCE, name)
        resident = blocks_per_sm or kernels.blocks_per_sm(function, SPLIT4_BLOCK)
        grid = max(1, min(-(-cs.m // SPLIT4_ROWS), resident * sms))
        return Plan(variant, name, SPLIT4_BLOCK, grid, 0, cs.vec, 4, 4, 1, 1, resident)
    chunk = chunk or (4 if cs.vec == 4 else 8)
    if chunk not in CHUNKS or cs.vec % chunk:
        raise CS256Error(f"chunk must be 4 or 8 and divide vec={cs.vec}; got {chunk}")
    if lanes is not None and lanes not in LANES:
        raise CS256Error(f"lanes must be one of {LANES}; got {lanes}")
    k_padded = next(size for size in K_SIZES if size >= k)
    tile_bytes = 256 * k_padded * itemsize
    if slice_tiles is None:
        slice_tiles = t if t * tile_bytes <= SHARED_BUDGET else max(4, SHARED_BUDGET // tile_bytes // 4 * 4)
    elif slice_tiles < t and (slice_tiles < 4 or slice_tiles % 4):
        raise CS256Error(f"slice_tiles must be >= {t} (all of x) or a multiple of 4; got {slice_tiles}")
    shared = min(slice_tiles, t) * tile_bytes
    if shared > kernels.max_shared_bytes():
        raise CS256Error(f"{shared} bytes of x per block exceed the device's {kernels.max_shared_bytes()}")
    name = f"cs256_group_{tag}_w{chunk}_k{k_padded}"
    function = kernels.kernel(SOURCE, name)
    resident = blocks_per_sm or kernels.blocks_per_sm(function, GROUP_BLOCK, shared)
    lanes = lanes or default_lanes(cs, chunk, resident * sms * GROUP_BLOCK)
    rows_per_block = GROUP_BLOCK // lanes
    grid = max(1, min(-(-cs.m // rows_per_block), resident * sms))
    return Plan("group", name, GROUP_BLOCK, grid, shared, chunk, lanes, slice_tiles, k, k_padded, resident)


def _aligned(array: cupy.ndarray) -> cupy.ndarray:
    """C-contiguous and 16-byte aligned (a fresh copy when not)."""
    if not array.flags.c_contiguous or array.data.ptr % 16:
        return cupy.array(array, order="C", copy=True)
    return array


def _check_matrix(cs: CS256) -> None:
    if cs.xp is not cupy:
        raise CS256Error("the matrix is on the host: call .to_device() first")
    for name in ("values", "indices", "row_ptr", "block_increments"):
        array = getattr(cs, name)
        if not array.flags.c_contiguous or array.data.ptr % 16:
            raise CS256Error(f"{name} must be C-contiguous and 16-byte aligned")
        if array.device.id != cupy.cuda.Device().id:
            raise CS256Error(
                f"{name} lives on device {array.device.id}, not on the current device {cupy.cuda.Device().id}"
            )


def spmm(
    cs: CS256, x: cupy.ndarray, plan: Plan | None = None, out: cupy.ndarray | None = None, **plan_options
) -> cupy.ndarray:
    """Y = A X on the current stream. x: (n,) or (n, k), the matrix's storage dtype; returns
    (or fills `out` with) y of shape (m,) or (m, k) in that dtype. plan: from make_plan
    (made here, with plan_options, when None)."""
    _check_matrix(cs)
    dtype = STORAGE[cs.dtype]
    if not isinstance(x, cupy.ndarray) or x.dtype != dtype or x.ndim not in (1, 2) or x.shape[0] != cs.n:
        raise CS256Error(
            f"x must be a CuPy {dtype} array of shape ({cs.n},) or ({cs.n}, k); got "
            f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}"
        )
    k = 1 if x.ndim == 1 else x.shape[1]
    plan = plan or make_plan(cs, k, **plan_options)
    if plan.k != k:
        raise CS256Error(f"the plan is for {plan.k} vectors, x has {k}")
    out_shape = (cs.m,) if x.ndim == 1 else (cs.m, k)
    if out is not None and (out.shape != out_shape or out.dtype != dtype or not out.flags.c_contiguous):
        raise CS256Error(f"out must be a C-contiguous {dtype} array of shape {out_shape}")
    if plan.k_padded != k:
        padded = cupy.zeros((cs.n, plan.k_padded), dtype)
        padded[:, :k] = x.reshape(cs.n, k)
        x_run = padded
        y = cupy.empty((cs.m, plan.k_padded), dtype)
    else:
        x_run = _aligned(x)
        y = out if out is not None and out.data.ptr % 16 == 0 else cupy.empty(out_shape, dtype)
    kernels.poison(y)
    function = kernels.kernel(SOURCE, plan.kernel)
    if plan.variant == "split4":
        function((plan.grid,), (plan.block,), (*_matrix_args(cs), x_run, y))
    else:
        function(
            (plan.grid,),
            (plan.block,),
            group_args(cs, x_run, y, plan.chunk, plan.lanes, plan.slice_tiles),
            shared_mem=plan.shared_bytes,
        )
    if plan.k_padded != k:
        y = y[:, :k]
    if out is None:
        return cupy.ascontiguousarray(y.reshape(out_shape))
    if y is not out:
        out[...] = y.reshape(out_shape)
    return out


def _matrix_args(cs: CS256) -> tuple:
    return (
        cs.values,
        cs.indices,
        cs.row_ptr,
        cs.block_increments,
        np.int32(cs.m),
        np.int32(cs.n),
        np.int32(cs.padded_tiles),
    )


def group_args(cs: CS256, x: cupy.ndarray, y: cupy.ndarray, chunk: int, lanes: int, slice_tiles: int) -> tuple:
    """The arguments of a cs256_group_* kernel (x and y as the kernel takes them)."""
    unit_shift = int(math.log2(cs.vec // chunk))
    return (*_matrix_args(cs), np.int32(unit_shift), x, y, np.int32(int(math.log2(lanes))), np.int32(slice_tiles))


def spmv(
    cs: CS256, x: cupy.ndarray, plan: Plan | None = None, out: cupy.ndarray | None = None, **plan_options
) -> cupy.ndarray:
    """y = A x for one vector x of shape (n,); see spmm."""
    if getattr(x, "ndim", None) != 1:
        raise CS256Error("spmv takes one vector of shape (n,); use spmm for several")
    return spmm(cs, x, plan, out, **plan_options)


def bytes_moved(cs: CS256, k: int = 1) -> int:
    """Bytes a product must move at least: every CS256 array once, x and y once."""
    item = STORAGE[cs.dtype].itemsize
    return cs.nbytes + (cs.n + cs.m) * k * item
