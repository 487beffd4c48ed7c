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
  ``D = rowsum(dO * O)``, ``dS = fl_T(fl_T(P) (dP - D))``, ``dQ = scale dS K``,
  ``dK = scale dS^T Q``, accumulated in float32 over every row and every query
  head of a group and rounded to ``T`` once.

Partial sums a kernel declares in ``T`` (:class:`verify.error_model.PartialSums`)
are not made: the outputs that pass through them are left to the worst-case
verdict (:func:`verify.noise_verdicts.judged_outputs`).

It also returns each row's ``M_i = max_j |S_ij|`` over its visible keys
(``logit_max``, float32, (batch, heads_q, seqlen_q); 0 for a row that sees no
key), which decides where the verdicts' premise holds, and the rows' scale
errors from rounding ``P~`` to ``T`` (``scale_errors``, float32, (batch,
heads_q, seqlen_q)): ``alpha_i = sum_j (fl_T(P~_ij) - P~_ij) / l_i``, the
relative error by which that rounding alone scales row ``i`` of ``O`` (0 for a
row that sees no key).  The bias verdict's premise asks them to vary from row
to row like independent errors (:func:`verify.noise_verdicts.bias`).

With a backward it also returns, per row, what the backward premise reads
(:func:`verify.noise_verdicts.premise`): ``ds_signal`` ``= sum_j P_ij |dP_ij - D_i|``,
the size of the row's ``dS`` before its rounding to ``T``, and ``ds_magnitude``
``= sum_j P_ij (sum_c |dO_ic| |V_jc| + |D_i|)``, the size of the float32 sums
``dP_ij`` and ``D_i`` whose difference it is (float32, (batch, heads_q, seqlen_q);
0 for a row that sees no key).

It runs one block of query rows at a time over the keys they see, masked on
the column bands some of them do not see (:func:`verify.lowprec.blocked_buffers`),
for a chunk of batches at once (:func:`verify.lowprec.batch_chunks`), like :mod:`verify.lowprec`, so no
(seqlen_q x seqlen_k) tensor is formed.
"""

from __future__ import annotations

import torch

from fa2_verify.core.case import Case
from fa2_verify.verify.lowprec import batch_chunks, blocked_buffers


def _softmax_block(logits: torch.Tensor, values: torch.Tensor, dtype: torch.dtype):
    """``(O in float32 before its rounding, LSE, scale error)`` of one block whose rows each see a key, the
    keys they do not see at ``-inf`` in ``logits`` (Algorithm 1's numerics; the scale errors of the module
    docstring)."""
    row_max = logits.amax(-1, keepdim=True)
    p = torch.exp(logits - row_max)
    denominator = p.sum(-1, keepdim=True)
    p_rounded = p.to(dtype).float()
    out = (p_rounded @ values) / denominator
    lse = (row_max + torch.log(denominator))[..., 0]
    scale_error = (p_rounded - p).sum(-1) / denominator[..., 0]
    return out, lse, scale_error


def model_attention(case: Case, forward: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """``out``, ``lse`` (float32), ``logit_max``, ``scale_errors`` and, when the case has a backward, ``dq``, ``dk``, ``dv``,
    ``ds_signal`` and ``ds_magnitude`` of the model kernel; the backward from ``forward["out"]`` and ``forward["lse"]`` (the kernel's) where given."""
    spec = case.spec
    dtype, scale = spec.torch_dtype, spec.scale
    group = spec.heads_q // spec.heads_kv
    buffers, blocks = blocked_buffers(case)
    out, lse = buffers["out"], buffers["lse"]
    logit_max = torch.zeros_like(lse)
    scale_errors = torch.zeros_like(logit_max)
    result = {"out": out, "lse": lse, "logit_max": logit_max, "scale_errors": scale_errors}
    given_out, given_lse = (forward or {}).get("out"), (forward or {}).get("lse")
    if spec.backward:
        dq, dk_sum, dv_sum = buffers["dq"], buffers["dk_sum"], buffers["dv_sum"]
        ds_signal, ds_magnitude = torch.zeros_like(logit_max), torch.zeros_like(logit_max)
    for batches in batch_chunks(case, blocks):
        # (batches, heads_q, keys, head_dim) in float32: the T values, exactly, repeated over the query heads of a group
        keys_all = case.k[batches].transpose(1, 2).float().repeat_interleave(group, dim=1)
        values_all = case.v[batches].transpose(1, 2).float().repeat_interleave(group, dim=1)
        for rows, keys, mask in blocks:
            q_rows = case.q[batches, rows].transpose(1, 2).float()
            k_rows, v_rows = keys_all[:, :, keys], values_all[:, :, keys]
            logits = (q_rows @ k_rows.mT) * scale
            logit_max[batches, :, rows] = mask.row_max(logits.abs())[..., 0]
            mask.mask_(logits, float("-inf"))
            o_rows, lse_rows, scale_errors[batches, :, rows] = _softmax_block(logits, v_rows, dtype)
            o_rows = o_rows.to(dtype)
            out[batches, rows] = o_rows.transpose(1, 2)
            lse[batches, :, rows] = lse_rows
            if not spec.backward:
                continue
            if given_out is not None:
                o_rows = given_out[batches, rows].transpose(1, 2)
            if given_lse is not None:
                lse_rows = given_lse[batches, :, rows].float()
            dout_rows = case.dout[batches, rows].transpose(1, 2).float()
            lse_safe = torch.where(torch.isfinite(lse_rows), lse_rows, 0.0)
            p = torch.exp(logits - lse_safe[..., None])  # 0 at the keys a row does not see
            delta = (dout_rows * o_rows.float()).sum(-1, keepdim=True)
            # dS from P rounded to T, the copy dV uses (eq. 6; PyTorch's memory-efficient backward): of the two
            # ways correct kernels form dS the noisier, by eta |dP - D| where P is subnormal in T
            p_rounded = p.to(dtype).float()
            difference = dout_rows @ v_rows.mT - delta
            ds = (p_rounded * difference).to(dtype).float()
            ds_signal[batches, :, rows] = (p * difference.abs()).sum(-1)
            # sum_j P_ij (|dO_i| . |V_j| + |D_i|) as |dO_i| . (sum_j P_ij |V_j|) + |D_i| sum_j P_ij: one product,
            # no (rows x keys) temporary
            ds_magnitude[batches, :, rows] = ((dout_rows.abs() * (p @ v_rows.abs())).sum(-1)
                                              + delta.abs()[..., 0] * p.sum(-1))
            dq[batches, rows] = (scale * (ds @ k_rows)).to(dtype).transpose(1, 2)
            dk_heads = scale * (ds.mT @ q_rows)
            dv_heads = p_rounded.mT @ dout_rows
            dk_sum[batches, keys] += dk_heads.unflatten(1, (spec.heads_kv, group)).sum(2).transpose(1, 2)
            dv_sum[batches, keys] += dv_heads.unflatten(1, (spec.heads_kv, group)).sum(2).transpose(1, 2)
    if spec.backward:
        result.update(dq=dq, dk=dk_sum.to(case.k.dtype), dv=dv_sum.to(case.v.dtype), ds_signal=ds_signal,
                      ds_magnitude=ds_magnitude)
    return result
