"""The fast golden's elementwise work of one block in Triton passes (on CUDA), its products left to cuBLAS.

:func:`golden.fast.attention` evaluates a block of query rows as float64 products (cuBLAS) with elementwise work
between them; in torch that work is some forty operations per block, each a pass over the block's memory.  On
CUDA it runs as six passes here, each reading what it needs once (on an H100 the six long scale cases' float64
passes took 7.6 s instead of 10.8, docs/benchmarks.md), the steps of :mod:`golden.fast` unchanged:

* forward: (A) :func:`pivots`: ``S' = hi + lo`` renormalised (``two_sum``), hidden keys ``-inf``, and each row's
  largest score and its first key (torch's ``argmax``, exactly); (B) :func:`exponentials`: the logits
  ``((S'_hi - m'_i) + S'_lo) |scale|``, ``E = exp`` (0 at the pivot and on hidden keys), each row's sum and
  maximum; (C) :func:`probabilities`: ``P = E / l`` and its split ``P = P0 + R`` into the leading slice of
  :func:`golden.eft.leading_slice` and the rest, for ``P V``, with each key's maximum of ``P``;
* backward: (D) :func:`shifted`: ``(dP_hi - r_hi) + (dP_lo - r_lo)`` and the offsets ``b_i``; (E)
  :func:`gradients`: ``dS = (shifted - b) P`` with its row and key maxima; (F) :func:`split`: the leading
  slices of ``dS`` by rows (``dS K``), of ``dS`` by keys (``dS^T Q``) and of ``P`` by keys (``P^T dO``);
* :func:`accumulate`: the double-double sums of ``dK`` and ``dV`` over the blocks.

Every launch turns off contraction into fused multiply-adds (:func:`core.triton_tiles.grid`): the error-free
transformations are exact only with every rounding.  The pivot, ``P`` and the splits equal the torch
evaluation's bit for bit; the row sums (``l_i``, ``b_i``) go through one partial value per (row, key tile),
reduced by torch, in another order than torch's sums, so the outputs equal the torch evaluation's to float64
rounding, and :func:`golden.certify.certify` measures them as it measures the torch path's.  Where the passes
serve, and how they take scalars, follows :mod:`core.triton_passes`; under ``TRITON_INTERPRET=1`` they run on the
CPU, which is how the tests check them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fa2_verify.core import triton_passes, triton_tiles
from fa2_verify.core.triton_tiles import pair_positions, visible_keys

#: The kernels' size arguments, not specialized: one compiled variant serves every block of every case.
_SHAPE = ["rows_per_pair", "n_keys"]
_SIZES = [*_SHAPE, "key_start"]

#: Elements of one program of :func:`accumulate`.
_ACCUMULATE_BLOCK = 1024


@triton.jit(do_not_specialize=_SIZES)
def _pivots(HI, LO, FIRST, LAST, TILE_MAX, TILE_ARG, rows_per_pair, n_keys, key_start,
            BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(A) in place: HI <- fl(hi + lo) (hidden keys -inf), LO <- its error; each tile's maximum and first key."""
    rows, local, keys, row_ok, inside, at = pair_positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    visible = visible_keys(FIRST, LAST, local, keys, row_ok, inside, key_start)
    hi = tl.load(HI + at, mask=inside, other=0.0)
    lo = tl.load(LO + at, mask=inside, other=0.0)
    s = hi + lo
    bb = s - hi
    error = (hi - (s - bb)) + (lo - bb)
    s = tl.where(visible, s, -float("inf"))
    tl.store(HI + at, s, mask=inside)
    tl.store(LO + at, error, mask=inside)
    largest, first_key = tl.max(tl.where(inside, s, -float("inf")), 1, return_indices=True,
                                return_indices_tie_break_left=True)
    partial = rows * tl.num_programs(1) + tl.program_id(1)
    tl.store(TILE_MAX + partial, largest, mask=row_ok)
    tl.store(TILE_ARG + partial, first_key + tl.program_id(1) * BLOCK_K, mask=row_ok)


@triton.jit(do_not_specialize=_SIZES)
def _exponentials(HI, LO, FIRST, LAST, ROW_MAX, PIVOT, MAGNITUDE, TILE_SUM, TILE_MAX, rows_per_pair, n_keys,
                  key_start, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(B) in place: HI <- exp(((S_hi - m) + S_lo) |scale|), 0 at the pivot and on hidden keys; each tile's sum
    and maximum."""
    rows, local, keys, row_ok, inside, at = pair_positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    visible = visible_keys(FIRST, LAST, local, keys, row_ok, inside, key_start)
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


@triton.jit(do_not_specialize=_SHAPE)
def _probabilities(E, DENOMINATOR, SIGMA, LEADING, REST, KEY_MAX, rows_per_pair, n_keys,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(C) in place: E <- P = E / l; LEADING <- P's leading slice by its row's ``sigma``, REST <- P - LEADING;
    KEY_MAX[program row, key] = the largest ``P`` of the program's rows."""
    rows, local, keys, row_ok, inside, at = pair_positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    p = tl.load(E + at, mask=inside, other=0.0) / tl.load(DENOMINATOR + rows, mask=row_ok, other=1.0)[:, None]
    sigma = tl.load(SIGMA + rows, mask=row_ok, other=1.0)[:, None]
    leading = (p + sigma) - sigma
    tl.store(E + at, p, mask=inside)
    tl.store(LEADING + at, leading, mask=inside)
    tl.store(REST + at, p - leading, mask=inside)
    tl.store(KEY_MAX + tl.program_id(0) * n_keys + keys, tl.max(tl.where(inside, p, 0.0), 0), mask=keys < n_keys)


@triton.jit(do_not_specialize=_SHAPE)
def _shifted(DP_HI, DP_LO, P, ANCHOR_HI, ANCHOR_LO, TILE_SUM, rows_per_pair, n_keys,
             BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(D) in place: DP_HI <- (dP_hi - r_hi) + (dP_lo - r_lo); each tile's sum of P times it."""
    rows, local, keys, row_ok, inside, at = pair_positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    anchor_hi = tl.load(ANCHOR_HI + rows, mask=row_ok, other=0.0)[:, None]
    anchor_lo = tl.load(ANCHOR_LO + rows, mask=row_ok, other=0.0)[:, None]
    shifted = ((tl.load(DP_HI + at, mask=inside, other=0.0) - anchor_hi)
               + (tl.load(DP_LO + at, mask=inside, other=0.0) - anchor_lo))
    tl.store(DP_HI + at, shifted, mask=inside)
    p = tl.load(P + at, mask=inside, other=0.0)
    tl.store(TILE_SUM + rows * tl.num_programs(1) + tl.program_id(1), tl.sum(p * shifted, 1), mask=row_ok)


@triton.jit(do_not_specialize=_SHAPE)
def _gradients(SHIFTED, P, OFFSET, TILE_MAX, KEY_MAX, rows_per_pair, n_keys,
               BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(E) in place: SHIFTED <- dS = (shifted - b) P; each tile's largest |dS| per row, and per key per program."""
    rows, local, keys, row_ok, inside, at = pair_positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    offset = tl.load(OFFSET + rows, mask=row_ok, other=0.0)[:, None]
    ds = (tl.load(SHIFTED + at, mask=inside, other=0.0) - offset) * tl.load(P + at, mask=inside, other=0.0)
    tl.store(SHIFTED + at, ds, mask=inside)
    magnitude = tl.where(inside, tl.abs(ds), 0.0)
    tl.store(TILE_MAX + rows * tl.num_programs(1) + tl.program_id(1), tl.max(magnitude, 1), mask=row_ok)
    tl.store(KEY_MAX + tl.program_id(0) * n_keys + keys, tl.max(magnitude, 0), mask=keys < n_keys)


@triton.jit(do_not_specialize=_SHAPE)
def _split(X, SIGMA, LEADING, REST, rows_per_pair, n_keys, BY_KEY: tl.constexpr,
           BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(F) LEADING <- X's leading slice by ``sigma`` per row (per key of each matrix with BY_KEY), REST <- the
    rest."""
    rows, local, keys, row_ok, inside, at = pair_positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    x = tl.load(X + at, mask=inside, other=0.0)
    if BY_KEY:
        pair = rows // rows_per_pair
        sigma = tl.load(SIGMA + pair[:, None] * n_keys + keys[None, :], mask=inside, other=1.0)
    else:
        sigma = tl.load(SIGMA + rows, mask=row_ok, other=1.0)[:, None]
    leading = (x + sigma) - sigma
    tl.store(LEADING + at, leading, mask=inside)
    tl.store(REST + at, x - leading, mask=inside)


@triton.jit(do_not_specialize=["per_pair", "total_stride", "start"])
def _accumulate(TOTAL_HI, TOTAL_LO, TERM_HI, TERM_LO, per_pair, total_stride, start, BLOCK: tl.constexpr):
    """Double-double TOTAL[pair, start + i] += TERM[pair, i] for the ``per_pair`` elements of each pair."""
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < per_pair
    pair = tl.program_id(0).to(tl.int64)
    into = pair * total_stride + start + offsets
    term = pair * per_pair + offsets
    a = tl.load(TOTAL_HI + into, mask=ok, other=0.0)
    b = tl.load(TERM_HI + term, mask=ok, other=0.0)
    s = a + b
    bb = s - a
    error = (a - (s - bb)) + (b - bb)
    tl.store(TOTAL_HI + into, s, mask=ok)
    lo = tl.load(TOTAL_LO + into, mask=ok, other=0.0) + (error + tl.load(TERM_LO + term, mask=ok, other=0.0))
    tl.store(TOTAL_LO + into, lo, mask=ok)


def _partials(block: torch.Tensor, grid: tuple[int, int], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """One value per (row of the stack, key tile)."""
    return torch.empty(block.shape[:-1].numel(), grid[1], dtype=dtype, device=block.device)


def _key_maxima(partial: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Each key's maximum per matrix (..., K) of a stack, from the programs' values per key."""
    return partial.view(*block.shape[:-2], -1, block.shape[-1]).amax(-2)


def pivots(hi: torch.Tensor, lo: torch.Tensor, first: torch.Tensor, last: torch.Tensor,
           key_start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A) for a stack ``hi + lo`` (..., R, K) of scores over keys ``key_start ..``, rows seeing ``first[r] ..
    last[r]``: in place ``hi, lo = two_sum(hi, lo)``, hidden keys ``-inf`` in ``hi``; returns each row's first
    key of the largest ``hi`` (block-local; 0 on a row that sees none) and that score (..., R)."""
    grid, keywords = triton_tiles.grid(hi.shape, exact=True)
    tile_max, tile_key = _partials(hi, grid), _partials(hi, grid, torch.int64)
    with triton_passes.on_device_of(hi):
        _pivots[grid](hi, lo, first, last, tile_max, tile_key, hi.shape[-2], hi.shape[-1], key_start, **keywords)
    best = tile_max.argmax(1, keepdim=True)
    shape = hi.shape[:-1]
    return tile_key.gather(1, best).view(shape), tile_max.gather(1, best).view(shape)


def exponentials(hi: torch.Tensor, lo: torch.Tensor, first: torch.Tensor, last: torch.Tensor, key_start: int,
                 row_max: torch.Tensor, pivot: torch.Tensor, magnitude: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B) in place ``hi <- E`` (0 at each row's ``pivot`` and on hidden keys); returns each row's sum and maximum
    of ``E`` (..., R)."""
    grid, keywords = triton_tiles.grid(hi.shape, exact=True)
    tile_sum, tile_max = _partials(hi, grid), _partials(hi, grid)
    with triton_passes.on_device_of(hi):
        _exponentials[grid](hi, lo, first, last, row_max.contiguous(), pivot.contiguous(),
                            triton_passes.float64_scalars(hi.device, magnitude), tile_sum, tile_max,
                            hi.shape[-2], hi.shape[-1], key_start, **keywords)
    shape = hi.shape[:-1]
    return tile_sum.sum(1).view(shape), tile_max.amax(1).view(shape)


def probabilities(e: torch.Tensor, denominator: torch.Tensor,
                  sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(C) in place ``e <- P = e / denominator``; returns ``P``'s split by its rows' ``sigma`` (..., R)
    (:meth:`golden.eft.Columns.sigma`), leading slice and rest, and each key's maximum of ``P`` per matrix (..., K)."""
    grid, keywords = triton_tiles.grid(e.shape, exact=True)
    leading, rest = torch.empty_like(e), torch.empty_like(e)
    key_max = torch.empty(grid[0], e.shape[-1], dtype=torch.float64, device=e.device)
    with triton_passes.on_device_of(e):
        _probabilities[grid](e, denominator.contiguous(), sigma.contiguous(), leading, rest, key_max,
                             e.shape[-2], e.shape[-1], **keywords)
    return leading, rest, _key_maxima(key_max, e)


def shifted(dp_hi: torch.Tensor, dp_lo: torch.Tensor, p: torch.Tensor, anchor_hi: torch.Tensor,
            anchor_lo: torch.Tensor) -> torch.Tensor:
    """(D) in place ``dp_hi <- (dp_hi - anchor_hi) + (dp_lo - anchor_lo)``; returns each row's
    ``b_i = sum_j P_ij shifted_ij`` (..., R)."""
    grid, keywords = triton_tiles.grid(p.shape, exact=True)
    tile_sum = _partials(p, grid)
    with triton_passes.on_device_of(p):
        _shifted[grid](dp_hi, dp_lo, p, anchor_hi.contiguous(), anchor_lo.contiguous(), tile_sum,
                       p.shape[-2], p.shape[-1], **keywords)
    return tile_sum.sum(1).view(p.shape[:-1])


def gradients(shifted_: torch.Tensor, p: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E) in place ``shifted_ <- dS = (shifted_ - offset) P``; returns each row's (..., R) and each key's
    (..., K) largest ``|dS|``."""
    grid, keywords = triton_tiles.grid(p.shape, exact=True)
    tile_max = _partials(p, grid)
    key_max = torch.empty(grid[0], p.shape[-1], dtype=torch.float64, device=p.device)
    with triton_passes.on_device_of(p):
        _gradients[grid](shifted_, p, offset.contiguous(), tile_max, key_max, p.shape[-2], p.shape[-1], **keywords)
    return tile_max.amax(1).view(p.shape[:-1]), _key_maxima(key_max, p)


def split(x: torch.Tensor, sigma: torch.Tensor, by_key: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(F) ``x``'s leading slice and rest, by its rows' ``sigma`` (..., R), or with ``by_key`` by its keys'
    (..., K): :func:`golden.eft.leading_slice` of ``x``, or of ``x^T``, transposed back."""
    grid, keywords = triton_tiles.grid(x.shape, exact=True)
    leading, rest = torch.empty_like(x), torch.empty_like(x)
    with triton_passes.on_device_of(x):
        _split[grid](x, sigma.contiguous(), leading, rest, x.shape[-2], x.shape[-1], BY_KEY=by_key, **keywords)
    return leading, rest


def accumulate(total: tuple[torch.Tensor, torch.Tensor], term: tuple[torch.Tensor, torch.Tensor],
               rows: slice) -> None:
    """Double-double ``total[..., rows, :] += term`` in place, as :func:`golden.fast` does it in torch, bit for
    bit: ``total`` (..., N, D) contiguous, ``term`` (..., len(rows), D)."""
    total_hi, total_lo = total
    term_hi, term_lo = (part.contiguous() for part in term)
    pairs = total_hi.shape[:-2].numel()
    per_pair = term_hi.shape[-2] * term_hi.shape[-1]
    if pairs == 0 or per_pair == 0:
        return
    grid = (pairs, triton.cdiv(per_pair, _ACCUMULATE_BLOCK))
    with triton_passes.on_device_of(total_hi):
        _accumulate[grid](total_hi, total_lo, term_hi, term_lo, per_pair, total_hi.shape[-2] * total_hi.shape[-1],
                          rows.start * total_hi.shape[-1], BLOCK=_ACCUMULATE_BLOCK, enable_fp_fusion=False)


def compiles(device: torch.device) -> bool:
    """Whether every pass, in each of its compiled variants, builds and runs on ``device``
    (:func:`core.triton_passes.trial_runs`)."""
    return triton_passes.trial_runs(_trial, device)


def _trial(device: torch.device) -> None:
    block, ends, row = triton_passes.trial_block(device)
    pivot, row_max = pivots(block, block.clone(), ends, ends, 0)
    exponentials(block, block.clone(), ends, ends, 0, row_max, pivot, 1.0)
    probabilities(block, row + 1.0, row + 1.0)
    shifted(block, block.clone(), block.clone(), row, row)
    _, key_max = gradients(block, block.clone(), row)
    split(block, key_max + 1.0, True)
    split(block, row + 1.0, False)
    accumulate((block.clone(), block.clone()), (block, block), slice(0, 4))
