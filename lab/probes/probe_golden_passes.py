"""Prototype: the fast golden's elementwise work of a block in Triton passes, its products left to cuBLAS.

On an H100 the golden's float64 pass at (1, 1, 131072, 128) causal spent 2.2 s of 4.1 s of CUDA time in
elementwise kernels and 0.9 s in products (lab/benchmarks-history.md, "seventh session").  This probe replaces
:func:`golden.fast._forward` and :func:`golden.fast._backward` by the same arithmetic in six passes per block
(``verify.bound_weights`` did the same for the error model's bounds):

* forward: (A) ``two_sum`` of the scores' two products, the mask, each (row, key tile)'s maximum and its first
  index; (B) the logits ``((S_hi - m) + S_lo) |scale|``, ``E = exp`` (0 at the pivot and on hidden keys), each
  tile's sum and maximum; (C) ``P = E / (1 + excess)`` and its split ``P = P0 + R`` by the row's
  :func:`golden.eft.leading_slice` (one-slice :func:`golden.eft.dd_matmul` with ``V``), each key's maximum of
  ``P`` per row tile;
* backward: (D) ``shifted = (dP_hi - r_hi) + (dP_lo - r_lo)`` and each tile's ``sum_j P shifted``; (E)
  ``dS = (shifted - b) P`` and its row and column maxima; (F) the splits of ``dS`` by rows, of ``dS`` by
  columns and of ``P`` by columns, for ``dS K``, ``dS^T Q`` and ``P^T dO``.

The error-free transformations stay exact only without contraction into fused multiply-adds, so every launch
passes ``enable_fp_fusion=False`` (compiled; the interpreter computes in NumPy, which never contracts).  Where
the fast path would take another branch (a ``V``, ``K``, ``Q`` or ``dO`` that is not one exact slice, row
exponents out of :func:`golden.eft.leading_slice`'s range, a zero scale) the block keeps the torch code.  Sums
over keys are taken in another order, so the outputs differ from :func:`golden.fast.attention`'s by float64
rounding; :func:`golden.certify.certify` measures them as it does the torch path's::

    PYTHONPATH=. TRITON_INTERPRET=1 python lab/probes/probe_golden_passes.py --check
    PYTHONPATH=. python lab/probes/probe_golden_passes.py --device cuda --shapes 1x1x131072x128c 1x16x16384x128

``--check`` compares both on small problems (exit 1 beyond 1e-13 relative to each output's largest magnitude, or
when the certification fails); ``--shapes`` (``BxHxSxD``, ``Hq/Hkv``, a trailing ``c`` causal) times both
float64 passes (synchronised, the faster of two) and prints the differences and the certified bounds.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import json
import math
import sys

import torch
import triton
import triton.language as tl
from synced import timed

from fa2_verify.app.cases.scale import SCALE_CASES
from fa2_verify.core.case import make_case
from fa2_verify.golden import certify, eft, fast, inputs
from fa2_verify.golden.eft import MIN_SLICE_BITS

#: (rows, keys, warps) of one program's tile.
TILE = (4, 256, 4)
_SIZES = ["rows_per_pair", "n_keys"]
_EXACT = {"enable_fp_fusion": False}


@triton.jit
def _positions(rows_per_pair, n_keys, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program's tile of a (..., R, K) stack of matrices: row tiles never straddle two matrices (pairs), so a
    program's column maxima are its pair's."""
    tiles = tl.cdiv(rows_per_pair, BLOCK_R)
    local = (tl.program_id(0) % tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
    keys = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok = local < rows_per_pair
    rows = (tl.program_id(0) // tiles) * rows_per_pair + local
    inside = row_ok[:, None] & (keys < n_keys)[None, :]
    at = rows[:, None].to(tl.int64) * n_keys + keys[None, :]
    return rows, local, keys, row_ok, inside, at


@triton.jit
def _visible(FIRST, LAST, local, keys, row_ok, inside, key_start):
    """Which keys each row sees: local row ``i`` sees keys ``FIRST[i]..LAST[i]`` (absolute)."""
    first = tl.load(FIRST + local, mask=row_ok, other=1)
    last = tl.load(LAST + local, mask=row_ok, other=0)
    index = key_start + keys
    return inside & (index[None, :] >= first[:, None]) & (index[None, :] <= last[:, None])


@triton.jit(do_not_specialize=[*_SIZES, "key_start"])
def _scores(HI, LO, FIRST, LAST, TILE_MAX, TILE_ARG, rows_per_pair, n_keys, key_start,
            BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(A) in place: HI <- fl(hi + lo) (hidden keys -inf), LO <- its error; each tile's maximum and first index."""
    rows, local, keys, row_ok, inside, at = _positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    visible = _visible(FIRST, LAST, local, keys, row_ok, inside, key_start)
    hi = tl.load(HI + at, mask=inside, other=0.0)
    lo = tl.load(LO + at, mask=inside, other=0.0)
    s = hi + lo
    bb = s - hi
    error = (hi - (s - bb)) + (lo - bb)
    s = tl.where(visible, s, -float("inf"))
    tl.store(HI + at, s, mask=inside)
    tl.store(LO + at, error, mask=inside)
    s = tl.where(inside, s, -float("inf"))
    largest, first_index = tl.max(s, 1, return_indices=True, return_indices_tie_break_left=True)
    partial = rows * tl.num_programs(1) + tl.program_id(1)
    tl.store(TILE_MAX + partial, largest, mask=row_ok)
    tl.store(TILE_ARG + partial, first_index + tl.program_id(1) * BLOCK_K, mask=row_ok)


@triton.jit(do_not_specialize=[*_SIZES, "key_start"])
def _exponentials(HI, LO, FIRST, LAST, ROW_MAX, PIVOT, MAGNITUDE, TILE_SUM, TILE_MAX, rows_per_pair, n_keys,
                  key_start, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(B) in place: HI <- exp(((S_hi - m) + S_lo) |scale|), 0 at the pivot and on hidden keys; each tile's sum
    and maximum."""
    rows, local, keys, row_ok, inside, at = _positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    visible = _visible(FIRST, LAST, local, keys, row_ok, inside, key_start)
    magnitude = tl.load(MAGNITUDE)
    s_hi = tl.load(HI + at, mask=inside, other=0.0)
    s_lo = tl.load(LO + at, mask=inside, other=0.0)
    row_max = tl.load(ROW_MAX + rows, mask=row_ok, other=0.0)
    pivot = tl.load(PIVOT + rows, mask=row_ok, other=-1)
    logits = ((s_hi - row_max[:, None]) + s_lo) * magnitude
    e = tl.where(visible & (keys[None, :] != pivot[:, None]), tl.exp(logits), 0.0)
    tl.store(HI + at, e, mask=inside)
    partial = rows * tl.num_programs(1) + tl.program_id(1)
    tl.store(TILE_SUM + partial, tl.sum(e, 1), mask=row_ok)
    tl.store(TILE_MAX + partial, tl.max(e, 1), mask=row_ok)


@triton.jit(do_not_specialize=_SIZES)
def _probabilities(E, DENOMINATOR, SIGMA, P0, REST, COLUMN_MAX, rows_per_pair, n_keys,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(C) in place: E <- P = E / (1 + excess); P0 <- P's leading slice by its row's ``sigma``, REST <- P - P0;
    COLUMN_MAX[program row, key] = max of P over the program's rows."""
    rows, local, keys, row_ok, inside, at = _positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    p = tl.load(E + at, mask=inside, other=0.0) / tl.load(DENOMINATOR + rows, mask=row_ok, other=1.0)[:, None]
    sigma = tl.load(SIGMA + rows, mask=row_ok, other=1.0)[:, None]
    leading = (p + sigma) - sigma
    tl.store(E + at, p, mask=inside)
    tl.store(P0 + at, leading, mask=inside)
    tl.store(REST + at, p - leading, mask=inside)
    tl.store(COLUMN_MAX + tl.program_id(0) * n_keys + keys, tl.max(tl.where(inside, p, 0.0), 0), mask=keys < n_keys)


@triton.jit(do_not_specialize=_SIZES)
def _shifted(DP_HI, DP_LO, P, ANCHOR_HI, ANCHOR_LO, TILE_SUM, rows_per_pair, n_keys,
             BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(D) in place: DP_HI <- (dP_hi - r_hi) + (dP_lo - r_lo); each tile's sum of P times it."""
    rows, local, keys, row_ok, inside, at = _positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    anchor_hi = tl.load(ANCHOR_HI + rows, mask=row_ok, other=0.0)[:, None]
    anchor_lo = tl.load(ANCHOR_LO + rows, mask=row_ok, other=0.0)[:, None]
    shifted = ((tl.load(DP_HI + at, mask=inside, other=0.0) - anchor_hi)
               + (tl.load(DP_LO + at, mask=inside, other=0.0) - anchor_lo))
    tl.store(DP_HI + at, shifted, mask=inside)
    p = tl.load(P + at, mask=inside, other=0.0)
    tl.store(TILE_SUM + rows * tl.num_programs(1) + tl.program_id(1), tl.sum(p * shifted, 1), mask=row_ok)


@triton.jit(do_not_specialize=_SIZES)
def _gradients(SHIFTED, P, OFFSET, TILE_MAX, COLUMN_MAX, rows_per_pair, n_keys,
               BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(E) in place: SHIFTED <- dS = (shifted - b) P; each tile's max |dS| per row, and per key per program."""
    rows, local, keys, row_ok, inside, at = _positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    offset = tl.load(OFFSET + rows, mask=row_ok, other=0.0)[:, None]
    ds = (tl.load(SHIFTED + at, mask=inside, other=0.0) - offset) * tl.load(P + at, mask=inside, other=0.0)
    tl.store(SHIFTED + at, ds, mask=inside)
    magnitude = tl.where(inside, tl.abs(ds), 0.0)
    tl.store(TILE_MAX + rows * tl.num_programs(1) + tl.program_id(1), tl.max(magnitude, 1), mask=row_ok)
    tl.store(COLUMN_MAX + tl.program_id(0) * n_keys + keys, tl.max(magnitude, 0), mask=keys < n_keys)


@triton.jit(do_not_specialize=_SIZES)
def _split(X, SIGMA, X0, REST, rows_per_pair, n_keys, BY_KEY: tl.constexpr, BLOCK_R: tl.constexpr,
           BLOCK_K: tl.constexpr):
    """(F) X0 <- X's leading slice by ``sigma`` per row (per key of each matrix with BY_KEY), REST <- X - X0."""
    rows, local, keys, row_ok, inside, at = _positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    x = tl.load(X + at, mask=inside, other=0.0)
    if BY_KEY:
        pair = rows // rows_per_pair
        sigma = tl.load(SIGMA + pair[:, None] * n_keys + keys[None, :], mask=inside, other=1.0)
    else:
        sigma = tl.load(SIGMA + rows, mask=row_ok, other=1.0)[:, None]
    leading = (x + sigma) - sigma
    tl.store(X0 + at, leading, mask=inside)
    tl.store(REST + at, x - leading, mask=inside)


def _grid(matrix: torch.Tensor) -> tuple[tuple[int, int], dict]:
    """Programs over a (..., R, K) stack: each matrix's rows in tiles of their own, the keys in tiles."""
    rows, keys, warps = TILE
    grid = matrix.shape[:-2].numel() * triton.cdiv(matrix.shape[-2], rows), triton.cdiv(matrix.shape[-1], keys)
    return grid, {"BLOCK_R": rows, "BLOCK_K": keys, "num_warps": warps, **_EXACT}


def _column_max(partial: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Each key's maximum per matrix of a stack (..., K), from the programs' column maxima."""
    return partial.view(*matrix.shape[:-2], -1, matrix.shape[-1]).amax(-2)


@functools.lru_cache(maxsize=16)
def _scalar(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float64, device=device)


def _sigma(peak: torch.Tensor, beta: int) -> torch.Tensor | None:
    """:func:`golden.eft.leading_slice`'s ``sigma`` for row maxima ``peak``, or None out of its range."""
    exponent = torch.frexp(peak).exponent.to(torch.int64)
    if not bool(((exponent > eft._MIN_EXPONENT) & (exponent < eft._MAX_EXPONENT)).all()):
        return None
    return torch.ldexp(torch.full_like(peak, 0.75), exponent - beta + 53)


def _slice_bits(b: torch.Tensor, k: int) -> tuple[int, bool] | None:
    """The path of :func:`golden.eft.dd_matmul` of an ``a`` (..., m, k) with ``b``, as (bits of ``a``'s leading
    slice, one slice): ``(MIN_SLICE_BITS, True)`` where every matrix of ``b`` is one exact slice, (half the budget,
    False) where none is (two-slice path); None where the matrices of ``b`` differ (the block keeps the torch code)."""
    budget = 53 - math.ceil(math.log2(k))
    exact = eft._per_matrix(eft.leading_slice(b, -2, budget - MIN_SLICE_BITS) == b)
    if bool(exact.all()):
        return MIN_SLICE_BITS, True
    return None if bool(exact.any()) else (budget // 2, False)


def _pair_product(leading: torch.Tensor, rest: torch.Tensor, b: torch.Tensor, path: tuple[int, bool]) -> tuple:
    """:func:`golden.eft.dd_matmul`'s pair from ``a = leading + rest`` split on :func:`_slice_bits`' ``path``: the
    one-slice path's two products, or the two-slice path's three (``b`` split likewise), in its order."""
    bits, one_slice = path
    if one_slice:
        return eft.matmul(leading, b), eft.matmul(rest, b)
    b0 = eft.leading_slice(b, -2, bits)
    lo = eft.matmul(leading, b - b0)
    hi = eft.matmul(leading, b0)
    lo += eft.matmul(rest, b)
    return hi, lo


def _split_product(x: torch.Tensor, peak: torch.Tensor, b: torch.Tensor, by_key: bool):
    """``x @ b`` as :func:`golden.eft.dd_matmul`'s pair (``x`` split by rows, or with ``by_key`` its transpose's
    split, ``x^T @ b``); None where the fast path would take another branch."""
    path = _slice_bits(b, x.shape[-2] if by_key else x.shape[-1])
    sigma = None if path is None else _sigma(peak, path[0])
    if path is None or sigma is None:
        return None
    leading, rest = torch.empty_like(x), torch.empty_like(x)
    grid, options = _grid(x)
    _split[grid](x, sigma.contiguous(), leading, rest, x.shape[-2], x.shape[-1], BY_KEY=by_key, **options)
    if by_key:
        return _pair_product(leading.mT, rest.mT, b, path)
    return _pair_product(leading, rest, b, path)


@dataclasses.dataclass(frozen=True)
class _RangedBlock(fast._Block):
    """A block with its rows' key ranges (absolute) on the device."""

    first: torch.Tensor
    last: torch.Tensor


def _ranged_blocks(problem):
    first, last = problem.device_ranges
    return [_RangedBlock(block.rows, block.keys, block.mask, block.empty, first[block.rows], last[block.rows])
            for block in _ORIGINAL["blocks"](problem)]


def _forward(q, k, v, block, scale):
    magnitude = abs(scale)
    if magnitude == 0.0:
        return _torch("_forward", q, k, v, block, scale)
    hi, lo = eft.dd_matmul(q, (k if scale >= 0 else -k).mT)
    rows_per_pair, n_keys = hi.shape[-2], hi.shape[-1]
    grid, options = _grid(hi)
    n_rows = hi.shape[:-1].numel()
    tile_max = torch.empty(n_rows, grid[1], dtype=torch.float64, device=hi.device)
    tile_arg = torch.empty(n_rows, grid[1], dtype=torch.int64, device=hi.device)
    _scores[grid](hi, lo, block.first, block.last, tile_max, tile_arg, rows_per_pair, n_keys, block.keys.start,
                  **options)
    shape = hi.shape[:-1]
    best = tile_max.argmax(1, keepdim=True)
    pivot = tile_arg.gather(1, best)[:, 0].view(shape)
    empty = block.empty
    row_max = torch.where(empty, 0.0, tile_max.gather(1, best)[:, 0].view(shape))
    at = pivot[..., None]
    at_pivot = torch.where(empty, 0.0, lo.gather(-1, at).squeeze(-1) * magnitude)
    tile_sum = torch.empty_like(tile_max)
    _exponentials[grid](hi, lo, block.first, block.last, row_max.contiguous(), pivot.contiguous(),
                        _scalar(magnitude, hi.device), tile_sum, tile_max, rows_per_pair, n_keys, block.keys.start,
                        **options)
    e = hi
    excess = tile_sum.sum(1).view(shape) + torch.expm1(at_pivot)
    at_value = torch.where(empty, 0.0, torch.exp(at_pivot))
    e.scatter_(-1, at, at_value[..., None])
    denominator = 1.0 + excess
    peak = torch.maximum(tile_max.amax(1).view(shape), at_value) / denominator
    path = _slice_bits(v, n_keys)
    sigma = None if path is None else _sigma(peak, path[0])
    if path is None or sigma is None:
        return _torch("_forward_from_e", e, denominator, v, pivot, empty, row_max, excess, magnitude)
    leading, rest = torch.empty_like(e), torch.empty_like(e)
    column_max = torch.empty(grid[0], n_keys, dtype=torch.float64, device=e.device)
    _probabilities[grid](e, denominator.contiguous(), sigma.contiguous(), leading, rest, column_max, rows_per_pair,
                         n_keys, **options)
    p = e
    out_hi, out_lo = _pair_product(leading, rest, v, path)
    max_hi, max_lo = eft.two_prod(row_max, magnitude)
    lse_hi, sum_lo = eft.two_sum(max_hi, torch.log1p(excess))
    result = fast._Forward(out_hi + out_lo, p, pivot, empty, torch.where(empty, -torch.inf, lse_hi),
                           torch.where(empty, 0.0, max_lo + sum_lo))
    _COLUMN_MAX[id(p)] = _column_max(column_max, p)
    TAKEN["fused forward"] += 1
    return result


def _forward_from_e(e, denominator, v, pivot, empty, row_max, excess, magnitude):
    """The rest of :func:`golden.fast._forward` from ``E`` where the split takes another branch."""
    p = e.div_(denominator[..., None])
    max_hi, max_lo = eft.two_prod(row_max, magnitude)
    lse_hi, sum_lo = eft.two_sum(max_hi, torch.log1p(excess))
    out_hi, out_lo = eft.dd_matmul(p, v)
    return fast._Forward(out_hi + out_lo, p, pivot, empty, torch.where(empty, -torch.inf, lse_hi),
                         torch.where(empty, 0.0, max_lo + sum_lo))


#: Blocks that took the passes and blocks that kept (part of) the torch code, by step.
TAKEN: collections.Counter = collections.Counter()


def _torch(step: str, *arguments):
    """The torch code of ``step`` for a block the passes do not serve, counted."""
    TAKEN[f"torch {step}"] += 1
    return _ORIGINAL[step](*arguments)


#: P's per-key maxima by row tile, from (C), for the backward's ``P^T dO`` (keyed by the tensor's id).
_COLUMN_MAX: dict[int, torch.Tensor] = {}


def _backward(dout, q, k, v, head, scale):
    column_p = _COLUMN_MAX.pop(id(head.p), None)
    if column_p is None:
        return _torch("_backward", dout, q, k, v, head, scale)
    dp_hi, dp_lo = eft.dd_matmul(dout, v.mT)
    at = head.pivot[..., None]
    anchor_hi = torch.where(head.empty, 0.0, dp_hi.gather(-1, at).squeeze(-1))
    anchor_lo = torch.where(head.empty, 0.0, dp_lo.gather(-1, at).squeeze(-1))
    grid, options = _grid(dp_hi)
    n_rows, n_keys = dp_hi.shape[:-1].numel(), dp_hi.shape[-1]
    shape = dp_hi.shape[:-1]
    tile_sum = torch.empty(n_rows, grid[1], dtype=torch.float64, device=dp_hi.device)
    rows_per_pair = dp_hi.shape[-2]
    _shifted[grid](dp_hi, dp_lo, head.p, anchor_hi.contiguous(), anchor_lo.contiguous(), tile_sum, rows_per_pair,
                   n_keys, **options)
    offset = tile_sum.sum(1).view(shape)
    tile_max = torch.empty_like(tile_sum)
    column_ds = torch.empty(grid[0], n_keys, dtype=torch.float64, device=dp_hi.device)
    _gradients[grid](dp_hi, head.p, offset.contiguous(), tile_max, column_ds, rows_per_pair, n_keys, **options)
    ds = dp_hi
    delta_hi, delta_lo = eft.two_sum(anchor_hi, offset)
    products = (_split_product(ds, tile_max.amax(1).view(shape), k, False),
                _split_product(ds, _column_max(column_ds, ds), q, True),
                _split_product(head.p, column_p, dout, True))
    if any(product is None for product in products):
        return _torch("_backward", dout, q, k, v, head, scale)
    dq_pair, dk_pair, dv_pair = products
    TAKEN["fused backward"] += 1
    return fast._Backward(fast._times(dq_pair, scale), dk_pair, dv_pair, delta_hi + (delta_lo + anchor_lo), offset)


_ORIGINAL = {"blocks": fast.blocks, "_forward": fast._forward, "_backward": fast._backward,
             "_forward_from_e": _forward_from_e}


@contextlib.contextmanager
def fused_passes():
    """:func:`golden.fast.attention` with this probe's passes, for the duration."""
    fast.blocks, fast._forward, fast._backward = _ranged_blocks, _forward, _backward
    TAKEN.clear()
    try:
        yield
    finally:
        fast.blocks, fast._forward, fast._backward = (_ORIGINAL[name] for name in ("blocks", "_forward", "_backward"))
        _COLUMN_MAX.clear()


CHECKS = [
    dict(shape=(2, 70, 70, 4, 2, 32), dtype=torch.float16, causal=True, window=(-1, -1)),
    dict(shape=(1, 33, 130, 3, 1, 40), dtype=torch.bfloat16, causal=False, window=(-1, -1)),
    dict(shape=(1, 129, 65, 2, 2, 64), dtype=torch.float16, causal=False, window=(16, 0)),
    dict(shape=(1, 96, 40, 2, 1, 16), dtype=torch.float32, causal=True, window=(-1, -1)),
    # every input spread over 2^40: no 16-bit matrix is one exact slice, every product takes the two-slice path
    dict(shape=(1, 77, 150, 4, 2, 32), dtype=torch.bfloat16, causal=True, window=(-1, -1), spread=40),
]


def _problem(shape, dtype, causal, window, device, seed=1, spread=0):
    """Normal inputs, each element times ``2**-u`` for ``u`` uniform in ``[0, spread)``."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = shape
    generator = torch.Generator().manual_seed(seed)

    def draw(*size):
        scaled = torch.randn(*size, generator=generator) * 2.0 ** -torch.randint(0, max(spread, 1), size,
                                                                                generator=generator)
        return scaled.to(dtype).to(device)

    q, dout = (draw(batch, seqlen_q, heads_q, head_dim) for _ in range(2))
    k, v = (draw(batch, seqlen_k, heads_kv, head_dim) for _ in range(2))
    return inputs.prepare(q, k, v, dout, softmax_scale=head_dim ** -0.5, causal=causal, window_size=window)


def _differences(fused, plain) -> dict[str, float]:
    """Per output, the largest difference over the largest magnitude of the torch path's values."""
    differences = {}
    for name in ("out", "lse", "delta", "dq", "dk", "dv"):
        a, b = getattr(fused, name), getattr(plain, name)
        finite = torch.isfinite(b)
        assert torch.equal(finite, torch.isfinite(a)), name
        scale = float(b[finite].abs().max()) or 1.0
        differences[name] = float((a[finite] - b[finite]).abs().max()) / scale
    return differences


def _certified(problem, served) -> dict[str, float]:
    return certify.certify(problem, served, rows=16, precision_bits=113, seed=inputs.fingerprint(problem))


def _check(device: str) -> int:
    worst = 0.0
    for block_elements in (fast.BLOCK_ELEMENTS["cpu"], 600):
        fast.BLOCK_ELEMENTS[torch.device(device).type] = block_elements
        for fields in CHECKS:
            problem = _problem(**fields, device=device)
            plain = fast.attention(problem)
            with fused_passes():
                fused = fast.attention(problem)
            differences = _differences(fused, plain)
            worst = max(worst, *differences.values())
            print(json.dumps({"shape": fields["shape"], "block elements": block_elements, "blocks": dict(TAKEN),
                              "relative differences": differences,
                              "certified": _certified(problem, fused)}), flush=True)
    print(f"worst relative difference: {worst:.3g}")
    return 0 if worst <= 1e-13 else 1


def _shape_problem(shape: str, dtype: torch.dtype, device: str):
    causal = shape.endswith("c")
    b, h, s, d = shape.rstrip("c").split("x")
    heads_q, _, heads_kv = h.partition("/")
    return _problem((int(b), int(s), int(s), int(heads_q), int(heads_kv or heads_q), int(d)), dtype, causal,
                    (-1, -1), device)


def _case_problem(name: str, device: str):
    """The golden's inputs of scale case ``name`` of ``device`` (``app.cases.scale``), forward and backward."""
    spec = next(spec for spec in SCALE_CASES[torch.device(device).type] if spec.name == name)
    case = make_case(spec, device)
    return inputs.prepare(case.q, case.k, case.v, case.dout if spec.backward else None, softmax_scale=spec.scale,
                          causal=spec.causal, window_size=spec.window_size, alignment=spec.causal_alignment)


def _time(device: str, problems: dict, profile: bool) -> None:
    """Both float64 passes on each of ``problems`` (name: thunk), timed (the faster of two), compared, certified;
    with ``profile`` the fused pass's CUDA operators."""
    for name, make in problems.items():
        problem = make()
        seconds = {}
        plain = fast.attention(problem)
        seconds["torch"] = min(timed(device, fast.attention, problem)[1] for _ in range(2))
        with fused_passes():
            fused = fast.attention(problem)
            seconds["fused"] = min(timed(device, fast.attention, problem)[1] for _ in range(2))
            if profile and device == "cuda":
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    fast.attention(problem)
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=50),
                      flush=True)
        print(json.dumps({"problem": name, "dtype": str(problem.dtypes[0]), "float64 pass s": seconds,
                          "blocks": dict(TAKEN), "relative differences": _differences(fused, plain),
                          "certified": _certified(problem, fused)}), flush=True)
        del problem, plain, fused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", nargs="*", default=[])
    parser.add_argument("--cases", nargs="*", default=[])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--profile", action="store_true")
    arguments = parser.parse_args()
    if arguments.check:
        return _check(arguments.device)
    device, dtype = arguments.device, getattr(torch, arguments.dtype)
    problems = {shape: functools.partial(_shape_problem, shape, dtype, device) for shape in arguments.shapes}
    problems.update({name: functools.partial(_case_problem, name, device) for name in arguments.cases})
    _time(device, problems, arguments.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())

