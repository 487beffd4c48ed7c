"""Naive attention in the case dtype: the denominator of the flash-attn style ratio.

``softmax(scale * Q K^T) V`` with every tensor op (matmul, masking, softmax,
logsumexp) run by PyTorch in the inputs' own dtype, and its gradients by
autograd in that dtype; GQA/MQA by repeating K and V over the query heads of
each group, so autograd sums their gradients.  A row that sees no key gives
``out = 0``, ``dq = 0`` and ``lse = -inf``, as the kernel contract asks.

It is only used for :func:`verify.metrics.flash_ratio` (docs/error-model.md,
"Flash-attn ratio"), never for pass/fail decisions.  It forms the whole
(batch, heads_q, seqlen_q, seqlen_k) score tensor, so it runs only for cases
of at most :data:`MAX_SCORES` scores (:func:`fits`); above that, at scale,
the ratio is not reported.
"""

from __future__ import annotations

import torch

from fa2_verify.core.contract import visible_mask
from fa2_verify.core.case import Case, CaseSpec


#: Largest ``batch * heads_q * seqlen_q * seqlen_k`` the naive attention is run for:
#: 32 MiB per 16-bit score tensor, a few of them alive with autograd.
MAX_SCORES = 1 << 24


def fits(spec: CaseSpec) -> bool:
    """Whether the naive attention of ``spec`` is small enough to run (:data:`MAX_SCORES`)."""
    return spec.batch * spec.heads_q * spec.seqlen_q * spec.seqlen_k <= MAX_SCORES


def naive_attention(case: Case) -> dict[str, torch.Tensor]:
    """``out``, ``lse`` (float32) and, when the case has a backward, ``dq``, ``dk``, ``dv``."""
    spec = case.spec
    group = spec.heads_q // spec.heads_kv
    with torch.enable_grad():
        q, k, v = (t.detach().clone().requires_grad_(spec.backward) for t in (case.q, case.k, case.v))
        keys = k.repeat_interleave(group, dim=2)
        values = v.repeat_interleave(group, dim=2)
        logits = torch.einsum("bihc,bjhc->bhij", q, keys) * spec.scale
        visible = visible_mask(spec.seqlen_q, spec.seqlen_k, causal=spec.causal, window_size=spec.window_size,
                               alignment=spec.causal_alignment, device=q.device)
        nonempty = visible.any(1, keepdim=True)
        # Rows without a visible key softmax over zeros (finite gradients) and are then zeroed.
        fill = torch.where(nonempty, float("-inf"), 0.0).to(logits.dtype)
        logits = torch.where(visible, logits, fill)
        probs = torch.softmax(logits, dim=-1) * nonempty.to(logits.dtype)
        out = torch.einsum("bhij,bjhc->bihc", probs, values)
        lse = torch.where(nonempty[:, 0], torch.logsumexp(logits, dim=-1), float("-inf")).to(torch.float32)
        result = {"out": out.detach(), "lse": lse.detach()}
        if spec.backward:
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_outputs=case.dout)
            result.update(dq=dq, dk=dk, dv=dv)
    return result
