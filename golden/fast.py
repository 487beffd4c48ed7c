"""The fast golden: attention in float64 with error-free transformations.

The formulas are those of :mod:`golden.mp` (Dao 2023, "FlashAttention-2",
Algorithm 1 forward and Algorithm 2 backward), evaluated per head so that
each step's error is the float64 rounding of a well-conditioned quantity:

1. ``S' = Q (sign K)^T`` as a double-double by :func:`golden.eft.dd_matmul`
   (the Ozaki products of the inputs are exact), with ``|scale|`` applied
   only after the row maximum ``m'_i`` is subtracted:
   ``x_ij = |scale| (S'_ij - m'_i)``, so a large logit costs no accuracy.
2. ``E = exp(x)`` (masked entries 0), ``l_i = sum_j E_ij``, ``P = E / l``,
   ``LSE_i = |scale| m'_i + log l_i`` kept as a double-double.
3. ``O = P V`` by :func:`dd_matmul`.
4. ``D_i = sum_c dO_ic O_ic`` by :func:`golden.eft.dot2` on the
   double-double ``O``.
5. ``dP = dO V^T`` by :func:`dd_matmul`; ``dP - D`` is formed from the two
   double-doubles with :func:`golden.eft.two_sum` before rounding, so its
   error is ``2**-53 |dP - D|`` plus the errors of ``D``, not
   ``2**-53 (|dP| + |D|)`` amplified by cancellation.
6. ``dS = P o (dP - D)``; ``dQ = scale dS K``, ``dK = scale dS^T Q`` and
   ``dV = P^T dO`` by :func:`dd_matmul`, the GQA group's query heads
   accumulated in double-double before the single final rounding.

Every entry of ``P`` and ``dS`` therefore carries a relative error of a few
``2**-53``, and every product with them adds at most ``~2**-70`` of its
operand scale, so an output's error is a few float64 roundings of the terms
it sums.  This module claims no bound of its own: :mod:`golden.certify`
measures the error against mpmath on sampled rows of every case served.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from golden.eft import dd_matmul, dot2, two_prod, two_sum
from golden.inputs import Problem

#: Query rows are processed in blocks of about this many scores (8 MiB of
#: float64 per temporary), which bounds memory and keeps temporaries in the
#: allocator's reused heap instead of fresh pages; dK and dV accumulate the
#: blocks in double-double.
BLOCK_ELEMENTS = 2**20


@dataclasses.dataclass(frozen=True)
class FastResult:
    """Outputs head-major as in :class:`golden.inputs.Problem`, rounded once to float64.

    ``lse_dd`` and ``delta_dd`` keep ``(hi, lo)`` of LSE and D for the
    certification of dK and dV (:mod:`golden.certify`).
    """

    out: np.ndarray
    lse: np.ndarray
    delta: np.ndarray | None
    dq: np.ndarray | None
    dk: np.ndarray | None
    dv: np.ndarray | None
    lse_dd: tuple[np.ndarray, np.ndarray]
    delta_dd: tuple[np.ndarray, np.ndarray] | None


def attention(problem: Problem) -> FastResult:
    """Forward (and backward when ``problem.dout`` is given) for every head, in blocks of query rows."""
    backward = problem.dout is not None
    shape_q = problem.q.shape
    rows = shape_q[:3]
    out = np.zeros(shape_q)
    lse_hi, lse_lo = np.full(rows, -np.inf), np.zeros(rows)
    delta_hi, delta_lo = np.zeros(rows), np.zeros(rows)
    dq = np.zeros(shape_q)
    dk, dv = np.zeros(problem.k.shape), np.zeros(problem.v.shape)
    step = max(1, BLOCK_ELEMENTS // max(problem.seqlen_k, 1))
    for b in range(problem.batch):
        for g in range(problem.heads_kv):
            k, v = problem.k[b, g], problem.v[b, g]
            dk_acc = dv_acc = None
            for h in range(g * problem.group, (g + 1) * problem.group):
                for start in range(0, problem.seqlen_q, step):
                    block = slice(start, start + step)
                    head = _forward(problem.q[b, h, block], k, v, problem.mask[block], problem.scale)
                    out[b, h, block], lse_hi[b, h, block], lse_lo[b, h, block] = head.out, head.lse_hi, head.lse_lo
                    if not backward:
                        continue
                    grads = _backward(problem.dout[b, h, block], problem.q[b, h, block], k, v, head, problem.scale)
                    dq[b, h, block], delta_hi[b, h, block], delta_lo[b, h, block] = (
                        grads.dq,
                        grads.delta_hi,
                        grads.delta_lo,
                    )
                    dk_acc = _accumulate(dk_acc, grads.dk_sum)
                    dv_acc = _accumulate(dv_acc, grads.dv)
            if dk_acc is not None:
                dk[b, g] = _times(dk_acc, problem.scale)
                dv[b, g] = dv_acc[0] + dv_acc[1]
    lse = lse_hi + lse_lo
    if not backward:
        return FastResult(out, lse, None, None, None, None, (lse_hi, lse_lo), None)
    return FastResult(out, lse, delta_hi + delta_lo, dq, dk, dv, (lse_hi, lse_lo), (delta_hi, delta_lo))


@dataclasses.dataclass(frozen=True)
class _Forward:
    out: np.ndarray
    out_dd: tuple[np.ndarray, np.ndarray]
    p: np.ndarray
    lse_hi: np.ndarray
    lse_lo: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Backward:
    dq: np.ndarray
    dk_sum: tuple[np.ndarray, np.ndarray]
    dv: tuple[np.ndarray, np.ndarray]
    delta_hi: np.ndarray
    delta_lo: np.ndarray


def _forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float) -> _Forward:
    """Steps 1-3 for one head: ``q`` (seqlen_q, head_dim), ``k``/``v`` (seqlen_k, head_dim)."""
    magnitude = abs(scale)
    s_hi, s_lo = dd_matmul(q, (k if scale >= 0 else -k).T)
    full = bool(mask.all())
    empty = ~mask.any(axis=1)
    row_max = np.max(s_hi if full else np.where(mask, s_hi, -np.inf), axis=1, initial=-np.inf)
    row_max[empty] = 0.0
    logits = magnitude * ((s_hi - row_max[:, None]) + s_lo)
    if not full:
        logits[~mask] = -np.inf
    e = np.exp(logits)
    ell = e.sum(axis=1)
    p = e / np.where(empty, 1.0, ell)[:, None]
    max_hi, max_lo = two_prod(row_max, magnitude)
    lse_hi, sum_lo = two_sum(max_hi, np.log(np.where(empty, 1.0, ell)))
    lse_lo = np.where(empty, 0.0, max_lo + sum_lo)
    lse_hi = np.where(empty, -np.inf, lse_hi)
    out_hi, out_lo = dd_matmul(p, v)
    return _Forward(out_hi + out_lo, (out_hi, out_lo), p, lse_hi, lse_lo)


def _backward(dout: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, head: _Forward, scale: float) -> _Backward:
    """Steps 4-6 for one head; ``dk_sum`` is ``dS^T Q`` before the scale."""
    out_hi, out_lo = head.out_dd
    delta_hi, delta_lo = dot2(dout, out_hi)
    delta_hi, delta_lo = two_sum(delta_hi, delta_lo + np.sum(dout * out_lo, axis=1))
    dp_hi, dp_lo = dd_matmul(dout, v.T)
    ds = head.p * ((dp_hi - delta_hi[:, None]) + (dp_lo - delta_lo[:, None]))
    dq = _times(dd_matmul(ds, k), scale)
    return _Backward(dq, dd_matmul(ds.T, q), dd_matmul(head.p.T, dout), delta_hi, delta_lo)


def _accumulate(total, term):
    """Double-double ``total + term`` (``total`` may be None)."""
    if total is None:
        return term
    hi, err = two_sum(total[0], term[0])
    return hi, err + (total[1] + term[1])


def _times(pair: tuple[np.ndarray, np.ndarray], scale: float) -> np.ndarray:
    """``fl(scale * (hi + lo))`` with one rounding error of the product."""
    hi, lo = pair
    product, err = two_prod(hi, scale)
    return product + (err + lo * scale)
