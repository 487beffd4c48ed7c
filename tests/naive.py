"""Untiled float64 attention with autograd: the yardstick the project's own
tests compare bundled kernels with (the verification itself uses :mod:`golden`).

``out = softmax(scale · q k^T + mask) v`` and ``lse = logsumexp(scale · q k^T + mask)``
in contract layout, bottom-right masks (:func:`core.contract.visible_mask`),
query head ``h`` reading kv head ``h // (heads_q // heads_kv)``.  A row that
sees no key gives ``out = 0`` and ``lse = -inf``, and its gradients are 0 (the
logsumexp of such a row is taken over zeros, so no NaN enters autograd).
"""

from __future__ import annotations

import dataclasses

import torch

from fa2_verify.core.contract import UNBOUNDED, visible_mask


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


def assert_matches(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    error = relative_error(actual, expected)
    assert error <= tol, f"{name}: max |actual - expected| / max |expected| = {error:.3e} > {tol:.1e}"


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Largest :func:`relative_error` allowed per output against float64 attention."""

    out: float
    lse: float
    grads: float


#: What an FA2 kernel with float32 accumulation reaches on standard normal inputs:
#: a few roundoffs of the dtype (P, dS and the outputs are rounded to it).  The
#: float64 backward is limited by the contract's float32 lse (2^-24 |lse|).
FA2_TOLERANCE = {
    torch.float64: Tolerance(out=1e-13, lse=1e-6, grads=1e-5),
    torch.float32: Tolerance(out=1e-5, lse=1e-6, grads=1e-4),
    torch.float16: Tolerance(out=4e-3, lse=1e-4, grads=1e-2),
    torch.bfloat16: Tolerance(out=3e-2, lse=1e-4, grads=6e-2),
}


def check_against_attention(kernel, shape, dtype, mask, *, softmax_scale=0.3, seed=0, device="cpu") -> None:
    """Forward and backward of ``kernel`` match float64 attention within :data:`FA2_TOLERANCE`."""
    q, k, v, dout = (t.to(device) for t in make_inputs(shape, dtype, seed))
    tol = FA2_TOLERANCE[dtype]
    out, lse = kernel.forward(q, k, v, softmax_scale=softmax_scale, **mask)
    grads = kernel.backward(dout, q, k, v, out, lse, softmax_scale=softmax_scale, **mask)
    expected_out, expected_lse = attention(q, k, v, softmax_scale=softmax_scale, **mask)
    expected_grads = attention_grads(dout, q, k, v, softmax_scale=softmax_scale, **mask)
    assert (out.dtype, out.shape, lse.dtype, lse.shape) == (dtype, q.shape, torch.float32, expected_lse.shape)
    assert_matches("out", out, expected_out, tol.out)
    assert_matches("lse", lse, expected_lse, tol.lse)
    for name, actual, expected in zip(("dq", "dk", "dv"), grads, expected_grads):
        assert (actual.dtype, actual.shape) == (dtype, expected.shape), name
        assert_matches(name, actual, expected, tol.grads)
