"""The dynamic shared memory of the group and mma kernels (cs256.cu, group_kernel), without
CuPy: gpu/cs256/cuda.py sizes its launches with it, the CPU emulation's tests
(tests/gpu/cs256/test_emulated.py) theirs.

A block of GROUP_BLOCK threads holds, in order: up to ALIGN_PAD bytes so that x starts
512-byte aligned, x's slice of tiles, a tile of zeros (ZERO_TILE_BYTES), and one chunk ->
tile map per row group (`map_chunks` bytes each).
"""

from __future__ import annotations

from gpu.cs256.format import CS256

GROUP_BLOCK = 512  # threads per block, as cs256.cu
ALIGN_PAD = 512
ZERO_TILE_BYTES = 512  # 256 columns of 16-bit zeros: what an mma lane past its chunks multiplies


def group_shared_bytes(held_tiles: int, tile_bytes: int, lanes: int, map_chunks: int) -> int:
    """Bytes of a block with held_tiles tiles of x (tile_bytes each: 256 columns times the
    vectors times the item size) and row groups of `lanes` threads."""
    return ALIGN_PAD + held_tiles * tile_bytes + ZERO_TILE_BYTES + GROUP_BLOCK // lanes * map_chunks


def map_chunks_for(cs: CS256, chunk: int, held_tiles: int) -> int:
    """Bytes of a row group's chunk -> tile map: the most chunks a row can have within
    held_tiles tiles (every tile full) or in all (the longest row), rounded up to 16."""
    most = min(held_tiles * 256 // chunk, -(-cs.longest_row // chunk))
    return max(16, -(-most // 16) * 16)
