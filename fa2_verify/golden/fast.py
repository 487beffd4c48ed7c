"""The fast golden: attention in float64 with error-free transformations.

The formulas are those of :mod:`golden.mp` (Dao 2023, "FlashAttention-2",
Algorithm 1 forward and Algorithm 2 backward), evaluated per head and per
block of query rows so that each step's error is the float64 rounding of a
well-conditioned quantity:

1. ``S' = Q (sign K)^T`` as a pair ``hi + lo`` by :func:`golden.eft.dd_matmul`
   (its leading product is exact); ``|scale|`` is applied only
   after the row maximum ``m'_i`` (at the pivot key ``p(i)``) is subtracted,
   ``x_ij = |scale| (S'_ij - m'_i)``, so a large logit costs no accuracy.
   ``S'`` is renormalised (``hi = fl(S')``) before the maximum is taken,
   so the pivot's ``x`` is a rounding error of ``S'`` and no more.
2. ``E = exp(x)`` (masked entries 0), ``l_i = sum_j E_ij``, ``P = E / l``,
   ``LSE_i = |scale| m'_i + log l_i`` kept as a double-double, with
   ``log l_i = log1p(expm1(x_{i,p(i)}) + sum_{j != p(i)} E_ij)``: when one
   key dominates a row whose scores are all tiny, ``LSE_i`` is as tiny as
   they are and ``log`` of a rounded ``l_i ~ 1`` would keep only its
   absolute ``2**-53``, not its relative accuracy.
3. ``O = P V`` by :func:`dd_matmul`.
4. ``dP = dO V^T`` by :func:`dd_matmul`.  With ``r_i = dP_{i,p(i)}`` and
   ``sum_j P_ij = 1``,

       D_i - r_i   = sum_j P_ij (dP_ij - r_i)          (the "offset" b_i)
       dP_ij - D_i = (dP_ij - r_i) - b_i

   ``dP_ij - r_i`` is formed from the pairs before rounding (exactly 0 at the
   pivot), so ``dS`` keeps its relative accuracy even when the softmax is so
   peaked that ``dP_{i,p(i)} - D_i`` is 1e-20 of ``D_i``, where
   ``D = rowsum(dO o O)`` followed by a subtraction would keep no digit.
   ``D_i = r_i + b_i`` is returned as the row's delta.
5. ``dS = P o (dP - D)``; ``dQ = scale dS K``, ``dK = scale dS^T Q`` and
   ``dV = P^T dO`` by :func:`dd_matmul`, the GQA group's query heads and the
   row blocks accumulated in double-double before the single final rounding.

Every entry of ``P`` and ``dS`` therefore carries a relative error of a few
``2**-53`` (times ``|x_ij|`` for ``P``), and every product with them adds at
most ``~k 2**-(53 + beta)`` of its leading magnitudes (:func:`dd_matmul`), so
an output's error is a few float64 roundings of the magnitude of the terms
it sums.  This module claims no bound of its own: :mod:`golden.certify`
measures the error against mpmath on sampled rows of every case served.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fa2_verify.golden.eft import dd_matmul, two_prod, two_sum
from fa2_verify.golden.inputs import HeadMajorInputs

#: Query rows are processed in blocks of about this many scores (8 MiB of
#: float64 per temporary), which bounds memory and keeps temporaries in the
#: allocator's reused heap instead of fresh pages.  A block only computes the
#: keys its rows see (a causal or sliding-window mask skips the rest); dK and
#: dV accumulate the blocks in double-double.
BLOCK_ELEMENTS = 2**20


@dataclasses.dataclass(frozen=True)
class FastResult:
    """Outputs head-major as in :class:`golden.inputs.HeadMajorInputs`, rounded once to float64.

    For the certification of dK and dV (:mod:`golden.certify`): ``lse_dd`` is
    ``(hi, lo)`` of LSE, ``pivot`` the key index ``p(i)`` of each row's largest
    score and ``offset`` the row's ``b_i = D_i - dP_{i,p(i)}``.
    """

    out: np.ndarray
    lse: np.ndarray
    delta: np.ndarray | None
    dq: np.ndarray | None
    dk: np.ndarray | None
    dv: np.ndarray | None
    lse_dd: tuple[np.ndarray, np.ndarray]
    pivot: np.ndarray
    offset: np.ndarray | None


def attention(problem: HeadMajorInputs) -> FastResult:
    """Forward (and backward when ``problem.dout`` is given) for every head, in blocks of query rows."""
    backward = problem.dout is not None
    rows = problem.q.shape[:3]
    out, dq = np.zeros(problem.q.shape), np.zeros(problem.q.shape)
    dk, dv = np.zeros(problem.k.shape), np.zeros(problem.v.shape)
    lse_hi, lse_lo = np.full(rows, -np.inf), np.zeros(rows)
    delta, offset = np.zeros(rows), np.zeros(rows)
    pivot = np.zeros(rows, dtype=np.int64)
    step = max(1, BLOCK_ELEMENTS // max(problem.seqlen_k, 1))
    for b in range(problem.batch):
        for g in range(problem.heads_kv):
            k, v = problem.k[b, g], problem.v[b, g]
            dk_sum, dv_sum = _zeros_dd(k.shape), _zeros_dd(v.shape)
            for h in range(g * problem.group, (g + 1) * problem.group):
                for start in range(0, problem.seqlen_q, step):
                    block = slice(start, start + step)
                    seen = np.flatnonzero(problem.mask[block].any(axis=0))
                    if not len(seen):
                        continue
                    keys = slice(seen[0], seen[-1] + 1)
                    head = _forward(problem.q[b, h, block], k[keys], v[keys], problem.mask[block, keys], problem.scale)
                    out[b, h, block], pivot[b, h, block] = head.out, head.pivot + keys.start
                    lse_hi[b, h, block], lse_lo[b, h, block] = head.lse_hi, head.lse_lo
                    if not backward:
                        continue
                    grads = _backward(
                        problem.dout[b, h, block], problem.q[b, h, block], k[keys], v[keys], head, problem.scale
                    )
                    dq[b, h, block], delta[b, h, block], offset[b, h, block] = grads.dq, grads.delta, grads.offset
                    _accumulate(dk_sum, grads.dk_sum, keys)
                    _accumulate(dv_sum, grads.dv, keys)
            if backward:
                dk[b, g] = _times(dk_sum, problem.scale)
                dv[b, g] = dv_sum[0] + dv_sum[1]
    lse = lse_hi + lse_lo
    if not backward:
        return FastResult(out, lse, None, None, None, None, (lse_hi, lse_lo), pivot, None)
    return FastResult(out, lse, delta, dq, dk, dv, (lse_hi, lse_lo), pivot, offset)


@dataclasses.dataclass(frozen=True)
class _Forward:
    out: np.ndarray
    p: np.ndarray
    pivot: np.ndarray
    empty: np.ndarray
    lse_hi: np.ndarray
    lse_lo: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Backward:
    dq: np.ndarray
    dk_sum: tuple[np.ndarray, np.ndarray]
    dv: tuple[np.ndarray, np.ndarray]
    delta: np.ndarray
    offset: np.ndarray


def _forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float) -> _Forward:
    """Steps 1-3 for one block: ``q`` (rows, head_dim), ``k``/``v`` (seqlen_k, head_dim)."""
    magnitude = abs(scale)
    s_hi, s_lo = two_sum(*dd_matmul(q, (k if scale >= 0 else -k).T))
    full = bool(mask.all())
    empty = ~mask.any(axis=1)
    rows = np.arange(len(q))
    masked = s_hi if full else np.where(mask, s_hi, -np.inf)
    pivot = np.argmax(masked, axis=1)
    row_max = np.where(empty, 0.0, masked[rows, pivot])
    logits = magnitude * ((s_hi - row_max[:, None]) + s_lo)
    if not full:
        logits[~mask] = -np.inf
    e = np.exp(logits)
    at_pivot = np.where(empty, 0.0, logits[rows, pivot])
    e[rows, pivot] = 0.0
    excess = e.sum(axis=1) + np.expm1(at_pivot)
    e[rows, pivot] = np.where(empty, 0.0, np.exp(at_pivot))
    p = e / (1.0 + excess)[:, None]
    max_hi, max_lo = two_prod(row_max, magnitude)
    lse_hi, sum_lo = two_sum(max_hi, np.log1p(excess))
    out_hi, out_lo = dd_matmul(p, v)
    return _Forward(
        out_hi + out_lo,
        p,
        pivot,
        empty,
        np.where(empty, -np.inf, lse_hi),
        np.where(empty, 0.0, max_lo + sum_lo),
    )


def _backward(dout: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, head: _Forward, scale: float) -> _Backward:
    """Steps 4-5 for one block; ``dk_sum`` is ``dS^T Q`` before the scale."""
    dp_hi, dp_lo = dd_matmul(dout, v.T)
    rows = np.arange(len(dout))
    anchor_hi = np.where(head.empty, 0.0, dp_hi[rows, head.pivot])
    anchor_lo = np.where(head.empty, 0.0, dp_lo[rows, head.pivot])
    shifted = (dp_hi - anchor_hi[:, None]) + (dp_lo - anchor_lo[:, None])
    offset = np.sum(head.p * shifted, axis=1)
    ds = head.p * (shifted - offset[:, None])
    delta_hi, delta_lo = two_sum(anchor_hi, offset)
    dq = _times(dd_matmul(ds, k), scale)
    return _Backward(dq, dd_matmul(ds.T, q), dd_matmul(head.p.T, dout), delta_hi + (delta_lo + anchor_lo), offset)


def _zeros_dd(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(shape), np.zeros(shape)


def _accumulate(total: tuple[np.ndarray, np.ndarray], term: tuple[np.ndarray, np.ndarray], rows: slice) -> None:
    """Double-double ``total[rows] += term``, in place."""
    hi, err = two_sum(total[0][rows], term[0])
    total[0][rows] = hi
    total[1][rows] += err + term[1]


def _times(pair: tuple[np.ndarray, np.ndarray], scale: float) -> np.ndarray:
    """``fl(scale * (hi + lo))`` with one rounding error of the product."""
    hi, lo = pair
    product, err = two_prod(hi, scale)
    return product + (err + lo * scale)
