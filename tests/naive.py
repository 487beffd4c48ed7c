"""Untiled float64 attention with autograd, for the project's own tests that need exact
attention inside a stand-in or a degraded kernel, and :func:`relative_error`, the mutant
catalog's measure of how far a mutant is from the reference.  Whether a kernel's numbers pass is
judged only by the product's check (:func:`fa2_verify.verify.check.check_case`: the golden and
the error model).

``out = softmax(scale · q k^T + mask) v`` and ``lse = logsumexp(scale · q k^T + mask)``
in contract layout, bottom-right masks unless asked (:func:`core.contract.visible_mask`),
query head ``h`` reading kv head ``h // (heads_q // heads_kv)``.  A row that
sees no key gives ``out = 0`` and ``lse = -inf``, and its gradients are 0 (the
logsumexp of such a row is taken over zeros, so no NaN enters autograd).
"""

from __future__ import annotations

import torch

from fa2_verify.core.contract import BOTTOM_RIGHT, UNBOUNDED, visible_mask


def attention(q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), alignment=BOTTOM_RIGHT):
    """``(out, lse)`` in float64 (differentiable through q, k, v); the mask ``alignment``-aligned."""
    heads_q, heads_kv = q.shape[2], k.shape[2]
    kv_heads = torch.arange(heads_q, device=q.device) // (heads_q // heads_kv)
    qh = q.transpose(1, 2).double()
    kh = k.transpose(1, 2)[:, kv_heads].double()
    vh = v.transpose(1, 2)[:, kv_heads].double()
    visible = visible_mask(q.shape[1], k.shape[1], causal=causal, window_size=window_size, alignment=alignment,
                           device=q.device)
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


def make_inputs(shape, dtype, seed=0):
    """(q, k, v, dout) for ``shape = (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)``,
    standard normal, drawn in float64 from ``seed`` and rounded once to ``dtype``."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = shape
    rng = torch.Generator().manual_seed(seed)
    sizes = [(batch, seqlen_q, heads_q, head_dim), (batch, seqlen_k, heads_kv, head_dim)] * 2
    q, k, dout, v = (torch.randn(size, generator=rng, dtype=torch.float64).to(dtype) for size in sizes)
    return q, k, v, dout


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|`` over expected's finite entries; ``inf`` if
    actual has a NaN or differs from expected where expected is infinite."""
    actual, expected = actual.double(), expected.double()
    finite = expected.isfinite()
    if actual.isnan().any() or not torch.equal(actual[~finite], expected[~finite]):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = expected[finite].abs().max().clamp_min(1e-300)
    return float((actual[finite] - expected[finite]).abs().max() / scale)
