"""The error model's weight matrices of one block of scores, in three Triton passes (on CUDA).

:func:`verify.error_model.bounds_and_flush_shares` evaluates eqs. (1) to (12)
of docs/error-model.md block by block: float64 products of a block's query
rows and keys (cuBLAS), elementwise work over the (rows x keys) results,
and products of the resulting weight matrices with ``|V|``, ``|K|``, ``|Q|``
and ``|dO|``.  In torch that elementwise work is about two dozen operations
per block, each a pass over the block's memory.  Here it is three passes,
each reading the products it needs once and writing the weights the next
products take (on an H100 the six long scale cases' bounds took 3.7 s
instead of 6.1, docs/benchmarks.md):

* :func:`forward` from the scores ``S = scale Q K^T`` and the magnitudes
  ``A = gamma_{d+2} scale |Q| |K|^T``: the row maximum ``M_i`` of
  ``|S_ij|`` over the visible keys, then, with ``P_ij = exp(S_ij - LSE_i)``
  and (1) ``Delta_ij = A_ij + u_a (|S_ij| + M_i) + u_f``, the weights
  ``P_ij Delta_ij + c_i P_ij`` of (2)'s product with ``|V|`` and
  ``sum_j P_ij Delta_ij`` of (2) and (3);
* :func:`backward` from ``S``, ``A``, ``dP - D`` and
  ``G = gamma_d |dO| |V|^T + B^D``: (4)'s ``E_ij = Delta_ij + u_a |S_ij| +
  B^L_i + u_a |LSE_i|``, the weights of (7), (8) and (9) (``B^dS`` of (6)
  without its ``(2u + 2u_a) |dS|``, which joins the products' own
  ``gamma`` terms) and (12)'s ``F^dS``, each 0 on a hidden key.

The two row reductions of :func:`forward` go through one partial value per
(row, key tile), reduced by torch: deterministic, in another order than
torch's own sums, so the bounds equal the torch evaluation's to float64's
resolution (relative 1e-15), not bit for bit.  Partial sums a kernel declares
(eqs. 2b, 7b to 9b) keep the torch evaluation, which forms the signed ``dS``
they need.  Where the passes run, and how they take scalars, follows
:mod:`core.triton_passes`.  Triton's float64 ``exp`` agrees with torch's (no
difference on 2^20 arguments in [-700, 700] on an H100).  Under
``TRITON_INTERPRET=1`` the same kernels run on the CPU, which is how the
tests check them.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from fa2_verify.core import triton_passes, triton_tiles
from fa2_verify.core.triton_tiles import pair_positions, visible_keys

#: The kernels' size arguments, not specialized: one compiled variant per tile serves every block of every case.
_SIZES = ["rows_per_pair", "n_keys", "key_start"]


@triton.jit
def _weights_tile(S, A, LSE, ROW_MAX, UNITS, rows, row_ok, inside, visible, at):
    """A tile's scores ``S``, ``P = exp(S - LSE)`` on its visible keys (else 0) and (1)'s ``Delta``; UNITS starts
    with ``(u_a, u_f)``."""
    u_a, u_f = tl.load(UNITS), tl.load(UNITS + 1)
    s = tl.load(S + at, mask=inside, other=0.0)
    a = tl.load(A + at, mask=inside, other=0.0)
    lse = tl.load(LSE + rows, mask=row_ok, other=0.0)
    row_max = tl.load(ROW_MAX + rows, mask=row_ok, other=0.0)
    p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
    return s, p, a + u_a * (row_max[:, None] + tl.abs(s)) + u_f  # (1)


@triton.jit(do_not_specialize=_SIZES)
def _row_max_tiles(S, FIRST, LAST, PARTIAL, rows_per_pair, n_keys, key_start,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """PARTIAL[r, t] = max(0, max of ``|S_rj|`` over the visible keys of key tile ``t``)."""
    rows, local, keys, row_ok, inside, at = pair_positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    visible = visible_keys(FIRST, LAST, local, keys, row_ok, inside, key_start)
    s = tl.load(S + at, mask=inside, other=0.0)
    largest = tl.max(tl.where(visible, tl.abs(s), 0.0), 1)
    tl.store(PARTIAL + rows * tl.num_programs(1) + tl.program_id(1), largest, mask=row_ok)


@triton.jit(do_not_specialize=_SIZES)
def _forward_weights(S, A, W, FIRST, LAST, LSE, ROW_MAX, COEFFICIENT, PARTIAL, UNITS,
                     rows_per_pair, n_keys, key_start, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """W = P Delta + c P (0 on hidden keys), PARTIAL[r, t] = sum of ``P Delta`` over key tile ``t``; UNITS:
    ``(u_a, u_f)``."""
    rows, local, keys, row_ok, inside, at = pair_positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    visible = visible_keys(FIRST, LAST, local, keys, row_ok, inside, key_start)
    _, p, delta = _weights_tile(S, A, LSE, ROW_MAX, UNITS, rows, row_ok, inside, visible, at)
    coefficient = tl.load(COEFFICIENT + local, mask=row_ok, other=0.0)
    p_delta = p * delta
    tl.store(W + at, p_delta + p * coefficient[:, None], mask=inside)
    tl.store(PARTIAL + rows * tl.num_programs(1) + tl.program_id(1), tl.sum(p_delta, 1), mask=row_ok)


@triton.jit(do_not_specialize=_SIZES)
def _backward_weights(S, A, CENTERED, GRADIENT, FIRST, LAST, LSE, ROW_MAX, ROW_ERROR, FLUSH_ROW,
                      DQ_UNITS, DV_UNITS, DK_UNITS, UNITS, rows_per_pair, n_keys, key_start,
                      FLUSH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """In place: S <- the weights of (8), A <- those of (7), CENTERED (``dP - D``) <- those of (9), and with
    FLUSH, GRADIENT (``gamma_d |dO||V|^T + B^D``) <- (12)'s ``F^dS``; UNITS: ``(u_a, u_f, eta + eta_a, eta_a)``."""
    u_a, eta_centered, eta_a = tl.load(UNITS), tl.load(UNITS + 2), tl.load(UNITS + 3)
    rows, local, keys, row_ok, inside, at = pair_positions(rows_per_pair, n_keys, BLOCK_R, BLOCK_K)
    visible = visible_keys(FIRST, LAST, local, keys, row_ok, inside, key_start)
    s, p, delta = _weights_tile(S, A, LSE, ROW_MAX, UNITS, rows, row_ok, inside, visible, at)
    key_ok = keys < n_keys
    centered = tl.abs(tl.load(CENTERED + at, mask=inside, other=0.0))
    gradient = tl.load(GRADIENT + at, mask=inside, other=0.0)
    row_error = tl.load(ROW_ERROR + rows, mask=row_ok, other=0.0)
    dq_units = tl.load(DQ_UNITS + local, mask=row_ok, other=0.0)
    dv_units = tl.load(DV_UNITS + keys, mask=key_ok, other=0.0)
    dk_units = tl.load(DK_UNITS + keys, mask=key_ok, other=0.0)
    # (4): E_ij = Delta_ij + u_a |S_ij| + (B^L_i + u_a |LSE_i|)
    error = delta + u_a * tl.abs(s) + row_error[:, None]
    tl.store(A + at, (error + dv_units[None, :]) * p, mask=inside)  # (7)
    # (6) but for its (2u + 2u_a) |dS_ij| and its constant eta terms
    b_ds = tl.where(visible, (gradient + error * centered) * p + eta_centered * centered, 0.0)
    ds_abs = centered * p
    tl.store(S + at, b_ds + ds_abs * dq_units[:, None], mask=inside)  # (8)
    tl.store(CENTERED + at, b_ds + ds_abs * dk_units[None, :], mask=inside)  # (9)
    if FLUSH:
        # (12): F^dS_ij = (P_ij sum_c |dO_ic| F^O_ic + eta_a |dP_ij - D_i|) [j visible from i]
        flush_row = tl.load(FLUSH_ROW + rows, mask=row_ok, other=0.0)
        tl.store(GRADIENT + at, tl.where(visible, p * flush_row[:, None] + eta_a * centered, 0.0), mask=inside)


def forward(scores: torch.Tensor, magnitudes: torch.Tensor, first: torch.Tensor, last: torch.Tensor,
            key_start: int, lse: torch.Tensor, coefficient: torch.Tensor, u_a: float,
            u_f: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(weights, M, sum_j P_ij Delta_ij)`` of one block: ``weights`` (C, G, R, K) as ``scores``, the two row
    quantities (C, G, R, 1).

    ``scores`` and ``magnitudes`` are ``S`` and ``A`` (C, G, R, K), contiguous float64, over keys
    ``key_start..key_start + K - 1``; ``first``, ``last`` (R,) the keys each of the block's rows sees; ``lse``
    (C, G, R) the golden LSE (0 on a row that sees no key); ``coefficient`` (R,) ``c_i`` of (2).
    """
    rows_per_pair, n_keys = scores.shape[-2], scores.shape[-1]
    n_rows = scores.shape[:-1].numel()
    shape = (*scores.shape[:-1], 1)
    if n_keys == 0:  # rows that see no key
        return torch.empty_like(scores), scores.new_zeros(shape), scores.new_zeros(shape)
    grid, tile = triton_tiles.grid(scores.shape)
    partial = torch.empty(n_rows, grid[1], dtype=torch.float64, device=scores.device)
    weights = torch.empty_like(scores)
    with triton_passes.on_device_of(scores):
        _row_max_tiles[grid](scores, first, last, partial, rows_per_pair, n_keys, key_start, **tile)
        row_max = partial.amax(1)
        units = triton_passes.float64_scalars(scores.device, u_a, u_f)
        _forward_weights[grid](scores, magnitudes, weights, first, last, lse.contiguous(), row_max,
                               coefficient.contiguous(), partial, units, rows_per_pair, n_keys, key_start, **tile)
    return weights, row_max.view(shape), partial.sum(1).view(shape)


def backward(scores: torch.Tensor, magnitudes: torch.Tensor, centered: torch.Tensor, gradient: torch.Tensor,
             first: torch.Tensor, last: torch.Tensor, key_start: int, rows: dict[str, torch.Tensor],
             keys: dict[str, torch.Tensor], units: tuple[float, float, float, float],
             flush_row: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The weights of (7), (8), (9) and, with ``flush_row``, (12)'s ``F^dS``, (C, G, R, K) each,
    written over the four products (``dv``, ``dq``, ``dk``, ``flush``).

    ``scores``, ``magnitudes`` as for :func:`forward` (unchanged since); ``centered`` ``dP - D`` and
    ``gradient`` ``gamma_d |dO| |V|^T + B^D_i``, (C, G, R, K) contiguous float64.  ``rows``: ``lse``,
    ``row_max`` (:func:`forward`'s ``M``) and ``error`` (``B^L_i + u_a |LSE_i|``) per (C, G, R), and
    ``dq_units`` (R,), (8)'s ``2u + 2u_a + gamma_{n_i+2}``; ``keys``: ``dv_units``, ``dk_units`` (K,), (7)'s
    ``u + u_G + gamma_{N_j+G}`` and (9)'s ``2u + 2u_a + u_G + gamma_{N_j+G+2}``; ``units``:
    ``(u_a, u_f, eta + eta_a, eta_a)``; ``flush_row`` (C, G, R): ``sum_c |dO_ic| F^O_ic`` of (12).
    """
    rows_per_pair, n_keys = scores.shape[-2], scores.shape[-1]
    lse, row_max, error = (rows[name].contiguous() for name in ("lse", "row_max", "error"))
    if n_keys:
        grid, tile = triton_tiles.grid(scores.shape)
        with triton_passes.on_device_of(scores):
            _backward_weights[grid](
                scores, magnitudes, centered, gradient, first, last, lse, row_max, error,
                lse if flush_row is None else flush_row.contiguous(), rows["dq_units"].contiguous(),
                keys["dv_units"].contiguous(), keys["dk_units"].contiguous(),
                triton_passes.float64_scalars(scores.device, *units),
                rows_per_pair, n_keys, key_start, FLUSH=flush_row is not None, **tile)
    weights = {"dv": magnitudes, "dq": scores, "dk": centered}
    if flush_row is not None:
        weights["flush"] = gradient
    return weights


def compiles(device: torch.device) -> bool:
    """Whether the three passes, in each of their compiled variants (with and without flush shares), build and
    run on ``device`` (:func:`core.triton_passes.trial_runs`)."""
    return triton_passes.trial_runs(_trial, device)


def _trial(device: torch.device) -> None:
    scores, ends, rows = triton_passes.trial_block(device)
    _, row_max, _ = forward(scores, scores.clone(), ends, ends, 0, rows, rows[0, 0], 0.0, 0.0)
    for flush_row in (rows, None):
        backward(scores, scores.clone(), scores.clone(), scores.clone(), ends, ends, 0,
                 {"lse": rows, "row_max": row_max[..., 0], "error": rows, "dq_units": rows[0, 0]},
                 {"dv_units": scores[0, 0, 0], "dk_units": scores[0, 0, 0]}, (0.0, 0.0, 0.0, 0.0), flush_row)
