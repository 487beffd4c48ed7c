"""mpmath reference for selected rows, with exact integer dot products.

The certification (:mod:`golden.certify`) needs a few rows of a large case
in high precision, quickly.  The formulas are those of :mod:`golden.mp`; what
differs is how they are evaluated:

* every float64 array is an exact integer array times a power of two
  (:func:`exact`), so a dot product of two inputs, e.g. ``q_i . k_j`` or
  ``dO_i . v_j``, is an exact integer computed by numpy on Python ints;
* a vector of mpf weights (``P`` or ``dS``) becomes integers on a common
  exponent (terms below ``2**-(2 precision + 64)`` of the largest are dropped,
  as ``mpmath.fsum`` does), so ``sum_j P_ij v_j`` and ``sum_j dS_ij k_j`` are
  exact too and rounded once;
* ``exp``, ``log``, division and every rounding are mpmath's (``libmp``,
  round to nearest) at ``precision_bits``; ``D_i`` is the exact dot product
  of ``dO_i`` with the exact ``O_i`` of the rounded ``P``.

A query row gives ``out``, ``lse``, ``delta`` and ``dq``.  A key row gives
``dk`` and ``dv``, which sum over every query that sees the key, so it takes
``LSE`` and ``D`` of those queries as arguments (see :mod:`golden.certify`
for why the fast path's values may be used there).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from mpmath import libmp

RND = libmp.round_nearest


@dataclasses.dataclass(frozen=True)
class Exact:
    """``ints * 2**exponent``: an object array of Python ints and one exponent."""

    ints: np.ndarray
    exponent: int

    def rows(self, index) -> "Exact":
        return Exact(self.ints[index], self.exponent)


@dataclasses.dataclass(frozen=True)
class QueryRow:
    out: list
    lse: tuple
    delta: tuple | None
    dq: list | None


def exact(x: np.ndarray) -> Exact:
    """The exact integer form of a float64 array (finite values)."""
    mantissa, exponent = np.frexp(x)
    ints = np.ldexp(mantissa, 53).astype(np.int64)
    exponent = exponent.astype(np.int64) - 53
    nonzero = ints != 0
    if not nonzero.any():
        return Exact(np.zeros(x.shape, dtype=object), 0)
    trailing = np.where(nonzero, np.frexp((ints & -ints).astype(np.float64))[1] - 1, 0)
    ints >>= trailing
    exponent += trailing
    base = int(exponent[nonzero].min())
    shifts = np.where(nonzero, exponent - base, 0)
    return Exact(ints.astype(object) << shifts.astype(object), base)


def mpf(value: float) -> tuple:
    """A float64 as an exact raw mpf."""
    return libmp.from_float(float(value))


def query_row(q_row: np.ndarray, k: Exact, v: Exact, dout_row: np.ndarray | None, scale: float, prec: int) -> QueryRow:
    """One query row; ``k`` and ``v`` hold only the keys the row sees (at least one)."""
    q_x = exact(q_row)
    scores = k.ints @ q_x.ints
    score_exp = k.exponent + q_x.exponent
    top = max(scores) if scale >= 0 else min(scores)
    scale_mpf = mpf(scale)
    e = [libmp.mpf_exp(libmp.mpf_mul(libmp.from_man_exp(s - top, score_exp), scale_mpf), prec, RND) for s in scores]
    ell = libmp.mpf_sum(e, prec, RND)
    row_max = libmp.mpf_mul(libmp.from_man_exp(top, score_exp), scale_mpf, prec, RND)
    lse = libmp.mpf_add(row_max, libmp.mpf_log(ell, prec, RND), prec, RND)
    p = [libmp.mpf_div(x, ell, prec, RND) for x in e]
    p_x = _fixed(p, prec)
    out_ints = p_x.ints @ v.ints
    out_exp = p_x.exponent + v.exponent
    out = [libmp.from_man_exp(o, out_exp, prec, RND) for o in out_ints]
    if dout_row is None:
        return QueryRow(out, lse, None, None)
    dout_x = exact(dout_row)
    delta = libmp.from_man_exp(out_ints @ dout_x.ints, out_exp + dout_x.exponent, prec, RND)
    dp_exp = v.exponent + dout_x.exponent
    ds = [
        libmp.mpf_mul(p_j, libmp.mpf_sub(libmp.from_man_exp(dp, dp_exp), delta, prec, RND), prec, RND)
        for p_j, dp in zip(p, v.ints @ dout_x.ints)
    ]
    ds_x = _fixed(ds, prec)
    dq_exp = ds_x.exponent + k.exponent
    dq = [libmp.mpf_mul(libmp.from_man_exp(x, dq_exp), scale_mpf, prec, RND) for x in ds_x.ints @ k.ints]
    return QueryRow(out, lse, delta, dq)


def key_row(k_row: np.ndarray, v_row: np.ndarray, heads, scale: float, prec: int) -> tuple[list, list]:
    """``dk`` and ``dv`` of one key row.

    ``heads``: for each query head of the kv head's group, ``(q, dout, lse, delta)``
    restricted to the queries that see the key: ``q``, ``dout`` as :class:`Exact`,
    ``lse`` and ``delta`` as lists of raw mpf.  With
    ``P_ij = exp(S_ij - LSE_i)``: ``dV_j = sum P_ij dO_i``,
    ``dK_j = scale sum P_ij (dP_ij - D_i) q_i``.
    """
    k_x, v_x = exact(k_row), exact(v_row)
    scale_mpf = mpf(scale)
    dk_parts, dv_parts = [], []
    for q, dout, lse, delta in heads:
        score_exp = q.exponent + k_x.exponent
        p = [
            libmp.mpf_exp(
                libmp.mpf_sub(libmp.mpf_mul(libmp.from_man_exp(s, score_exp), scale_mpf), lse_i, prec, RND), prec, RND
            )
            for s, lse_i in zip(q.ints @ k_x.ints, lse)
        ]
        dp_exp = dout.exponent + v_x.exponent
        ds = [
            libmp.mpf_mul(p_i, libmp.mpf_sub(libmp.from_man_exp(dp, dp_exp), delta_i, prec, RND), prec, RND)
            for p_i, dp, delta_i in zip(p, dout.ints @ v_x.ints, delta)
        ]
        p_x, ds_x = _fixed(p, prec), _fixed(ds, prec)
        dv_parts.append([libmp.from_man_exp(x, p_x.exponent + dout.exponent) for x in p_x.ints @ dout.ints])
        dk_parts.append([libmp.from_man_exp(x, ds_x.exponent + q.exponent) for x in ds_x.ints @ q.ints])
    dv = [libmp.mpf_sum(parts, prec, RND) for parts in zip(*dv_parts)]
    dk = [libmp.mpf_mul(libmp.mpf_sum(parts), scale_mpf, prec, RND) for parts in zip(*dk_parts)]
    return dk, dv


def _fixed(values: list, prec: int) -> Exact:
    """Raw mpf values as integers on one exponent, dropping those below 2**-(2 prec + 64) of the largest."""
    tops = [exp + bc for _, man, exp, bc in values if man]
    if not tops:
        return Exact(np.zeros(len(values), dtype=object), 0)
    floor = max(tops) - 2 * prec - 64
    kept = [v if v[1] and v[2] + v[3] > floor else libmp.fzero for v in values]
    base = min(exp for _, man, exp, _ in kept if man)
    ints = [(-man if sign else man) << (exp - base) if man else 0 for sign, man, exp, _ in kept]
    return Exact(np.array(ints, dtype=object), base)
