"""A job's matrix to CS256, pruned or as it is, and what pruning removed: shared by the
CPU (reference.measure) and GPU (anchors.measure) runs; NumPy or CuPy arrays alike."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu.cs256.format import CS256, from_dense, prune, to_float32
from gpu.cs256.params import Cs256Params

ROW_BLOCK_VALUES = 1 << 22  # entries per block of rows in the float64 comparison


def convert(params: Cs256Params, a, dtype: str) -> CS256:
    """`a` (storage of `dtype`) in CS256: magnitude-pruned to params.sparsity, or with its
    own zeros when sparsity is None."""
    if params.sparsity is None:
        return from_dense(a, params.vec, dtype)
    return prune(a, params.sparsity, params.vec, dtype)


def pruning_report(params: Cs256Params, original, pruned, x, xp, dtype: str) -> dict[str, Any] | None:
    """How much pruning removed: the relative Frobenius norm of the dropped weights and the
    max relative change of A x, both in float64 over blocks of rows (`xp`: numpy or cupy).
    None without pruning."""
    if params.sparsity is None:
        return None
    m, n = original.shape
    x64 = to_float32(x, dtype).astype(np.float64)
    removed = total = 0.0
    y_full, y_pruned = [], []
    step = max(1, ROW_BLOCK_VALUES // n)
    for r in range(0, m, step):
        a64 = to_float32(original[r : r + step], dtype).astype(np.float64)
        p64 = to_float32(pruned[r : r + step], dtype).astype(np.float64)
        removed += float(((a64 - p64) ** 2).sum())
        total += float((a64**2).sum())
        y_full.append(a64 @ x64)
        y_pruned.append(p64 @ x64)
    full, cut = xp.concatenate(y_full), xp.concatenate(y_pruned)
    scale = float(xp.abs(full).max())
    return {
        "target_sparsity": params.sparsity,
        "removed_norm": (removed / total) ** 0.5 if total > 0 else 0.0,
        "output_change": float(xp.abs(cut - full).max()) / scale if scale > 0 else 0.0,
    }
