"""The CS256 storage format of Lasby, Zimmer, Pokutta & Schultheis: unstructured sparsity
with 8-bit column indices inside tiles of 1 x 256 columns. Conversions (dense, CSR,
magnitude pruning), the exact way back to dense, structural validation and the storage
report. Every function takes NumPy or CuPy arrays and answers in the same module.

For an m x n matrix, each row is cut into T = ceil(n / 256) tiles of 256 columns (the last
one narrower when 256 does not divide n); P = T rounded up to a multiple of 4. Arrays:

- `values` (stored,): the stored entries row after row, tile after tile, columns ascending
  inside a tile; float16, bfloat16 or float32. NumPy has no bfloat16: bfloat16 values are
  carried as their uint16 bit patterns (`dtype="bfloat16"` says how to read them).
- `indices` (stored,) uint8: each entry's column inside its tile (column mod 256).
- `row_ptr` (m + 1,) int32: row i's entries are values[row_ptr[i]:row_ptr[i + 1]].
- `block_increments` (m, P) uint8: the entries of tile t of row i **in units of vec**;
  zero for the padding tiles t >= T, so four counts always load as one aligned word.

Every tile stores a multiple of `vec` (4, 8 or 16) entries, so values and indices load as
vec-wide vectors. A tile whose non-zeros are not a multiple of vec is padded with explicit
zeros at its lowest free columns (past column n in the last tile when the columns below n
are all taken; those padding entries are always zero).

The full tile. 256 non-zeros do not fit an 8-bit count; counts in units of vec do: a tile
holds at most 256 / vec units (64, 32 or 16), any count fits, and the padding to a multiple
of vec comes out of the same rule. The kernel multiplies by vec (a shift).

A structural non-zero is an entry whose bit pattern is not +0.0: -0.0 is kept, so
dense -> CS256 -> dense is exact bit for bit. `nnz` counts the stored entries that are not
+0.0, `stored` counts them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np

TILE = 256  # columns per tile: an 8-bit index reaches every one
TILE_GROUP = 4  # each row's tile counts are padded to a multiple of this (one 32-bit load)
VECS = (4, 8, 16)
DEFAULT_VEC: Final = 8
DTYPES = ("float16", "bfloat16", "float32")
STORAGE: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
}
BITS: dict[str, np.dtype] = {
    "float16": np.dtype(np.uint16),
    "bfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.uint32),
}
MAX_STORED = 2**31 - 1  # row_ptr is int32


class CS256Error(ValueError):
    """A matrix or parameter the format cannot take, or arrays that are not a valid CS256 matrix."""


# ------------------------------------------------------------------ array modules --


def array_module(a) -> Any:
    """cupy for a CuPy array, else numpy (CuPy is imported only when it is already in use)."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _repeat(xp, values, counts):
    """numpy.repeat(values, counts) for NumPy and CuPy (cupy.repeat takes no array of counts)."""
    if xp is np:
        return np.repeat(values, counts)
    ends = xp.cumsum(counts)
    total = int(ends[-1]) if ends.size else 0
    return values[xp.searchsorted(ends, xp.arange(total), side="right")]


# ------------------------------------------------------------------ element types --


def check_dtype(dtype) -> str:
    """The dtype's name, one of DTYPES, or CS256Error."""
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name not in DTYPES:
        raise CS256Error(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return name


def check_vec(vec) -> int:
    if isinstance(vec, bool) or not isinstance(vec, (int, np.integer)) or int(vec) not in VECS:
        raise CS256Error(f"vec must be one of {', '.join(map(str, VECS))}; got {vec!r}")
    return int(vec)


def float32_to_bf16_bits(a):
    """float32 array -> bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays a
    (quiet) NaN, infinities and overflow give infinities."""
    xp = array_module(a)
    f = xp.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x40)
    return xp.where(xp.isnan(f), quiet_nan, rounded).astype(np.uint16)


def bf16_bits_to_float32(bits):
    """bfloat16 bit patterns (uint16) -> float32, exact."""
    xp = array_module(bits)
    return (xp.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_float32(a, dtype: str):
    """Stored values (storage dtype of `dtype`) as float32, exact."""
    if dtype == "bfloat16":
        return bf16_bits_to_float32(a)
    return a.astype(np.float32)


def from_float(a, dtype: str):
    """A float array rounded to the storage of `dtype` (float64 -> bfloat16 goes through float32)."""
    xp = array_module(a)
    with np.errstate(over="ignore"):  # values past the dtype's range become infinities (callers check)
        if dtype == "bfloat16":
            return float32_to_bf16_bits(a.astype(np.float32))
        return xp.ascontiguousarray(a, dtype=STORAGE[dtype])


def as_storage(a, dtype=None) -> tuple[Any, str]:
    """(array in the storage dtype, dtype name) for a float array, converting when `dtype`
    asks for another precision. With dtype=None the array must be float16 or float32;
    uint16 is read as bfloat16 bit patterns only when dtype="bfloat16" says so."""
    xp = array_module(a)
    if xp is np:
        a = np.asarray(a)
    if dtype is None:
        if a.dtype == np.float16:
            return xp.ascontiguousarray(a), "float16"
        if a.dtype == np.float32:
            return xp.ascontiguousarray(a), "float32"
        if a.dtype == np.uint16:
            raise CS256Error("a uint16 array is taken as bfloat16 bit patterns only with dtype='bfloat16'")
        raise CS256Error(
            f"values of dtype {a.dtype} are not supported: use float16, float32, or bfloat16 bit patterns "
            "(uint16) with dtype='bfloat16', or name the dtype to convert to"
        )
    name = check_dtype(dtype)
    if a.dtype == np.uint16:
        if name != "bfloat16":
            raise CS256Error(f"a uint16 array holds bfloat16 bit patterns; it cannot be read as {name}")
        return xp.ascontiguousarray(a), name
    if a.dtype.kind != "f":
        raise CS256Error(f"values of dtype {a.dtype} are not supported: send floating-point values")
    if a.dtype == STORAGE[name]:
        return xp.ascontiguousarray(a), name
    return from_float(a, name), name


# ------------------------------------------------------------------ the matrix --


@dataclass(frozen=True, eq=False)
class CS256:
    """A CS256 matrix (see the module docstring). Arrays are all NumPy or all CuPy."""

    m: int
    n: int
    dtype: str
    vec: int
    values: Any
    indices: Any
    row_ptr: Any
    block_increments: Any

    @property
    def shape(self) -> tuple[int, int]:
        return self.m, self.n

    @property
    def tiles_per_row(self) -> int:
        return -(-self.n // TILE)

    @property
    def padded_tiles(self) -> int:
        return -(-self.tiles_per_row // TILE_GROUP) * TILE_GROUP

    @property
    def xp(self):
        return array_module(self.values)

    @property
    def itemsize(self) -> int:
        return STORAGE[self.dtype].itemsize

    @property
    def stored(self) -> int:
        """Entries stored, padding included."""
        return int(self.values.shape[0])

    @property
    def nnz(self) -> int:
        """Stored entries that are not +0.0 (the matrix's non-zeros)."""
        return int(self.xp.count_nonzero(self.values.view(BITS[self.dtype])))

    @property
    def sparsity(self) -> float:
        return 1.0 - self.nnz / (self.m * self.n)

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.indices.nbytes + self.row_ptr.nbytes + self.block_increments.nbytes)

    def tile_counts(self):
        """(m, T) int64: entries stored in each tile."""
        return self.block_increments[:, : self.tiles_per_row].astype(np.int64) * self.vec

    def entry_positions(self):
        """(rows, cols) int64 of every stored entry; padding past column n has cols >= n."""
        xp, m, t = self.xp, self.m, self.tiles_per_row
        tile = _repeat(xp, xp.arange(m * t, dtype=np.int64), self.tile_counts().ravel())
        return tile // t, (tile % t) * TILE + self.indices.astype(np.int64)

    def to_dense(self):
        """The (m, n) matrix in the storage dtype (uint16 bit patterns for bfloat16), exact."""
        xp = self.xp
        rows, cols = self.entry_positions()
        wide = xp.zeros((self.m, self.tiles_per_row * TILE), STORAGE[self.dtype])
        wide[rows, cols] = self.values
        return xp.ascontiguousarray(wide[:, : self.n])

    def to_device(self) -> CS256:
        """A copy with CuPy arrays on the current device."""
        import cupy

        return replace(
            self,
            **{
                name: cupy.asarray(getattr(self, name)) for name in ("values", "indices", "row_ptr", "block_increments")
            },
        )

    def to_host(self) -> CS256:
        """A copy (or self) with NumPy arrays."""
        if self.xp is np:
            return self
        return replace(
            self, **{name: getattr(self, name).get() for name in ("values", "indices", "row_ptr", "block_increments")}
        )

    def validate(self) -> CS256:
        """Check every structural rule; returns self, or raises CS256Error naming the first
        broken one. Needed before a kernel reads arrays from outside (files, uploads)."""
        for name, value in (("m", self.m), ("n", self.n)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise CS256Error(f"{name} must be a positive integer; got {value!r}")
        check_dtype(self.dtype)
        check_vec(self.vec)
        xp = self.xp
        if any(array_module(getattr(self, name)) is not xp for name in ("indices", "row_ptr", "block_increments")):
            raise CS256Error("the arrays must all be NumPy or all CuPy")
        m, t, p, vec = self.m, self.tiles_per_row, self.padded_tiles, self.vec
        expected = {
            "values": ((None,), STORAGE[self.dtype]),
            "indices": ((None,), np.dtype(np.uint8)),
            "row_ptr": ((m + 1,), np.dtype(np.int32)),
            "block_increments": ((m, p), np.dtype(np.uint8)),
        }
        for name, (shape, dtype) in expected.items():
            array = getattr(self, name)
            if array.ndim != len(shape) or any(
                want is not None and got != want for got, want in zip(array.shape, shape, strict=True)
            ):
                raise CS256Error(
                    f"{name} has shape {array.shape}; expected {tuple('any' if s is None else s for s in shape)}"
                )
            if array.dtype != dtype:
                raise CS256Error(f"{name} has dtype {array.dtype}; expected {dtype} for a {self.dtype} matrix")
        if self.indices.shape[0] != self.stored:
            raise CS256Error(f"indices has {self.indices.shape[0]} entries and values {self.stored}")
        if self.stored > MAX_STORED:
            raise CS256Error(f"{self.stored} stored entries do not fit int32 row pointers")
        row_ptr = self.row_ptr.astype(np.int64)
        if int(row_ptr[0]) != 0 or int(row_ptr[-1]) != self.stored:
            raise CS256Error(
                f"row_ptr must start at 0 and end at the {self.stored} stored entries; it runs "
                f"{int(row_ptr[0])}..{int(row_ptr[-1])}"
            )
        row_lengths = xp.diff(row_ptr)
        if bool((row_lengths < 0).any()):
            raise CS256Error("row_ptr decreases")
        incs = self.block_increments
        if p > t and bool((incs[:, t:] != 0).any()):
            raise CS256Error(f"block_increments must be 0 in the padding tiles {t}..{p - 1}")
        if bool((incs[:, :t] > TILE // vec).any()):
            raise CS256Error(f"a tile count exceeds {TILE // vec} units of vec={vec} (256 entries)")
        if bool((incs.astype(np.int64).sum(axis=1) * vec != row_lengths).any()):
            bad = int(xp.nonzero(incs.astype(np.int64).sum(axis=1) * vec != row_lengths)[0][0])
            raise CS256Error(f"row {bad}: its tile counts do not add up to row_ptr[{bad + 1}] - row_ptr[{bad}]")
        if self.stored:
            tile = _repeat(xp, xp.arange(m * t, dtype=np.int64), self.tile_counts().ravel())
            same_tile = tile[1:] == tile[:-1]
            if bool((same_tile & (self.indices[1:] <= self.indices[:-1])).any()):
                raise CS256Error("indices must increase strictly inside each tile")
            if self.n % TILE:
                cols = (tile % t) * TILE + self.indices.astype(np.int64)
                if bool(((cols >= self.n) & (self.values.view(BITS[self.dtype]) != 0)).any()):
                    raise CS256Error(f"entries past column n={self.n} must be +0.0 (padding)")
        return self


# ------------------------------------------------------------------ conversions --


def _check_matrix(a, name: str = "matrix") -> tuple[int, int]:
    if a.ndim != 2:
        raise CS256Error(f"the {name} must be 2-D; got shape {tuple(a.shape)}")
    m, n = (int(v) for v in a.shape)
    if m < 1 or n < 1:
        raise CS256Error(f"the {name} is empty (shape {m} x {n})")
    return m, n


def from_dense(a, vec: int = DEFAULT_VEC, dtype=None) -> CS256:
    """CS256 of a dense (m, n) NumPy or CuPy array, with every entry that is not +0.0 stored.
    a: float16 / float32 (or any float with `dtype` naming the precision to round to), or
    bfloat16 bit patterns (uint16) with dtype="bfloat16"."""
    vec = check_vec(vec)
    a, name = as_storage(a, dtype)
    m, n = _check_matrix(a)
    xp = array_module(a)
    rows, cols = xp.nonzero(a.view(BITS[name]))
    return _from_entries(xp, m, n, rows.astype(np.int64), cols.astype(np.int64), a[rows, cols], vec, name)


def from_csr(matrix, vec: int = DEFAULT_VEC, dtype=None) -> CS256:
    """CS256 of a CSR matrix: scipy.sparse csr_matrix / csr_array (or anything with
    .tocsr(), such as COO), or a cupyx.scipy.sparse csr_matrix (then the result is on the
    device). Duplicate entries are summed (in float64, then rounded once); explicit zeros are
    kept as stored entries. Needs no SciPy import: only the indptr / indices / data arrays."""
    vec = check_vec(vec)
    if not all(hasattr(matrix, name) for name in ("indptr", "indices", "data", "shape")):
        if not hasattr(matrix, "tocsr"):
            raise CS256Error(f"expected a CSR matrix (indptr, indices, data), got {type(matrix).__name__}")
        matrix = matrix.tocsr()
    if len(matrix.shape) != 2:
        raise CS256Error(f"the matrix must be 2-D; got shape {tuple(matrix.shape)}")
    m, n = (int(v) for v in matrix.shape)
    if m < 1 or n < 1:
        raise CS256Error(f"the matrix is empty (shape {m} x {n})")
    data, name = as_storage(matrix.data, dtype)
    xp = array_module(data)
    indptr = xp.asarray(matrix.indptr).astype(np.int64)
    cols = xp.asarray(matrix.indices).astype(np.int64)
    if (
        indptr.shape != (m + 1,)
        or int(indptr[0]) != 0
        or int(indptr[-1]) != cols.size
        or cols.size != data.size
        or bool((xp.diff(indptr) < 0).any())
    ):
        raise CS256Error("the CSR arrays are inconsistent (indptr, indices and data do not match)")
    if cols.size and (int(cols.min()) < 0 or int(cols.max()) >= n):
        raise CS256Error(f"a CSR column index is outside 0..{n - 1}")
    rows = _repeat(xp, xp.arange(m, dtype=np.int64), xp.diff(indptr))
    key = rows * n + cols
    order = xp.argsort(key, kind="stable") if xp is np else xp.argsort(key)
    key, data = key[order], data[order]
    if key.size > 1:
        first = xp.concatenate([xp.ones(1, bool), key[1:] != key[:-1]])
        if not bool(first.all()):
            group = xp.cumsum(first) - 1
            sums = xp.bincount(group, weights=to_float32(data, name).astype(np.float64))
            key, data = key[first], from_float(sums, name)
    return _from_entries(xp, m, n, key // n, key % n, data, vec, name)


def _from_entries(xp, m: int, n: int, rows, cols, vals, vec: int, name: str) -> CS256:
    """The CS256 of entries sorted by (row, col) without repeats, 0 <= col < n: counts
    rounded up to vec with zeros at the lowest free columns of each tile."""
    t = -(-n // TILE)
    p = -(-t // TILE_GROUP) * TILE_GROUP
    tile = rows * t + cols // TILE
    within = cols % TILE
    counts = xp.bincount(tile, minlength=m * t).astype(np.int64) if tile.size else xp.zeros(m * t, np.int64)
    stored = (counts + vec - 1) // vec * vec
    pads = stored - counts
    total = int(stored.sum())
    if total > MAX_STORED:
        raise CS256Error(f"{total} stored entries do not fit int32 row pointers")
    if int(pads.sum()):
        # Candidate columns 0 .. count + pad - 1 of each tile that needs padding: at most
        # `count` of them are taken, so at least `pad` are free; the lowest free ones pad.
        need = xp.nonzero(pads)[0]
        span = counts[need] + pads[need]
        cand_tile = _repeat(xp, need, span)
        starts = xp.cumsum(span) - span
        cand_col = xp.arange(cand_tile.size, dtype=np.int64) - _repeat(xp, starts, span)
        cand_key = cand_tile * TILE + cand_col
        entry_key = tile * TILE + within
        if entry_key.size:
            pos = xp.searchsorted(entry_key, cand_key)
            taken = (pos < entry_key.size) & (entry_key[xp.minimum(pos, entry_key.size - 1)] == cand_key)
            free = ~taken
        else:
            free = xp.ones(cand_key.size, bool)
        free_total = xp.cumsum(free)
        before = xp.where(starts > 0, free_total[xp.maximum(starts - 1, 0)], 0)
        rank = free_total - _repeat(xp, before, span)
        pad_key = cand_key[free & (rank <= _repeat(xp, pads[need], span))]
        at_entries = xp.arange(entry_key.size, dtype=np.int64) + xp.searchsorted(pad_key, entry_key)
        at_pads = xp.arange(pad_key.size, dtype=np.int64) + xp.searchsorted(entry_key, pad_key)
        indices = xp.empty(total, np.uint8)
        indices[at_entries] = within.astype(np.uint8)
        indices[at_pads] = (pad_key % TILE).astype(np.uint8)
        values = xp.zeros(total, STORAGE[name])
        values[at_entries] = vals
    else:
        indices = within.astype(np.uint8)
        values = xp.ascontiguousarray(vals, dtype=STORAGE[name])
    row_ptr = xp.zeros(m + 1, np.int32)
    row_ptr[1:] = xp.cumsum(stored.reshape(m, t).sum(axis=1))
    increments = xp.zeros((m, p), np.uint8)
    increments[:, :t] = (stored // vec).reshape(m, t).astype(np.uint8)
    return CS256(m, n, name, vec, values, indices, row_ptr, increments)


def to_csr(cs: CS256):
    """The matrix as CSR with int32 indices, no stored zeros and float32 values (exact;
    SciPy's and CuPy's sparse products take no float16 or bfloat16): scipy.sparse.csr_array
    for a host matrix (needs SciPy), cupyx.scipy.sparse.csr_matrix for a device one."""
    xp = cs.xp
    rows, cols = cs.entry_positions()
    keep = cs.values.view(BITS[cs.dtype]) != 0
    rows, cols, vals = rows[keep], cols[keep], cs.values[keep]
    indptr = xp.zeros(cs.m + 1, np.int32)
    indptr[1:] = xp.cumsum(xp.bincount(rows, minlength=cs.m))
    if xp is np:
        try:
            import scipy.sparse
        except ImportError:
            raise ImportError("CS256 -> CSR on the host needs SciPy: pip install scipy") from None
        return scipy.sparse.csr_array((to_float32(vals, cs.dtype), cols.astype(np.int32), indptr), shape=cs.shape)
    import cupyx.scipy.sparse

    return cupyx.scipy.sparse.csr_matrix((to_float32(vals, cs.dtype), cols.astype(np.int32), indptr), shape=cs.shape)


# ------------------------------------------------------------------ pruning --


def prune(a, sparsity: float, vec: int = DEFAULT_VEC, dtype=None) -> CS256:
    """Magnitude pruning of a dense (m, n) matrix (NumPy or CuPy; dtypes as `from_dense`)
    to CS256 at a target sparsity, each tile keeping a multiple of vec weights.

    Inside a tile the weights kept are always its largest by magnitude, so a tile's choice
    is how many groups of vec it keeps; group j of a tile is worth the sum of squares of
    its j-th vec largest weights, a non-increasing sequence. The globally best groups are
    kept (most squared magnitude kept = least Frobenius norm removed, which is optimal
    because each tile's worth is concave in its group count): round((1 - sparsity) m n /
    vec) groups. Ties go to the lower tile and column, so NumPy and CuPy give the same
    result. Weights of zero magnitude are never stored. sparsity: in [0, 1); 0 keeps
    everything. The sparsity reached is in `.sparsity` (the last, narrower tile of each
    row counts its missing columns as zeros of its groups)."""
    vec = check_vec(vec)
    if (
        isinstance(sparsity, bool)
        or not isinstance(sparsity, (int, float, np.integer, np.floating))
        or not (0.0 <= float(sparsity) < 1.0)
    ):
        raise CS256Error(f"sparsity must be a number in [0, 1); got {sparsity!r}")
    a, name = as_storage(a, dtype)
    m, n = _check_matrix(a)
    xp = array_module(a)
    magnitude = xp.abs(to_float32(a, name))
    if not bool(xp.isfinite(magnitude).all()):
        raise CS256Error("the matrix has NaN or infinite entries; magnitude pruning needs finite weights")
    if float(sparsity) == 0.0:
        return from_dense(a, vec, name)
    t = -(-n // TILE)
    tiles = xp.zeros((m, t * TILE), np.float32)
    tiles[:, :n] = magnitude
    del magnitude
    tiles = tiles.reshape(m * t, TILE)
    descending = xp.ascontiguousarray(xp.sort(tiles, axis=1)[:, ::-1])
    groups = descending.reshape(m * t, TILE // vec, vec)
    worth = xp.zeros((m * t, TILE // vec), np.float64)
    for k in range(vec):  # one exact square at a time: the same float64 sums on NumPy and CuPy
        term = groups[:, :, k].astype(np.float64)
        worth += term * term
    del groups
    keep_groups = min(round((1.0 - float(sparsity)) * m * n / vec), worth.size)
    chosen = _largest(xp, worth.ravel(), keep_groups).reshape(worth.shape)
    per_tile = chosen.sum(axis=1).astype(np.int64) * vec
    del worth, chosen
    keep = _largest_per_row(xp, tiles, descending, per_tile) & (tiles > 0)
    del descending, tiles
    keep = keep.reshape(m, t * TILE)[:, :n]
    pruned = xp.where(keep, a, xp.zeros((), a.dtype))
    return from_dense(pruned, vec, name)


def _largest(xp, values, k: int):
    """Mask of the k largest of a 1-D array, ties to the lower index."""
    size = values.size
    if k <= 0:
        return xp.zeros(size, bool)
    if k >= size:
        return xp.ones(size, bool)
    threshold = xp.partition(values, size - k)[size - k]
    above = values > threshold
    ties = values == threshold
    return above | (ties & (xp.cumsum(ties) <= k - int(above.sum())))


def _largest_per_row(xp, rows, descending, counts):
    """Mask of the counts[r] largest of each row of `rows` (descending: each row sorted
    largest first), ties to the lower column."""
    r = rows.shape[0]
    threshold = descending[xp.arange(r), xp.clip(counts - 1, 0, rows.shape[1] - 1)][:, None]
    above = rows > threshold
    ties = rows == threshold
    need = counts - above.sum(axis=1)
    keep = above | (ties & (xp.cumsum(ties, axis=1, dtype=np.int16) <= need[:, None]))
    return keep & (counts > 0)[:, None]


# ------------------------------------------------------------------ storage report --


def storage_report(cs: CS256) -> dict[str, Any]:
    """Bytes of this matrix in CS256 and in the usual formats, for the same non-zeros:
    dense; CSR with int32 column indices and row pointers; COO with int32 rows and columns;
    a bitmask of m n bits beside the packed values. Per format: bytes, the fraction of dense,
    bits per non-zero (all bytes) and index bits per non-zero (all but the values)."""
    m, n, item, nnz = cs.m, cs.n, cs.itemsize, cs.nnz
    formats = {
        "dense": m * n * item,
        "cs256": cs.stored * (item + 1) + 4 * (m + 1) + m * cs.padded_tiles,
        "csr_int32": nnz * (item + 4) + 4 * (m + 1),
        "coo_int32": nnz * (item + 8),
        "bitmask": math.ceil(m * n / 8) + nnz * item,
    }
    dense = formats["dense"]

    def entry(size: int) -> dict[str, Any]:
        return {
            "bytes": size,
            "vs_dense": size / dense,
            "bits_per_nonzero": size * 8 / nnz if nnz else None,
            "index_bits_per_nonzero": (size - nnz * item) * 8 / nnz if nnz else None,
        }

    return {
        "m": m,
        "n": n,
        "dtype": cs.dtype,
        "vec": cs.vec,
        "nnz": nnz,
        "stored": cs.stored,
        "padding": cs.stored - nnz,
        "sparsity": 1.0 - nnz / (m * n),
        "tiles_per_row": cs.tiles_per_row,
        "padded_tiles": cs.padded_tiles,
        "cs256_arrays": {
            "values": cs.stored * item,
            "indices": cs.stored,
            "row_ptr": 4 * (m + 1),
            "block_increments": m * cs.padded_tiles,
        },
        "formats": {name: entry(size) for name, size in formats.items()},
    }
