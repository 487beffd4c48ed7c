"""A model FlashAttention-2 kernel in the case dtype: the rounding noise a correct kernel makes on given inputs.

The statistical and local verdicts (:mod:`verify.noise_verdicts`;
docs/error-model.md, "Statistical and local verdicts") measure a kernel's
error in units of the error this model makes on the same inputs, against
the same golden.  It does what Dao 2023, "FlashAttention-2", does with the
inputs' dtype ``T``, with every row's keys in one block:

* forward (Algorithm 1): ``S = scale Q K^T`` in float32 from the ``T``
  values (exact products, float32 accumulation), ``m = rowmax S``,
  ``P~ = exp(S - m)`` and ``l = rowsum P~`` in float32, ``O = (fl_T(P~) V) / l``
  accumulated in float32 and rounded to ``T``, ``LSE = m + log l`` in float32;
* backward (Algorithm 2): from the kernel's own ``O`` and ``LSE``, as the
  contract hands them to its backward (the model's where the kernel gives no
  LSE), so the noise of a gradient is that of a backward given those forward
  outputs: ``P = exp(S - LSE)``, ``dV = fl_T(P)^T dO``, ``dP = dO V^T``,
  ``D = rowsum(dO * O)``, ``dS = fl_T(P (dP - D))``, ``dQ = scale dS K``,
  ``dK = scale dS^T Q``, accumulated in float32 over every row and every query
  head of a group and rounded to ``T`` once.

A kernel's declared partial sums (:class:`verify.error_model.PartialSums`,
eqs. 2b, 7b to 9b) are made the same way, so the model's noise includes what
the kernel's declared numerics add: ``out_splits`` S > 1 splits each row's
visible keys into S contiguous ranges, each normalized, rounded to ``T`` and
combined by the weights ``exp(LSE_s - LSE)`` in float32; ``dkv_rows`` rounds
dK and dV to ``T`` after each block of that many query rows of each query
head (heads in increasing order within their group); ``dq_keys`` rounds dQ
after each block of that many keys.

It also returns each row's ``M_i = max_j |S_ij|`` over its visible keys
(``logit_max``, float32, (batch, heads_q, seqlen_q); 0 for a row that sees no
key), which decides where the verdicts' premise holds.

It runs one block of query rows at a time over the keys they see
(:func:`verify.error_model.row_blocks`), like :mod:`verify.lowprec`, so no
(seqlen_q x seqlen_k) tensor is formed.
"""

from __future__ import annotations

import torch

from fa2_verify.core.case import Case
from fa2_verify.verify.error_model import PartialSums, row_blocks, work_elements


def _rows_per_block(seqlen_k: int, work: int, dkv_rows: int | None) -> int:
    """Query rows per block: ``work`` elements of (rows x keys), a multiple of ``dkv_rows`` when declared."""
    rows = max(1, work // max(seqlen_k, 1))
    if dkv_rows is None:
        return rows
    return max(dkv_rows, rows - rows % dkv_rows)


def _key_splits(first: torch.Tensor, last: torch.Tensor, splits: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each row's visible keys ``first..last`` cut into ``splits`` contiguous ranges of (nearly) equal length."""
    count = (last - first + 1).clamp(min=0)
    edges = [first + (count * s).div(splits, rounding_mode="floor") for s in range(splits + 1)]
    return [(edges[s], edges[s + 1] - 1) for s in range(splits)]


def _softmax_block(logits: torch.Tensor, visible: torch.Tensor, values: torch.Tensor, dtype: torch.dtype):
    """``(O in float32 before its rounding, LSE)`` of one set of visible keys per row (Algorithm 1's numerics).

    A row with no visible key gives ``O = 0`` and ``LSE = -inf``.
    """
    masked = torch.where(visible, logits, float("-inf"))
    row_max = masked.amax(-1, keepdim=True)
    any_visible = visible.any(-1, keepdim=True)
    row_max = torch.where(any_visible, row_max, 0.0)
    p = torch.where(visible, torch.exp(masked - row_max), 0.0)
    denominator = p.sum(-1, keepdim=True)
    numerator = p.to(dtype).float() @ values
    out = torch.where(any_visible, numerator / torch.where(any_visible, denominator, 1.0), 0.0)
    lse = torch.where(any_visible, row_max + torch.log(denominator), float("-inf"))[..., 0]
    return out, lse


def _forward(logits, visible, key_index, first, last, values, dtype, splits):
    """``(O rounded to T, LSE)`` for one row block: one softmax, or ``splits`` combined by their LSEs (eq. 2b)."""
    if splits is None or splits <= 1:
        out, lse = _softmax_block(logits, visible, values, dtype)
        return out.to(dtype), lse
    parts = []
    for start, stop in _key_splits(first, last, splits):
        in_split = visible & (key_index >= start[:, None]) & (key_index <= stop[:, None])
        out_s, lse_s = _softmax_block(logits, in_split, values, dtype)
        parts.append((out_s.to(dtype).float(), lse_s))
    lses = torch.stack([lse_s for _, lse_s in parts])
    lse = torch.logsumexp(lses, 0)
    finite = torch.isfinite(lse)
    weights = torch.where(finite, torch.exp(lses - torch.where(finite, lse, 0.0)), 0.0)
    out = sum(w[..., None] * out_s for w, (out_s, _) in zip(weights, parts))
    return out.to(dtype), lse


def model_attention(case: Case, partials: PartialSums = PartialSums(),
                    forward: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """``out``, ``lse`` (float32), ``logit_max`` and, when the case has a backward, ``dq``, ``dk``, ``dv`` of the
    model kernel; the backward from ``forward["out"]`` and ``forward["lse"]`` (the kernel's) where given."""
    spec = case.spec
    dtype, scale = spec.torch_dtype, spec.scale
    group = spec.heads_q // spec.heads_kv
    device = case.q.device
    first, last = spec.visible_ranges(device)
    out = torch.zeros_like(case.q)
    lse = torch.full((spec.batch, spec.heads_q, spec.seqlen_q), float("-inf"), dtype=torch.float32, device=device)
    logit_max = torch.zeros_like(lse)
    result = {"out": out, "lse": lse, "logit_max": logit_max}
    forward = forward or {}
    given_out, given_lse = forward.get("out"), forward.get("lse")
    per_head = spec.backward and partials.dkv_rows is not None
    if spec.backward:
        dq = torch.zeros_like(case.q)
        # dK and dV: float32 sums rounded once (FA2), or T partial sums rounded per block of rows (eqs. 7b, 9b)
        dk_sum = torch.zeros(case.k.shape, dtype=torch.float32 if not per_head else dtype, device=device)
        dv_sum = torch.zeros_like(dk_sum)
    rows_per_block = _rows_per_block(spec.seqlen_k, max(1, work_elements(device) // spec.heads_q), partials.dkv_rows)
    blocks = row_blocks(first, last, spec.seqlen_k, rows_per_block * max(spec.seqlen_k, 1))
    head_sets = [[h] for h in range(spec.heads_q)] if per_head else [list(range(spec.heads_q))]
    for b in range(spec.batch):
        for heads in head_sets:
            kv_heads = [h // group for h in heads]
            # (heads, keys, head_dim) in float32: the T values, exactly
            keys_all = case.k[b][:, kv_heads].transpose(0, 1).float()
            values_all = case.v[b][:, kv_heads].transpose(0, 1).float()
            for rows, keys in blocks:
                key_index = torch.arange(keys.start, keys.stop, device=device)
                visible = (key_index >= first[rows, None]) & (key_index <= last[rows, None])
                if not bool(visible.any()):
                    continue
                q_rows = case.q[b, rows][:, heads].transpose(0, 1).float()
                k_rows, v_rows = keys_all[:, keys], values_all[:, keys]
                logits = (q_rows @ k_rows.mT) * scale
                o_rows, lse_rows = _forward(logits, visible, key_index, first[rows], last[rows], v_rows, dtype,
                                            partials.out_splits)
                head_span = slice(heads[0], heads[-1] + 1)
                out[b, rows, head_span] = o_rows.transpose(0, 1)
                lse[b, head_span, rows] = lse_rows
                logit_max[b, head_span, rows] = torch.where(visible, logits.abs(), 0.0).amax(-1)
                if not spec.backward:
                    continue
                if given_out is not None:
                    o_rows = given_out[b, rows, head_span].transpose(0, 1)
                if given_lse is not None:
                    lse_rows = given_lse[b, head_span, rows].float()
                dout_rows = case.dout[b, rows][:, heads].transpose(0, 1).float()
                lse_safe = torch.where(torch.isfinite(lse_rows), lse_rows, 0.0)
                p = torch.where(visible, torch.exp(logits - lse_safe[..., None]), 0.0)
                dp = dout_rows @ v_rows.mT
                delta = (dout_rows * o_rows.float()).sum(-1, keepdim=True)
                ds = (p * (dp - delta)).to(dtype).float()
                dq[b, rows, head_span] = _dq(ds, k_rows, key_index, scale, dtype,
                                                         partials.dq_keys).transpose(0, 1)
                p_rounded = p.to(dtype).float()
                if per_head:
                    _add_row_blocks(dv_sum[b, keys, kv_heads[0]], p_rounded[0], dout_rows[0], partials.dkv_rows,
                                    dtype, 1.0)
                    _add_row_blocks(dk_sum[b, keys, kv_heads[0]], ds[0], q_rows[0], partials.dkv_rows, dtype, scale)
                    continue
                dk_heads = scale * (ds.mT @ q_rows)
                dv_heads = p_rounded.mT @ dout_rows
                dk_sum[b, keys] += dk_heads.unflatten(0, (spec.heads_kv, group)).sum(1).transpose(0, 1)
                dv_sum[b, keys] += dv_heads.unflatten(0, (spec.heads_kv, group)).sum(1).transpose(0, 1)
    if spec.backward:
        result.update(dq=dq, dk=dk_sum.to(case.k.dtype), dv=dv_sum.to(case.v.dtype))
    return result


def _dq(ds: torch.Tensor, k_rows: torch.Tensor, key_index: torch.Tensor, scale: float, dtype: torch.dtype,
        dq_keys: int | None) -> torch.Tensor:
    """``scale dS K`` rounded to T: at once in float32, or in T partial sums after each block of ``dq_keys``
    keys (blocks start at multiples of ``dq_keys``; eq. 8b)."""
    if dq_keys is None or len(key_index) == 0:
        return (scale * (ds @ k_rows)).to(dtype)
    start = int(key_index[0])
    partial = torch.zeros(*ds.shape[:-1], k_rows.shape[-1], dtype=dtype, device=ds.device)
    for block_start in range(start - start % dq_keys, int(key_index[-1]) + 1, dq_keys):
        local = slice(max(block_start, start) - start, block_start + dq_keys - start)
        partial = (partial.float() + scale * (ds[..., local] @ k_rows[..., local, :])).to(dtype)
    return partial


def _add_row_blocks(total: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor, block: int,
                    dtype: torch.dtype, scale: float) -> None:
    """``total`` (a T buffer, keys x head_dim) += ``scale weights^T rows``, rounded after each block of ``block``
    rows: one query head's contribution to dK or dV under declared ``dkv_rows`` partial sums (eqs. 7b, 9b).

    The row blocks of :func:`model_attention` start at multiples of ``block``.
    """
    for start in range(0, weights.shape[0], block):
        part = slice(start, start + block)
        total.copy_((total.float() + scale * (weights[part].mT @ rows[part])).to(dtype))
