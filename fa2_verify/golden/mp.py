"""The mpmath golden: attention evaluated entirely in mpmath at a chosen precision.

Each float64 input converts to an mpf exactly (precision >= 53 bits).  With
``J_i`` the keys query ``i`` sees (:func:`core.contract.visible_mask`) and
query head ``h`` reading kv head ``g = h // (heads_q // heads_kv)``, the
formulas of FlashAttention-2 (Dao 2023, Algorithm 1 forward, Algorithm 2
backward) without tiling are

    S_ij  = scale * q_i . k_j                     (j in J_i; other j excluded)
    LSE_i = log sum_j exp(S_ij)                   (natural log; -inf if J_i is empty)
    P_ij  = exp(S_ij - LSE_i)
    O_i   = sum_j P_ij v_j                        (0 if J_i is empty)
    D_i   = sum_c dO_ic O_ic                      (from this O, never rounded to float64)
    dP_ij = dO_i . v_j
    dS_ij = P_ij (dP_ij - D_i)                    (see _query_row for the form evaluated)
    dQ_i  = scale sum_j dS_ij k_j
    dK_j  = scale sum_{h in group(g)} sum_i dS^h_ij q^h_i
    dV_j  = sum_{h in group(g)} sum_i P^h_ij dO^h_i

Every dot product is an ``fdot`` (exact products, one rounding of the sum);
each other operation rounds once, so every result is within a few units of
``2**-precision_bits`` of the sum of the magnitudes it is built from.  The
softmax is shifted by the row maximum before ``exp``.  This is the plain
transcription of the formulas: :mod:`golden.rows` evaluates the same rows
faster for the certification of the fast path, and the tests check one
against the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mpmath
import numpy as np

from fa2_verify.golden.inputs import HeadMajorInputs

Matrix = list[list]


def context(precision_bits: int) -> mpmath.ctx_mp.MPContext:
    """A private mpmath context (round to nearest) at ``precision_bits``."""
    ctx = mpmath.MPContext()
    ctx.prec = precision_bits
    return ctx


def attention(problem: HeadMajorInputs, precision_bits: int) -> dict[str, np.ndarray | None]:
    """All outputs of ``problem`` in mpmath, each rounded once to float64 (head-major host arrays)."""
    ctx = context(precision_bits)
    backward = problem.dout is not None
    names = ("out", "lse", "delta", "dq", "dk", "dv") if backward else ("out", "lse")
    results: dict[str, list[Any]] = {name: [] for name in names}
    inputs = {name: problem.host(name) for name in (("q", "k", "v", "dout") if backward else ("q", "k", "v"))}
    mask = problem.visible(slice(0, problem.seqlen_q), slice(0, problem.seqlen_k)).cpu().numpy()
    for b in range(problem.batch):
        head = attention_mpf(
            ctx,
            _to_mpf(ctx, inputs["q"][b]),
            _to_mpf(ctx, inputs["k"][b]),
            _to_mpf(ctx, inputs["v"][b]),
            _to_mpf(ctx, inputs["dout"][b]) if backward else None,
            mask=mask,
            scale=ctx.mpf(problem.scale),
        )
        for name in names:
            results[name].append(head[name])
    arrays = {name: np.array(values, dtype=float).reshape(_shape(problem, name)) for name, values in results.items()}
    return {name: arrays.get(name) for name in ("out", "lse", "delta", "dq", "dk", "dv")}


def attention_mpf(ctx, q: Sequence[Matrix], k: Sequence[Matrix], v: Sequence[Matrix], dout, *, mask: np.ndarray, scale):
    """One batch element in mpf: ``q[h][i][c]``, ``k[g][j][c]``, ``v``, ``dout`` (``None``: forward only).

    Returns nested lists of mpf: ``out``, ``dq`` [h][i][c]; ``lse``, ``delta``
    [h][i]; ``dk``, ``dv`` [g][j][c] (backward entries only when ``dout`` is given).
    """
    group = len(q) // len(k)
    visible = [list(np.flatnonzero(row)) for row in mask]
    head_dim = max((len(head[0]) for head in (*q, *k) if head), default=0)
    zero_row = [ctx.zero] * head_dim
    result: dict[str, list[Any]] = {name: [] for name in ("out", "lse", "delta", "dq")}
    weights = []
    for h, q_head in enumerate(q):
        g = h // group
        k_cols, v_cols = _columns(k[g], head_dim), _columns(v[g], head_dim)
        head_weights = []
        for rows in result.values():
            rows.append([])
        for i, keys in enumerate(visible):
            if not keys:
                row = {"out": zero_row, "lse": ctx.ninf, "delta": ctx.zero, "dq": zero_row, "p": [], "ds": []}
            else:
                dout_row = dout[h][i] if dout is not None else None
                row = _query_row(ctx, q_head[i], k[g], v[g], k_cols, v_cols, keys, dout_row, scale)
            for name, rows in result.items():
                rows[h].append(row[name])
            head_weights.append((keys, row["p"], row["ds"]))
        weights.append(head_weights)
    if dout is None:
        return {"out": result["out"], "lse": result["lse"]}
    dk, dv = _key_rows(ctx, q, k, dout, weights, group, head_dim, scale)
    return {**result, "dk": dk, "dv": dv}


def _query_row(ctx, q_row, k, v, k_cols, v_cols, keys, dout_row, scale) -> dict:
    """Forward (and backward) quantities of one query row that sees ``keys``.

    ``dP_j - D`` is evaluated as ``(dP_j - r) - sum_l P_l (dP_l - r)`` with ``r``
    the ``dP`` of the row's largest score (equal since ``sum_l P_l = 1``), which
    keeps its relative accuracy when the softmax is peaked (:mod:`golden.fast`).
    """
    s = [ctx.fdot(q_row, k[j]) * scale for j in keys]
    pivot = max(range(len(s)), key=s.__getitem__)
    e = [ctx.exp(x - s[pivot]) for x in s]
    ell = ctx.fsum(e)
    p = [x / ell for x in e]
    out = [ctx.fdot(p, [col[j] for j in keys]) for col in v_cols]
    row = {"out": out, "lse": s[pivot] + ctx.log(ell), "p": p}
    if dout_row is None:
        return {**row, "delta": None, "dq": None, "ds": []}
    dp = [ctx.fdot(dout_row, v[j]) for j in keys]
    shifted = [x - dp[pivot] for x in dp]
    offset = ctx.fdot(p, shifted)
    ds = [p_j * (x - offset) for p_j, x in zip(p, shifted)]
    dq = [scale * ctx.fdot(ds, [col[j] for j in keys]) for col in k_cols]
    return {**row, "delta": ctx.fdot(dout_row, out), "dq": dq, "ds": ds}


def _key_rows(ctx, q, k, dout, weights, group, head_dim, scale):
    """dK, dV of every kv head: sums over the group's query heads and the queries that see each key."""
    dk, dv = [], []
    for g, k_head in enumerate(k):
        terms = [[] for _ in k_head]
        for h in range(g * group, (g + 1) * group):
            for i, (keys, p, ds) in enumerate(weights[h]):
                for j, p_j, ds_j in zip(keys, p, ds):
                    terms[j].append((p_j, ds_j, q[h][i], dout[h][i]))
        dk.append([[scale * ctx.fdot((t[1], t[2][c]) for t in key) for c in range(head_dim)] for key in terms])
        dv.append([[ctx.fdot((t[0], t[3][c]) for t in key) for c in range(head_dim)] for key in terms])
    return dk, dv


def _columns(matrix: Matrix, head_dim: int) -> Matrix:
    return [[row[c] for row in matrix] for c in range(head_dim)]


def _to_mpf(ctx, array: np.ndarray) -> list:
    """Nested lists of mpf, exact (every float64 is an mpf at >= 53 bits)."""
    return [_to_mpf(ctx, sub) for sub in array] if array.ndim > 1 else [ctx.mpf(float(x)) for x in array]


def _shape(problem: HeadMajorInputs, name: str) -> tuple[int, ...]:
    if name in ("lse", "delta"):
        return problem.q.shape[:3]
    return problem.k.shape if name in ("dk", "dv") else problem.q.shape
