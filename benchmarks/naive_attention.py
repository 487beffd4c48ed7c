"""Naive float64 attention, forward and backward, one (batch, head) at a time.

The textbook formulas (Dao 2023, Section 2.2 and Algorithm 2's definitions):
``S = scale * q k^T`` masked to -inf outside :func:`core.contract.visible_mask`,
``lse = logsumexp_j S``, ``P = exp(S - lse)`` (0 for a row that sees no key),
``out = P v``; ``delta = rowsum(dout * out)``, ``dP = dout v^T``,
``dS = P * (dP - delta)``, ``dq = scale * dS k``, ``dk = scale * dS^T q``,
``dv = P^T dout``, with dk and dv summed over the query heads of a kv head.
``dq_terms``/``dk_terms`` are the same products taken in absolute values,
``scale * (P * (|dP| + |delta|)) |k|`` and its transpose with ``|q|``: the size
of what dq and dk sum, which stays large when the sum cancels to ~0 (a row
that sees one key has dS = 0 exactly).
It materialises the (seqlen_q, seqlen_k) matrices of one head, on the inputs'
device: a yardstick for kernel checks, not a kernel.
"""

from __future__ import annotations

import torch

from fa2_verify.core.contract import visible_mask


def naive_attention(q, k, v, dout=None, *, softmax_scale, causal=False, window_size=(-1, -1), heads=None):
    """Float64 ``out``, ``lse`` (and ``dq``, ``dk``, ``dv``, ``dq_terms``, ``dk_terms`` when ``dout`` is given).

    Layouts as in the kernel contract: q (batch, seqlen_q, heads_q, head_dim),
    k/v (batch, seqlen_k, heads_kv, head_dim).  ``heads`` restricts the work to
    some query heads (the other entries of the results stay 0; dk/dv then hold
    only those heads' contributions).  ``lse`` is -inf for a row that sees no key.
    """
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    visible = visible_mask(seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=q.device)
    q64, k64, v64 = (t.to(torch.float64) for t in (q, k, v))
    result = {
        "out": torch.zeros(q.shape, dtype=torch.float64, device=q.device),
        "lse": torch.full((batch, heads_q, seqlen_q), float("-inf"), dtype=torch.float64, device=q.device),
    }
    if dout is not None:
        dout64 = dout.to(torch.float64)
        for name, like in (("dq", q64), ("dk", k64), ("dv", v64), ("dq_terms", q64), ("dk_terms", k64)):
            result[name] = torch.zeros_like(like)
    for b in range(batch):
        for h in heads if heads is not None else range(heads_q):
            hk = h // group
            qh, kh, vh = q64[b, :, h], k64[b, :, hk], v64[b, :, hk]
            scores = (softmax_scale * qh @ kh.T).masked_fill(~visible, float("-inf"))
            lse = torch.logsumexp(scores, dim=1)
            seen = torch.isfinite(lse)
            probs = torch.where(seen[:, None], torch.exp(scores - torch.where(seen, lse, 0.0)[:, None]), 0.0)
            out = probs @ vh
            result["out"][b, :, h] = out
            result["lse"][b, h] = lse
            if dout is None:
                continue
            do = dout64[b, :, h]
            delta = (do * out).sum(dim=1, keepdim=True)
            dscores = probs * (do @ vh.T - delta)
            result["dq"][b, :, h] = softmax_scale * dscores @ kh
            result["dk"][b, :, hk] += softmax_scale * dscores.T @ qh
            result["dv"][b, :, hk] += probs.T @ do
            terms = probs * ((do @ vh.T).abs() + delta.abs())
            result["dq_terms"][b, :, h] = softmax_scale * terms @ kh.abs()
            result["dk_terms"][b, :, hk] += softmax_scale * terms.T @ qh.abs()
    return result
