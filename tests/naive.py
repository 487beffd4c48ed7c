"""Untiled float64 attention with autograd: the yardstick the project's own
tests compare bundled kernels with (the verification itself uses :mod:`golden`).

``out = softmax(scale · q k^T + mask) v`` and ``lse = logsumexp(scale · q k^T + mask)``
in contract layout, bottom-right masks (:func:`kernels.contract.visible_mask`),
query head ``h`` reading kv head ``h // (heads_q // heads_kv)``.  A row that
sees no key gives ``out = 0`` and ``lse = -inf``, and its gradients are 0 (the
logsumexp of such a row is taken over zeros, so no NaN enters autograd).
"""

from __future__ import annotations

import torch

from kernels.contract import UNBOUNDED, visible_mask


def attention(q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
    """``(out, lse)`` in float64 (differentiable through q, k, v)."""
    heads_q, heads_kv = q.shape[2], k.shape[2]
    kv_heads = torch.arange(heads_q, device=q.device) // (heads_q // heads_kv)
    qh = q.transpose(1, 2).double()
    kh = k.transpose(1, 2)[:, kv_heads].double()
    vh = v.transpose(1, 2)[:, kv_heads].double()
    visible = visible_mask(q.shape[1], k.shape[1], causal=causal, window_size=window_size, device=q.device)
    empty = ~visible.any(dim=1)
    s = (qh @ kh.transpose(-1, -2)) * softmax_scale
    s = s.masked_fill(~visible, float("-inf"))
    finite_lse = torch.logsumexp(s.masked_fill(empty.unsqueeze(-1), 0.0), dim=-1)
    out = torch.exp(s - finite_lse.unsqueeze(-1)) @ vh
    return out.transpose(1, 2), finite_lse.masked_fill(empty, float("-inf"))


def attention_grads(dout, q, k, v, **mask):
    """``(dq, dk, dv)`` of ``sum(out * dout)`` by autograd, in float64."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, _ = attention(q, k, v, **mask)
    return torch.autograd.grad(out, (q, k, v), dout.double())
