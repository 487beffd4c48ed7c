"""Naive attention in the case dtype: the denominator of the flash-attn style ratio.

``softmax(scale * Q K^T) V`` with every tensor op (matmul, scaling, masking,
softmax, logsumexp) run by PyTorch in the inputs' own dtype, and its
gradients by the same ops autograd runs for them, in that dtype (``dP = dO
V^T``, ``dS = P (dP - rowsum(dP P))``, times the scale, ``dQ = dS K``).  A row
that sees no key gives ``out = 0``, ``dq = 0`` and ``lse = -inf``, as the
kernel contract asks.

It is only used for :func:`verify.metrics.flash_ratio` (docs/error-model.md,
"Flash-attn ratio"), never for pass/fail decisions.  It runs one block of
query rows at a time over only the keys those rows see
(:func:`verify.error_model.masked_row_blocks`), for all query heads of a chunk of batches
(:func:`batch_chunks`) at once, masked only on the column bands some of its rows do not see, so no
(seqlen_q x seqlen_k) tensor is formed and the ratio is reported
at every length, 128k tokens included.  Row blocks change nothing for the
rows' own outputs (``out``, ``lse``, ``dq``); ``dK`` and ``dV`` sum over every
row and, with GQA, over the query heads of a group: those sums are kept in
float32 across blocks and heads and rounded to the dtype once, as one matmul
in the dtype with float32 accumulation rounds them (GPU tensor cores and
PyTorch's CPU kernels alike).
"""

from __future__ import annotations

import torch

from fa2_verify.core.case import Case
from fa2_verify.core.row_blocks import BlockMask
from fa2_verify.verify.error_model import masked_row_blocks, work_elements


def blocked_buffers(case: Case) -> tuple[dict[str, torch.Tensor], list[tuple[slice, slice, BlockMask]]]:
    """What an attention computed in row blocks over ``case`` fills, and its blocks.

    ``out`` and (with a backward) ``dq`` zeroed like ``q``, ``lse`` (float32) at ``-inf``, and with a
    backward float32 sums ``dk_sum``, ``dv_sum`` like ``k``: the values of rows that see no key.  The blocks
    are those of :func:`verify.error_model.masked_row_blocks` over keys, for all query heads at once, each with
    its mask on the column bands some of its rows do not see; every row of them sees a key.
    """
    spec = case.spec
    device = case.q.device
    first, last = spec.visible_ranges(device)
    buffers = {
        "out": torch.zeros_like(case.q),
        "lse": torch.full((spec.batch, spec.heads_q, spec.seqlen_q), float("-inf"), dtype=torch.float32,
                          device=device),
    }
    if spec.backward:
        buffers["dq"] = torch.zeros_like(case.q)
        buffers["dk_sum"] = torch.zeros(case.k.shape, dtype=torch.float32, device=device)
        buffers["dv_sum"] = torch.zeros_like(buffers["dk_sum"])
    work = max(1, work_elements(device) // spec.heads_q)
    blocks = [block for block in masked_row_blocks(first, last, work, spec.head_dim) if block[1].stop > block[1].start]
    return buffers, blocks


def batch_chunks(case: Case, blocks: list[tuple[slice, slice, BlockMask]]) -> list[slice]:
    """Consecutive batches evaluated at once over the blocks of :func:`blocked_buffers`: as many as keep
    ``batches x heads_q x`` the largest block's scores within :func:`verify.error_model.work_elements` (at least
    one), so that many short sequences cost a few tensor operations rather than a Python loop over batches."""
    spec = case.spec
    largest = max(((rows.stop - rows.start) * (keys.stop - keys.start) for rows, keys, _ in blocks), default=1)
    step = max(1, work_elements(case.q.device) // (spec.heads_q * max(largest, 1)))
    return [slice(start, min(start + step, spec.batch)) for start in range(0, spec.batch, step)]


def naive_attention(case: Case) -> dict[str, torch.Tensor]:
    """``out``, ``lse`` (float32) and, when the case has a backward, ``dq``, ``dk``, ``dv``."""
    spec = case.spec
    group = spec.heads_q // spec.heads_kv
    buffers, blocks = blocked_buffers(case)
    out, lse = buffers["out"], buffers["lse"]
    result = {"out": out, "lse": lse}
    if spec.backward:
        dq, dk_sum, dv_sum = buffers["dq"], buffers["dk_sum"], buffers["dv_sum"]
    for batches in batch_chunks(case, blocks):
        # (batches, heads_q, keys, head_dim): K and V repeated over the query heads of each group
        keys_all = case.k[batches].transpose(1, 2).repeat_interleave(group, dim=1)
        values_all = case.v[batches].transpose(1, 2).repeat_interleave(group, dim=1)
        for rows, keys, mask in blocks:
            q_rows = case.q[batches, rows].transpose(1, 2)
            k_rows, v_rows = keys_all[:, :, keys], values_all[:, :, keys]
            logits = mask.mask_((q_rows @ k_rows.mT) * spec.scale, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            out[batches, rows] = (probs @ v_rows).transpose(1, 2)
            lse[batches, :, rows] = torch.logsumexp(logits, dim=-1).float()
            if not spec.backward:
                continue
            dout_rows = case.dout[batches, rows].transpose(1, 2)
            dprobs = dout_rows @ v_rows.mT
            dlogits = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True)) * spec.scale
            dq[batches, rows] = (dlogits @ k_rows).transpose(1, 2)
            dk_heads = dlogits.float().mT @ q_rows.float()
            dv_heads = probs.float().mT @ dout_rows.float()
            dk_sum[batches, keys] += dk_heads.unflatten(1, (spec.heads_kv, group)).sum(2).transpose(1, 2)
            dv_sum[batches, keys] += dv_heads.unflatten(1, (spec.heads_kv, group)).sum(2).transpose(1, 2)
    if spec.backward:
        result.update(dq=dq, dk=dk_sum.to(case.k.dtype), dv=dv_sum.to(case.v.dtype))
    return result
