"""Fused Triton kernels for the error model's first-order bounds, beside the torch evaluation.

Prototype for issue 30's six-case target: :func:`verify.error_model.bounds_and_flush_shares` evaluates
eqs. (1) to (3) of docs/error-model.md as about a dozen float64 passes over each (rows x keys) block.  Here one
Triton kernel per block of query rows walks its visible keys once, flash-style, with four float64 ``tl.dot``
(DMMA on SM80/SM90) per tile and only per-row accumulators, because the row's maximum ``M_i`` and the
constants of (1) factor out of the sums over keys:

    sum_j P_ij Delta_ij |V_jc|       = sum_j W_ij |V_jc| + (u_a M_i + u_f) sum_j P_ij |V_jc|
    sum_j P_ij Delta_ij              = sum_j W_ij + (u_a M_i + u_f) sum_j P_ij
    W_ij = P_ij (gamma_{d+2} scale (|Q| |K|^T)_ij + u_a |S_ij|)

and ``sum_(j visible) |V_jc|`` is a difference of prefix sums over the keys.  The epilogue (O(rows x d)) is
eqs. (2), (3), (10) and (11) as the torch code has them.  The backward's kernels take those rows' constants
(``M_i``, ``B^L_i``, ``B^D_i`` of eq. 5): a row-major one (:func:`_dq_sums`) forms eqs. (4), (6) and (8) per
tile with five ``tl.dot``, a key-major one (:func:`_dkv_sums`, FA2's backward order) eqs. (7) and (9) with six,
summing the GQA group's heads inside; the rows that see a key give its ``sum |dO|`` and ``sum |Q|`` terms as
prefix sums.  The flush shares (12) ride along, one more ``tl.dot`` in each backward kernel.  Equal to the
torch bounds and shares up to float64 summation order (relative 1e-12 checked here; terms of order ``eta_a``
= 2^-126 are below that resolution in the bounds, not in the shares); MHA/GQA heads, masks by
``first``/``last`` key per row (causal, windows), FA2's partial sums (no split-KV) only::

    PYTHONPATH=. TRITON_INTERPRET=1 python lab/probes/probe_fused_bounds.py --check          # CPU, interpreter
    PYTHONPATH=. python lab/probes/probe_fused_bounds.py --device cuda --shape 1,1,1,131072,128 --causal

``--check`` compares fused and torch bounds and shares on small cases (exit 1 on a mismatch); the second form
times :func:`fused_bounds_and_flush_shares` against ``bounds_and_flush_shares`` on one case (``synced.timed``,
the golden untimed; ``--forward`` for the forward's bounds only), the kernels in each of a few tiles, one JSON
line per tile.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl
from synced import timed

from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.verify import check, error_model


def _units(scale: float, gamma_logit: float, u_a: float, gamma_head: float, eta_centered: float, eta_a: float,
           device) -> torch.Tensor:
    """The kernels' scalars as float64 on ``device``: a compiled kernel takes a Python float as float32, whose
    rounding of ``scale`` alone moves every bound by about 1e-8 relative."""
    return torch.tensor([scale, gamma_logit * scale, u_a, gamma_head, eta_centered, eta_a], dtype=torch.float64,
                        device=device)


@triton.jit
def _backward_units(UNITS):
    """``scale, gamma_{d+2} scale, u_a, gamma_d, eta + eta_a, eta_a`` from :func:`_units`."""
    return (tl.load(UNITS), tl.load(UNITS + 1), tl.load(UNITS + 2), tl.load(UNITS + 3), tl.load(UNITS + 4),
            tl.load(UNITS + 5))


@triton.jit
def _tiles(A, B, base, index, seq_stride, length, cols, col_ok):
    """Rows ``index`` (< ``length``) of one head of ``A`` and ``B`` from offset ``base``, (len(index), BLOCK_D)
    each, 0 past the ends."""
    at = base + index[:, None] * seq_stride + cols[None, :]
    both = (index < length)[:, None] & col_ok[None, :]
    return tl.load(A + at, mask=both, other=0.0), tl.load(B + at, mask=both, other=0.0)


@triton.jit
def _span(first, last, BLOCK: tl.constexpr):
    """``(start, stop)``: the indices from ``min(first)`` rounded down to a multiple of ``BLOCK`` to ``max(last)``,
    the span of keys (rows) a block of rows (keys) sees."""
    return (tl.min(first, 0) // BLOCK) * BLOCK, tl.max(last, 0) + 1


@triton.jit
def _forward_sums(Q, K, V, LSE, FIRST, LAST, ACC_W, ACC_P, ROW_SUMS,
                  seqlen_q, seqlen_k, head_dim, group, heads_q,
                  q_batch, q_seq, q_head, k_batch, k_seq, k_head, UNITS,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Per row: ``sum_j W_ij |V_jc|``, ``sum_j P_ij |V_jc|`` (ACC_W, ACC_P, head-major (B*H, seqlen_q, BLOCK_D)),
    and ``sum_j W_ij``, ``sum_j P_ij``, ``max_j |S_ij|`` (ROW_SUMS (B*H, seqlen_q, 3)) over the visible keys;
    UNITS: :func:`_units`."""
    scale, gamma_scale, u_a = tl.load(UNITS), tl.load(UNITS + 1), tl.load(UNITS + 2)
    block, pair = tl.program_id(0), tl.program_id(1)
    batch, head = pair // heads_q, pair % heads_q
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    row_ok, col_ok = rows < seqlen_q, cols < head_dim
    q = tl.load(Q + batch * q_batch + head * q_head + rows[:, None] * q_seq + cols[None, :],
                mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    first = tl.load(FIRST + rows, mask=row_ok, other=seqlen_k)
    last = tl.load(LAST + rows, mask=row_ok, other=-1)
    lse = tl.load(LSE + pair * seqlen_q + rows, mask=row_ok, other=0.0)
    scaled, magnitudes = q * scale, tl.abs(q) * gamma_scale
    acc_w = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    acc_p = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    sum_w = tl.zeros((BLOCK_M,), dtype=tl.float64)
    sum_p = tl.zeros((BLOCK_M,), dtype=tl.float64)
    largest = tl.zeros((BLOCK_M,), dtype=tl.float64)
    kv_base = batch * k_batch + (head // group) * k_head
    start, stop = _span(first, last, BLOCK_N)
    for key_start in range(start, stop, BLOCK_N):
        keys = key_start + tl.arange(0, BLOCK_N)
        k, v = _tiles(K, V, kv_base, keys, k_seq, seqlen_k, cols, col_ok)
        v = tl.abs(v)
        s = tl.dot(scaled, tl.trans(k))
        a = tl.dot(magnitudes, tl.trans(tl.abs(k)))
        visible = (keys[None, :] >= first[:, None]) & (keys[None, :] <= last[:, None])
        s_abs = tl.abs(s)
        largest = tl.maximum(largest, tl.max(tl.where(visible, s_abs, 0.0), 1))
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        w = p * (a + u_a * s_abs)
        acc_w += tl.dot(w, v)
        acc_p += tl.dot(p, v)
        sum_w += tl.sum(w, 1)
        sum_p += tl.sum(p, 1)
    at = pair * seqlen_q * BLOCK_D + rows[:, None] * BLOCK_D + cols[None, :]
    tl.store(ACC_W + at, acc_w, mask=row_ok[:, None])
    tl.store(ACC_P + at, acc_p, mask=row_ok[:, None])
    sums = ROW_SUMS + (pair * seqlen_q + rows) * 3
    tl.store(sums, sum_w, mask=row_ok)
    tl.store(sums + 1, sum_p, mask=row_ok)
    tl.store(sums + 2, largest, mask=row_ok)


def _forward_raw(case, golden, tile: tuple[int, int, int, int] | None) -> dict[str, torch.Tensor]:
    """The first-order bounds (2) and (3) before (10) and (11), with the row quantities the backward's bounds
    reuse: ``row_max`` (M_i), ``lse_rows`` (the golden LSE, 0 on rows of no key), the float64 inputs, and
    ``flush_out``, (12)'s ``F^O``."""
    spec, device = case.spec, case.q.device
    dtype = spec.torch_dtype
    u, u_a = error_model.unit_roundoff(dtype), error_model.accumulation_unit(dtype)
    u_f, u_lse = 4 * u_a, error_model.lse_storage_unit(dtype)
    eta, eta_a = error_model.underflow_unit(dtype), error_model.flush_unit(dtype)
    eta_lse = error_model.underflow_unit(torch.float32)
    batch, seqlen_q, heads_q, head_dim = case.q.shape
    seqlen_k, heads_kv = case.k.shape[1], case.k.shape[2]
    first, last = spec.visible_ranges(device)
    n = (last - first + 1).clamp(min=0).to(torch.float64)
    gamma_logit = float(error_model._gamma(head_dim + 2, u_a))
    gamma_out, log_n = error_model._gamma(2 * n, u_a), torch.log(n.clamp(min=1))
    q, k, v = (t.detach().to(torch.float64).contiguous() for t in (case.q, case.k, case.v))
    lse = golden.lse.detach().to(device, torch.float64)  # (B, H, S)
    nonempty = n > 0
    lse = torch.where(nonempty, lse, 0.0).contiguous()
    block_d = max(16, triton.next_power_of_2(head_dim))
    acc_w = torch.empty(batch * heads_q, seqlen_q, block_d, dtype=torch.float64, device=device)
    acc_p = torch.empty_like(acc_w)
    row_sums = torch.empty(batch * heads_q, seqlen_q, 3, dtype=torch.float64, device=device)
    options = _launch_options(tile, block_d)
    grid = (triton.cdiv(seqlen_q, options["BLOCK_M"]), batch * heads_q)
    _forward_sums[grid](q, k, v, lse, first.contiguous(), last.contiguous(), acc_w, acc_p, row_sums,
                        seqlen_q, seqlen_k, head_dim, heads_q // heads_kv, heads_q,
                        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                        _units(spec.scale, gamma_logit, u_a, 0.0, 0.0, 0.0, device),
                        **options)
    # back to the contract layouts: (B, S, H, d) and (B, H, S)
    acc_w = acc_w[..., :head_dim].view(batch, heads_q, seqlen_q, head_dim).transpose(1, 2)
    acc_p = acc_p[..., :head_dim].view(batch, heads_q, seqlen_q, head_dim).transpose(1, 2)
    sum_w, sum_p, row_max = row_sums.view(batch, heads_q, seqlen_q, 3).unbind(-1)
    constant = u_a * row_max + u_f  # (B, H, S)
    p_delta_sum = sum_w + constant * sum_p
    visible_v = _visible_sums(v.abs(), first, last, heads_q // heads_kv)

    def row(per_row: torch.Tensor) -> torch.Tensor:
        """A per-query-row (S,) tensor over (B, S, H, d)."""
        return per_row[None, :, None, None]

    def per_head(rows: torch.Tensor) -> torch.Tensor:
        """A (B, H, S) tensor over (B, S, H, d)."""
        return rows.transpose(1, 2)[..., None]

    o_abs = golden.out.detach().to(device, torch.float64).abs()
    bound_out = (
        acc_w + per_head(constant) * acc_p + row(u + gamma_out) * acc_p
        + (row(u + gamma_out + u_a) + per_head(p_delta_sum)) * o_abs
        + (eta + eta_a) * visible_v + eta + row(3 * n * eta_a)
    )
    bound_lse = (p_delta_sum + gamma_out + u_f * (1 + log_n) + 3 * u_a * (lse.abs() + row_max) + u_lse * lse.abs())
    bound_lse = torch.where(nonempty, bound_lse, eta_lse)
    # (12): F^O_ic = eta_a sum_(j visible) |V_jc| + 3 n_i eta_a
    flush_out = eta_a * visible_v + row(3 * n * eta_a)
    return {"out": bound_out, "lse": bound_lse, "flush_out": flush_out, "row_max": row_max, "lse_rows": lse,
            "first": first, "last": last, "n": n, "v": v, "k": k, "q": q}


def _visible_sums(values: torch.Tensor, first: torch.Tensor, last: torch.Tensor, group: int) -> torch.Tensor:
    """``sum_(j visible from i) values_jc``, (B, S, H, d), of ``values`` (B, seqlen_k, H_kv, d), each kv head's
    sums repeated over its ``group`` query heads: a difference of prefix sums over the keys ``first[i]..last[i]``
    (0 for a row that sees none)."""
    seqlen_k = values.shape[1]
    prefix = torch.nn.functional.pad(values.cumsum(1), (0, 0, 0, 0, 1, 0))
    sums = prefix[:, (last + 1).clamp(min=0, max=seqlen_k)] - prefix[:, first.clamp(max=seqlen_k)]
    return (sums * (last >= first)[None, :, None, None]).repeat_interleave(group, dim=2)


def _finish(bounds: dict[str, torch.Tensor], golden, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Eqs. (10) and (11): each first-order bound times ``1 + 4u``, plus the golden's certified error."""
    for name, bound in bounds.items():
        bound *= 1 + error_model.SECOND_ORDER_UNITS * error_model.unit_roundoff(dtype)
        certified = float(golden.certified_bound.get(name, 0.0))
        if certified:
            bound += certified * error_model._largest_finite(getattr(golden, name))
    return bounds


@triton.jit
def _row_terms(LSE, ROW_ERROR, B_DELTA, D_ROWS, FLUSH_ROW, per_row, row_ok):
    """The backward's per-row constants of rows ``per_row`` (head-major offsets); 0 on rows past the end."""
    return (tl.load(LSE + per_row, mask=row_ok, other=0.0), tl.load(ROW_ERROR + per_row, mask=row_ok, other=0.0),
            tl.load(B_DELTA + per_row, mask=row_ok, other=0.0), tl.load(D_ROWS + per_row, mask=row_ok, other=0.0),
            tl.load(FLUSH_ROW + per_row, mask=row_ok, other=0.0))


@triton.jit
def _tile_terms(q, dout, k, v, keys, first, last, lse, row_error, b_delta, d_rows, flush_row,
                scale, gamma_scale, u_a, gamma_head, eta_centered, eta_a):
    """One (rows x keys) tile of the backward's bounds: ``P``, ``|dP - D|``, ``B^dS`` without its
    ``(2u + 2u_a) |dS|`` (eqs. 4 to 6, 0 where the key is hidden), ``E`` (eq. 4) and ``F^dS`` (eq. 12)."""
    s = tl.dot(q * scale, tl.trans(k))
    visible = (keys[None, :] >= first[:, None]) & (keys[None, :] <= last[:, None])
    p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
    # (4): E_ij = gamma_{d+2} scale (|Q||K|^T)_ij + 2 u_a |S_ij| + the row's constant part
    p_error = tl.dot(tl.abs(q) * gamma_scale, tl.trans(tl.abs(k))) + 2 * u_a * tl.abs(s) + row_error[:, None]
    centered = tl.abs(tl.dot(dout, tl.trans(v)) - d_rows[:, None])
    # (6) but for its (2u + 2u_a) |dS_ij| and constant eta terms
    b_ds = p * (tl.dot(tl.abs(dout) * gamma_head, tl.trans(tl.abs(v))) + b_delta[:, None] + p_error * centered)
    b_ds = tl.where(visible, b_ds + eta_centered * centered, 0.0)
    # (12): F^dS_ij = (P_ij sum_c |dO_ic| F^O_ic + eta_a |dP_ij - D_i|) [j visible from i]
    flush_ds = tl.where(visible, p * flush_row[:, None] + eta_a * centered, 0.0)
    return p, centered, b_ds, p_error, flush_ds


@triton.jit
def _dq_sums(Q, K, V, DO, LSE, ROW_ERROR, B_DELTA, D_ROWS, FLUSH_ROW, FIRST, LAST, DQ_UNITS, ACC, ACC_FLUSH,
             seqlen_q, seqlen_k, head_dim, group, heads_q,
             q_batch, q_seq, q_head, k_batch, k_seq, k_head, UNITS,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Per row: ``sum_j w_ij |K_jc|`` with ``w = B^dS + (2u + 2u_a + gamma_{n_i+2}) |dS|`` (eqs. 4 to 6 and 8),
    ACC head-major (B*H, seqlen_q, BLOCK_D), and (12)'s ``sum_j F^dS_ij |K_jc|`` (ACC_FLUSH).  ROW_ERROR:
    ``u_a M_i + u_f + B^L_i + u_a |LSE_i|``, the part of (4)'s ``E_ij`` constant along the row; FLUSH_ROW:
    ``sum_c |dO_ic| F^O_ic``; DQ_UNITS (seqlen_q,): ``2u + 2u_a + gamma_{n_i+2}``; UNITS: :func:`_units`."""
    scale, gamma_scale, u_a, gamma_head, eta_centered, eta_a = _backward_units(UNITS)
    block, pair = tl.program_id(0), tl.program_id(1)
    batch, head = pair // heads_q, pair % heads_q
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    row_ok, col_ok = rows < seqlen_q, cols < head_dim
    q, dout = _tiles(Q, DO, batch * q_batch + head * q_head, rows, q_seq, seqlen_q, cols, col_ok)
    first = tl.load(FIRST + rows, mask=row_ok, other=seqlen_k)
    last = tl.load(LAST + rows, mask=row_ok, other=-1)
    lse, row_error, b_delta, d_rows, flush_row = _row_terms(LSE, ROW_ERROR, B_DELTA, D_ROWS, FLUSH_ROW,
                                                            pair * seqlen_q + rows, row_ok)
    dq_units = tl.load(DQ_UNITS + rows, mask=row_ok, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    acc_flush = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    kv_base = batch * k_batch + (head // group) * k_head
    start, stop = _span(first, last, BLOCK_N)
    for key_start in range(start, stop, BLOCK_N):
        keys = key_start + tl.arange(0, BLOCK_N)
        k, v = _tiles(K, V, kv_base, keys, k_seq, seqlen_k, cols, col_ok)
        p, centered, b_ds, _, flush_ds = _tile_terms(q, dout, k, v, keys, first, last, lse, row_error, b_delta,
                                                     d_rows, flush_row, scale, gamma_scale, u_a, gamma_head,
                                                     eta_centered, eta_a)
        acc += tl.dot(b_ds + p * centered * dq_units[:, None], tl.abs(k))
        acc_flush += tl.dot(flush_ds, tl.abs(k))
    at = pair * seqlen_q * BLOCK_D + rows[:, None] * BLOCK_D + cols[None, :]
    tl.store(ACC + at, acc, mask=row_ok[:, None])
    tl.store(ACC_FLUSH + at, acc_flush, mask=row_ok[:, None])


def _row_constants(case, golden, tile: tuple[int, int, int, int] | None) -> dict:
    """:func:`_forward_raw` with what the backward's kernels take per row: ``row_error``, the part of (4)'s
    ``E_ij`` constant along row ``i`` (``u_a M_i + u_f + B^L_i + u_a |LSE_i|``), ``b_delta`` (eq. 5),
    ``d_rows`` (``D_i``), ``flush_row`` (``sum_c |dO_ic| F^O_ic``, eq. 12), all (B, H, S); ``dout`` in float64;
    ``gamma_logit`` and ``gamma_head``."""
    device, dtype = case.q.device, case.spec.torch_dtype
    u_a = error_model.accumulation_unit(dtype)
    head_dim = case.q.shape[-1]
    rows = _forward_raw(case, golden, tile)
    rows["gamma_logit"] = float(error_model._gamma(head_dim + 2, u_a))
    rows["gamma_head"] = gamma_head = float(error_model._gamma(head_dim, u_a))
    rows["dout"] = dout = case.dout.detach().to(torch.float64).contiguous()
    out = golden.out.detach().to(device, torch.float64)
    dout_abs = dout.abs()
    # (5): B^D_i = sum_c |dO_ic| B^O_ic + gamma_d sum_c |dO_ic| |O_ic|, (B, H, S)
    b_delta = (dout_abs * rows["out"]).sum(-1) + gamma_head * (dout_abs * out.abs()).sum(-1)
    rows["b_delta"] = b_delta.transpose(1, 2).contiguous()
    if golden.delta is not None:
        rows["d_rows"] = golden.delta.detach().to(device, torch.float64).contiguous()
    else:
        rows["d_rows"] = (dout * out).sum(-1).transpose(1, 2).contiguous()
    row_error = u_a * rows["row_max"] + 4 * u_a + rows["lse"] + u_a * rows["lse_rows"].abs()
    rows["row_error"] = row_error.contiguous()
    rows["flush_row"] = (dout_abs * rows["flush_out"]).sum(-1).transpose(1, 2).contiguous()
    return rows


@triton.jit
def _dkv_sums(Q, K, V, DO, LSE, ROW_ERROR, B_DELTA, D_ROWS, FLUSH_ROW, FIRST, LAST, FIRST_ROW, LAST_ROW, DV_UNITS,
              DK_UNITS, ACC_DV, ACC_DK, ACC_FLUSH,
              seqlen_q, seqlen_k, head_dim, group, heads_q, heads_kv,
              q_batch, q_seq, q_head, k_batch, k_seq, k_head, UNITS,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Per key, over the group's query heads and the rows that see it: ``sum_(h,i) (E_hij + units_j) P_hij |dO_hic|``
    (eq. 7) and ``sum_(h,i) (B^dS_hij + units'_j |dS_hij|) |Q_hic|`` (eq. 9), ACC_DV and ACC_DK head-major
    (B*H_kv, seqlen_k, BLOCK_D), and (12)'s ``sum_(h,i) F^dS_hij |Q_hic|`` (ACC_FLUSH).  FIRST_ROW, LAST_ROW: the
    rows that see each key; DV_UNITS, DK_UNITS (seqlen_k,): ``u + u_G + gamma_{N_j+G}`` and
    ``2u + 2u_a + u_G + gamma_{N_j+G+2}``; UNITS: :func:`_units`."""
    scale, gamma_scale, u_a, gamma_head, eta_centered, eta_a = _backward_units(UNITS)
    block, pair = tl.program_id(0), tl.program_id(1)
    batch, kv_head = pair // heads_kv, pair % heads_kv
    keys = block * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    key_ok, col_ok = keys < seqlen_k, cols < head_dim
    k, v = _tiles(K, V, batch * k_batch + kv_head * k_head, keys, k_seq, seqlen_k, cols, col_ok)
    dv_units = tl.load(DV_UNITS + keys, mask=key_ok, other=0.0)
    dk_units = tl.load(DK_UNITS + keys, mask=key_ok, other=0.0)
    first_row = tl.load(FIRST_ROW + keys, mask=key_ok, other=seqlen_q)
    last_row = tl.load(LAST_ROW + keys, mask=key_ok, other=-1)
    start, stop = _span(first_row, last_row, BLOCK_M)
    acc_dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float64)
    acc_dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float64)
    acc_flush = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float64)
    for member in range(0, group):
        head = kv_head * group + member
        for row_start in range(start, stop, BLOCK_M):
            rows = row_start + tl.arange(0, BLOCK_M)
            row_ok = rows < seqlen_q
            q, dout = _tiles(Q, DO, batch * q_batch + head * q_head, rows, q_seq, seqlen_q, cols, col_ok)
            first = tl.load(FIRST + rows, mask=row_ok, other=seqlen_k)
            last = tl.load(LAST + rows, mask=row_ok, other=-1)
            lse, row_error, b_delta, d_rows, flush_row = _row_terms(
                LSE, ROW_ERROR, B_DELTA, D_ROWS, FLUSH_ROW, (batch * heads_q + head) * seqlen_q + rows, row_ok)
            p, centered, b_ds, p_error, flush_ds = _tile_terms(q, dout, k, v, keys, first, last, lse, row_error,
                                                               b_delta, d_rows, flush_row, scale, gamma_scale,
                                                               u_a, gamma_head, eta_centered, eta_a)
            acc_dv += tl.dot(tl.trans((p_error + dv_units[None, :]) * p), tl.abs(dout))
            acc_dk += tl.dot(tl.trans(b_ds + p * centered * dk_units[None, :]), tl.abs(q))
            acc_flush += tl.dot(tl.trans(flush_ds), tl.abs(q))
    at = pair * seqlen_k * BLOCK_D + keys[:, None] * BLOCK_D + cols[None, :]
    tl.store(ACC_DV + at, acc_dv, mask=key_ok[:, None])
    tl.store(ACC_DK + at, acc_dk, mask=key_ok[:, None])
    tl.store(ACC_FLUSH + at, acc_flush, mask=key_ok[:, None])


def _dq_terms(case, rows: dict, tile: tuple[int, int, int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (8) before (10) and (11), and (12)'s ``F^dQ``, (B, S, H, d): one :func:`_dq_sums` launch."""
    spec, device = case.spec, case.q.device
    dtype = spec.torch_dtype
    u, u_a = error_model.unit_roundoff(dtype), error_model.accumulation_unit(dtype)
    eta, eta_a = error_model.underflow_unit(dtype), error_model.flush_unit(dtype)
    batch, seqlen_q, heads_q, head_dim = case.q.shape
    seqlen_k, heads_kv = case.k.shape[1], case.k.shape[2]
    first, last, n, q, k = (rows[name] for name in ("first", "last", "n", "q", "k"))
    block_d = max(16, triton.next_power_of_2(head_dim))
    acc = torch.empty(batch * heads_q, seqlen_q, block_d, dtype=torch.float64, device=device)
    acc_flush = torch.empty_like(acc)
    options = _launch_options(tile, block_d)
    _dq_sums[(triton.cdiv(seqlen_q, options["BLOCK_M"]), batch * heads_q)](
        q, k, rows["v"], rows["dout"], rows["lse_rows"], rows["row_error"], rows["b_delta"], rows["d_rows"],
        rows["flush_row"], first.contiguous(), last.contiguous(),
        (2 * u + 2 * u_a + error_model._gamma(n + 2, u_a)).contiguous(), acc, acc_flush,
        seqlen_q, seqlen_k, head_dim, heads_q // heads_kv, heads_q,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        _units(spec.scale, rows["gamma_logit"], u_a, rows["gamma_head"], eta + eta_a, eta_a, device), **options)

    def contract(head_major: torch.Tensor) -> torch.Tensor:
        return head_major[..., :head_dim].view(batch, heads_q, seqlen_q, head_dim).transpose(1, 2)

    visible_k = _visible_sums(k.abs(), first, last, heads_q // heads_kv)
    eta_a_ds = eta_a * (2 * head_dim + 2)
    dq_flushes = (3 * (n + 2) * (n > 0) * max(1.0, spec.scale) * eta_a)[None, :, None, None]
    bound = (spec.scale * (contract(acc) + (eta + eta_a_ds) * visible_k)
             + u * rows["golden"].dq.detach().to(device, torch.float64).abs() + eta + dq_flushes)
    flush = spec.scale * (contract(acc_flush) + eta_a_ds * visible_k) + dq_flushes
    return bound, flush


def _rows_seeing(values: torch.Tensor, first_row: torch.Tensor, last_row: torch.Tensor, group: int) -> torch.Tensor:
    """``sum_((h,i) sees j) values_hic``, (B, seqlen_k, H_kv, d), of ``values`` (B, S, H, d): the group's heads
    summed, then a difference of prefix sums over the rows ``first_row[j]..last_row[j]`` (none when empty)."""
    batch, seqlen_q, heads_q, head_dim = values.shape
    summed = values.view(batch, seqlen_q, heads_q // group, group, head_dim).sum(3)
    prefix = torch.nn.functional.pad(summed.cumsum(1), (0, 0, 0, 0, 1, 0))
    seen = (last_row >= first_row)[None, :, None, None]
    return (prefix[:, (last_row + 1).clamp(min=0, max=seqlen_q)] - prefix[:, first_row.clamp(max=seqlen_q)]) * seen


def _dkv_terms(case, rows: dict, tile: tuple[int, int, int, int] | None) -> dict[str, torch.Tensor]:
    """Eqs. (7) and (9) before (10) and (11), and (12)'s ``F^dV``, ``F^dK``, (B, seqlen_k, H_kv, d): one key-major
    :func:`_dkv_sums` launch, the rows that see each key summed by prefix sums."""
    spec, device = case.spec, case.q.device
    dtype = spec.torch_dtype
    u, u_a = error_model.unit_roundoff(dtype), error_model.accumulation_unit(dtype)
    eta, eta_a = error_model.underflow_unit(dtype), error_model.flush_unit(dtype)
    batch, seqlen_q, heads_q, head_dim = case.q.shape
    seqlen_k, heads_kv = case.k.shape[1], case.k.shape[2]
    group = heads_q // heads_kv
    first, last, q, k, v, dout = (rows[name] for name in ("first", "last", "q", "k", "v", "dout"))
    first_row, last_row = error_model.rows_seeing_keys(first, last, seqlen_k)
    n_key = group * (last_row - first_row + 1).clamp(min=0).to(torch.float64)
    u_group = u if group > 1 else 0.0
    dv_units = u + u_group + error_model._gamma(n_key + group, u_a)
    dk_units = 2 * u + 2 * u_a + u_group + error_model._gamma(n_key + group + 2, u_a)
    block_d = max(16, triton.next_power_of_2(head_dim))
    accumulators = [torch.empty(batch * heads_kv, seqlen_k, block_d, dtype=torch.float64, device=device)
                    for _ in range(3)]
    options = _launch_options(tile, block_d)
    _dkv_sums[(triton.cdiv(seqlen_k, options["BLOCK_N"]), batch * heads_kv)](
        q, k, v, dout, rows["lse_rows"], rows["row_error"], rows["b_delta"], rows["d_rows"], rows["flush_row"],
        first.contiguous(), last.contiguous(), first_row.contiguous(), last_row.contiguous(),
        dv_units.contiguous(), dk_units.contiguous(), *accumulators,
        seqlen_q, seqlen_k, head_dim, group, heads_q, heads_kv,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        _units(spec.scale, rows["gamma_logit"], u_a, rows["gamma_head"], eta + eta_a, eta_a, device), **options)
    acc_dv, acc_dk, acc_flush = (acc[..., :head_dim].view(batch, heads_kv, seqlen_k, head_dim).transpose(1, 2)
                                 for acc in accumulators)
    seen = (n_key > 0).to(torch.float64)[None, :, None, None]
    n_key = n_key[None, :, None, None]
    eta_group = eta + (group if group > 1 else 0) * eta * seen
    eta_a_ds = eta_a * (2 * head_dim + 2)
    seeing_dout = _rows_seeing(dout.abs(), first_row, last_row, group)
    seeing_q = _rows_seeing(q.abs(), first_row, last_row, group)
    dv_flushes = 3 * (n_key + group) * seen * eta_a
    dk_flushes = 3 * (n_key + group + 2) * seen * max(1.0, spec.scale) * eta_a
    golden = rows["golden"]
    return {
        "dv": (acc_dv + (eta + eta_a) * seeing_dout + u * golden.dv.detach().to(device, torch.float64).abs()
               + eta_group + dv_flushes),
        "dk": (spec.scale * (acc_dk + (eta + eta_a_ds) * seeing_q)
               + u * golden.dk.detach().to(device, torch.float64).abs() + eta_group + dk_flushes),
        "flush_dv": eta_a * seeing_dout + dv_flushes,
        "flush_dk": spec.scale * (acc_flush + eta_a_ds * seeing_q) + dk_flushes,
    }


def fused_bounds_and_flush_shares(case, golden, tile: tuple[int, int, int, int] | None = None):
    """:func:`verify.error_model.bounds_and_flush_shares` for FA2's partial sums (no split-KV): the bounds of
    every output the golden has, with (10) and (11), and their flush shares (12), from the three kernels."""
    if golden.dq is None:
        rows = _forward_raw(case, golden, tile)
    else:
        rows = _row_constants(case, golden, tile)
    rows["golden"] = golden
    bounds = {"out": rows["out"], "lse": rows["lse"]}
    shares = {"out": rows["flush_out"], "lse": torch.zeros_like(rows["lse"])}
    if golden.dq is not None:
        bounds["dq"], shares["dq"] = _dq_terms(case, rows, tile)
        terms = _dkv_terms(case, rows, tile)
        bounds.update(dv=terms["dv"], dk=terms["dk"])
        shares.update(dv=terms["flush_dv"], dk=terms["flush_dk"])
    return _finish(bounds, golden, case.spec.torch_dtype), shares


def default_tile(block_d: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a padded head dim: two float64 (BLOCK_M x BLOCK_D)
    accumulators and two float64 copies of Q's rows live in registers, so the rows shrink as the head dim grows;
    one stage, because float64 dot operands staged in shared memory overflow an H100's 227 KiB at three."""
    return (64 if block_d <= 64 else 32 if block_d <= 128 else 16), 32, 4, 1


def _launch_options(tile: tuple[int, int, int, int] | None, block_d: int) -> dict:
    """The kernels' tile keywords: ``tile`` or :func:`default_tile`."""
    block_m, block_n, warps, stages = tile or default_tile(block_d)
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=warps, num_stages=stages)


#: Tiles the timing mode tries besides the default, (BLOCK_M, BLOCK_N, num_warps, num_stages).
TILES = [(16, 32, 4, 1), (32, 32, 4, 2), (32, 64, 4, 1), (64, 32, 4, 1), (64, 64, 8, 1), (16, 64, 4, 1)]

CHECKS = [
    dict(batch=2, seqlen_q=70, seqlen_k=70, heads_q=4, heads_kv=2, head_dim=32, dtype="float16", causal=True),
    dict(batch=1, seqlen_q=33, seqlen_k=130, heads_q=3, heads_kv=1, head_dim=40, dtype="bfloat16"),
    dict(batch=1, seqlen_q=129, seqlen_k=65, heads_q=2, heads_kv=2, head_dim=64, dtype="float16",
         window_size=(16, 0)),
    dict(batch=1, seqlen_q=96, seqlen_k=100, heads_q=1, heads_kv=1, head_dim=8, dtype="float32", causal=True),
    # whole rows of tiny values, where the eta and eta_a terms carry the bounds
    dict(batch=1, seqlen_q=80, seqlen_k=80, heads_q=4, heads_kv=2, head_dim=16, dtype="float16", causal=True,
         generator="subnormals"),
]


def _differences(fused: tuple[dict, dict], reference: tuple[dict, dict]) -> dict[str, float]:
    """The largest relative difference of each bound and each flush share (0 where both are 0)."""
    differences = {}
    for kind, fused_part, reference_part in zip(("bound", "flush share"), fused, reference):
        for name, expected in reference_part.items():
            gap = (fused_part[name] - expected).abs()
            differences[f"{kind} {name}"] = float(torch.where(gap > 0, gap / expected.abs(), 0.0).max())
    return differences


@triton.jit
def _primitives(X, Y, EXP, DOT, BLOCK: tl.constexpr):
    """``e^X`` and ``X @ Y`` of one float64 (BLOCK x BLOCK) tile, as the kernels above form them."""
    at = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x, y = tl.load(X + at), tl.load(Y + at)
    tl.store(EXP + at, tl.exp(x))
    tl.store(DOT + at, tl.dot(x, y))


def _check_primitives(device: str) -> float:
    """The largest relative error of the kernels' float64 ``exp`` and ``tl.dot`` against torch's."""
    generator = torch.Generator(device="cpu").manual_seed(1)
    x, y = (torch.randn(32, 32, dtype=torch.float64, generator=generator).to(device) for _ in range(2))
    exp, dot = torch.empty_like(x), torch.empty_like(x)
    _primitives[(1,)](x, y, exp, dot, BLOCK=32)
    errors = {"exp": float(((exp - x.exp()) / x.exp()).abs().max()),
              "dot": float(((dot - x @ y).abs() / (x.abs() @ y.abs())).max())}
    print(json.dumps({"float64 primitives, max relative error": errors}))
    return max(errors.values())


def _check(device: str) -> int:
    worst = _check_primitives(device)
    for fields in CHECKS:
        case = make_case(CaseSpec(**fields, seed=1), device)
        golden = check.golden_for(case)
        differences = _differences(fused_bounds_and_flush_shares(case, golden),
                                   error_model.bounds_and_flush_shares(case, golden))
        worst = max(worst, *differences.values())
        print(json.dumps({"case": fields, "max relative difference": differences}))
    print(f"worst relative difference: {worst:.3g}")
    return 0 if worst <= 1e-12 else 1


def _time(device: str, shape: str, causal: bool, dtype: str, backward: bool) -> None:
    batch, heads_q, heads_kv, seqlen, head_dim = (int(part) for part in shape.split(","))
    spec = CaseSpec(batch=batch, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=heads_q, heads_kv=heads_kv,
                    head_dim=head_dim, dtype=dtype, causal=causal, backward=backward, seed=1)
    case = make_case(spec, device)
    golden = check.golden_for(case)
    reference, torch_seconds = timed(device, error_model.bounds_and_flush_shares, case, golden)
    block_d = max(16, triton.next_power_of_2(head_dim))
    for tile in dict.fromkeys([default_tile(block_d), *TILES]):
        try:
            fused_bounds_and_flush_shares(case, golden, tile)  # compile
        except triton.runtime.errors.OutOfResources as error:
            print(json.dumps({"shape": shape, "tile": tile, "out of resources": str(error)}))
            continue
        fused, fused_seconds = timed(device, fused_bounds_and_flush_shares, case, golden, tile)
        print(json.dumps({"shape": shape, "causal": causal, "dtype": dtype, "backward": backward, "tile": tile,
                          "torch s": round(torch_seconds, 4), "fused s": round(fused_seconds, 4),
                          "max relative difference": max(_differences(fused, reference).values()),
                          "device": torch.cuda.get_device_name() if device.startswith("cuda") else device}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the torch bounds on small cases")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default="1,1,1,16384,128", help="batch,heads_q,heads_kv,seqlen,head_dim")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--forward", action="store_true", help="time the forward's bounds only")
    arguments = parser.parse_args()
    if arguments.check:
        return _check(arguments.device)
    _time(arguments.device, arguments.shape, arguments.causal, arguments.dtype, not arguments.forward)
    return 0


if __name__ == "__main__":
    sys.exit(main())
