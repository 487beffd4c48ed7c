"""One program's tile of a stack of (rows x keys) score blocks, shared by the float64 Triton passes
(:mod:`golden.passes`, :mod:`verify.bound_weights`; imported only by them, since it needs ``triton``).

A block is a (..., R, K) stack of matrices, one per (batch, head) pair, contiguous, over the keys
``key_start .. key_start + K - 1``.  Program ``(i, t)`` takes ``BLOCK_R`` rows of one matrix (row tiles never
straddle two, so a program's maxima down a column are its matrix's) and ``BLOCK_K`` keys (key tile ``t``).
Its local row ``r`` sees the keys ``FIRST[r] .. LAST[r]`` (absolute indices, the same for every matrix).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

#: (rows, keys, warps) of a program: 8 elements a thread.  On an H100 the fastest of six tiles (4 x 256 to
#: 32 x 32, 2 to 8 warps) for the error model's passes on each of the six long scale cases, the others up to 7%
#: slower but one (docs/benchmarks.md).
TILE = (4, 256, 4)


@triton.jit
def pair_positions(rows_per_pair, n_keys, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """``(rows, local, keys, row_ok, inside, at)``: the tile's rows in the stack and in their matrix, its keys
    (block-local), which rows and elements exist, and the elements' offsets."""
    tiles = tl.cdiv(rows_per_pair, BLOCK_R)
    local = (tl.program_id(0) % tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
    keys = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok = local < rows_per_pair
    rows = (tl.program_id(0) // tiles) * rows_per_pair + local
    inside = row_ok[:, None] & (keys < n_keys)[None, :]
    at = rows[:, None].to(tl.int64) * n_keys + keys[None, :]
    return rows, local, keys, row_ok, inside, at


@triton.jit
def visible_keys(FIRST, LAST, local, keys, row_ok, inside, key_start):
    """Which of the tile's elements a row sees: local row ``r`` sees keys ``FIRST[r] .. LAST[r]`` (absolute)."""
    first = tl.load(FIRST + local, mask=row_ok, other=1)
    last = tl.load(LAST + local, mask=row_ok, other=0)
    index = key_start + keys
    return inside & (index[None, :] >= first[:, None]) & (index[None, :] <= last[:, None])


def grid(blocks_shape, exact: bool = False) -> tuple[tuple[int, int], dict]:
    """The programs over a stack of shape ``blocks_shape`` (..., R, K), and the launch keywords of :data:`TILE`;
    ``exact`` turns off contraction into fused multiply-adds (error-free transformations need every rounding)."""
    rows, keys, warps = TILE
    *pairs, n_rows, n_keys = blocks_shape
    count = math.prod(pairs)
    keywords = {"BLOCK_R": rows, "BLOCK_K": keys, "num_warps": warps}
    if exact:
        keywords["enable_fp_fusion"] = False
    return (count * triton.cdiv(n_rows, rows), triton.cdiv(n_keys, keys)), keywords
