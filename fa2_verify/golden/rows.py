"""mpmath reference for selected rows, with exact integer dot products.

The certification (:mod:`golden.certify`) checks its double-double reference
rows (:mod:`golden.dd_rows`) against these on a few rows of every case, cut
to a few hundred terms.  The formulas are those of :mod:`golden.mp`; what
differs is how they are evaluated:

* every float64 array is an exact integer array times a power of two,
  stored as signed int64 limbs of :data:`LIMB_BITS` bits (:func:`exact`), so a
  dot product of two inputs, e.g. ``q_i . k_j`` or ``dO_i . v_j``, is an exact
  integer: int64 products of limbs cannot overflow, and the partial results
  are combined as Python ints (:func:`dot`);
* a vector of mpf weights (``P`` or ``dS``) becomes integer limbs on a common
  exponent (dropping only terms far below float64's range), so
  ``sum_j P_ij v_j`` and ``sum_j dS_ij k_j`` are exact too and rounded once;
* ``exp``, ``log``, division and every rounding are mpmath's (``libmp``,
  round to nearest) at ``precision_bits``; ``D_i`` is the exact dot product
  of ``dO_i`` with the exact ``O_i`` of the rounded ``P``, and ``dP_ij - D_i``
  is evaluated around a pivot key as in :mod:`golden.fast` (step 4), the
  integers ``dP_ij - dP_{i,pivot}`` being exact.

A query row gives ``out``, ``lse``, ``delta``, the offset ``D_i - dP_{i,pivot}``
and ``dq``.  A key row gives ``dk`` and ``dv``, which sum over every query
that sees the key, so it takes ``LSE`` and the offset of those queries as
arguments (see :mod:`golden.certify` for why the fast path's values may be
used there).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from mpmath import libmp

from fa2_verify.golden.eft import odd_form

RND = libmp.round_nearest

#: Bits per int64 limb: a product of two limbs is below 2**40, so int64 holds
#: any sum of fewer than 2**23 of them (:func:`dot` checks, else uses Python ints).
LIMB_BITS = 20
_LIMB_MASK = (1 << LIMB_BITS) - 1


@dataclasses.dataclass(frozen=True)
class Exact:
    """``sum_l limbs[l] * 2**(LIMB_BITS * l) * 2**exponent``: an exact integer array.

    ``limbs`` is int64 of shape ``(count, *shape)``, each limb of magnitude
    below ``2**LIMB_BITS`` and of the sign of its integer; ``values`` is the
    array in float64 (for magnitudes only).
    """

    limbs: np.ndarray
    exponent: int
    values: np.ndarray

    def rows(self, index) -> Exact:
        return Exact(self.limbs[:, index], self.exponent, self.values[index])

    def ints(self) -> np.ndarray:
        """The integers as a numpy object array of Python ints."""
        total = np.zeros(self.limbs.shape[1:], dtype=object)
        for count, limb in enumerate(self.limbs):
            total = total + (limb.astype(object) << (LIMB_BITS * count))
        return total


@dataclasses.dataclass(frozen=True)
class Row:
    """Raw mpf results of one row, each with the magnitude of the terms it sums (float64).

    The magnitudes are the scales certification measures errors against:
    ``sum_j P_ij |v_jc|`` for ``out``, ``max_j |S_ij|`` for ``lse``,
    ``sum_c |dO_ic O_ic|`` for ``delta``, ``sum_j P_ij |dP_ij - r_i|`` for the
    offset ``D_i - r_i``, ``|scale| sum_j |dS_ij k_jc|`` for ``dq``,
    ``|scale| sum_i |dS_ij q_ic|`` for ``dk`` and ``sum_i P_ij |dO_ic|`` for ``dv``.
    """

    values: dict[str, list]
    magnitudes: dict[str, np.ndarray | float]


def exact(x: np.ndarray | torch.Tensor) -> Exact:
    """The exact integer form of a float64 array or tensor (finite values), computed on the tensor's device.

    The limb extraction is a few dozen elementwise passes: on CUDA they take
    milliseconds for a head of 131,072 x 128 values where numpy takes
    seconds; only the limbs come back to the host.
    """
    t = torch.as_tensor(x)
    values = t.cpu().numpy()
    odd, exponent = odd_form(t)
    nonzero = odd != 0
    if not bool(nonzero.any()):
        return Exact(np.zeros((1, *values.shape), dtype=np.int64), 0, values)
    magnitude = odd.abs()
    base = int(exponent[nonzero].min())
    shift = torch.where(nonzero, exponent - base, 0)
    bits = torch.frexp(magnitude.to(torch.float64)).exponent.to(torch.int64)
    count = -(-int((shift + bits).max()) // LIMB_BITS)
    sign = odd.sign()
    limbs = torch.empty((count, *t.shape), dtype=torch.int64, device=t.device)
    for index in range(count):
        low = LIMB_BITS * index - shift
        left = (-low).clamp(0, LIMB_BITS)
        window = (magnitude >> low.clamp(0, 63)) & ((torch.ones_like(left) << (LIMB_BITS - left)) - 1)
        limbs[index] = sign * (window << left)
    return Exact(limbs.cpu().numpy(), base, values)


def dot(a: Exact, b: Exact) -> tuple:
    """``(ints, exponent)`` of the exact product ``a @ b`` (numpy matmul shapes, Python ints)."""
    return _combine(a, b, np.matmul)


def row_dot(a: Exact, b: Exact) -> tuple:
    """``(ints, exponent)`` of the exact ``sum(a * b, axis=-1)``."""
    return _combine(a, b, lambda x, y: np.sum(x * y, axis=-1))


def _combine(a: Exact, b: Exact, product) -> tuple:
    """Sum the limb products per power of two, in int64 where that cannot overflow, then as Python ints.

    One product of limbs sums ``K`` (the contraction length) integers below
    ``2**(2 LIMB_BITS)``; while ``K < 2**(53 - 2 LIMB_BITS)`` every partial
    sum is an integer below ``2**53``, so float64 BLAS computes it exactly
    in any order, far faster than numpy's integer matmul.
    """
    length = a.limbs.shape[-1]
    terms = length * min(len(a.limbs), len(b.limbs))
    in_int64 = terms < 2 ** (63 - 2 * LIMB_BITS)
    if length < 2 ** (53 - 2 * LIMB_BITS):
        a_limbs, b_limbs = a.limbs.astype(np.float64), b.limbs.astype(np.float64)
        exact_product = lambda x, y: np.asarray(product(x, y)).astype(np.int64)
    else:
        a_limbs, b_limbs, exact_product = a.limbs, b.limbs, product
    by_shift: dict[int, np.ndarray] = {}
    for i, a_limb in enumerate(a_limbs):
        for j, b_limb in enumerate(b_limbs):
            part = exact_product(a_limb, b_limb)
            part = part if in_int64 else _python_ints(part)
            by_shift[i + j] = by_shift[i + j] + part if i + j in by_shift else part
    total = 0
    for shift in range(max(by_shift), -1, -1):
        total = (total << LIMB_BITS) + _python_ints(by_shift[shift])
    return total, a.exponent + b.exponent


def _python_ints(x):
    return x.astype(object) if isinstance(x, np.ndarray) else int(x)


def mpf(value: float) -> tuple:
    """A float64 as an exact raw mpf."""
    return libmp.from_float(float(value))


def query_row(
    q_row: np.ndarray, k: Exact, v: Exact, dout_row: np.ndarray | None, scale: float, prec: int, pivot: int
) -> Row:
    """``out``, ``lse`` (and ``delta``, ``offset``, ``dq``) of one query row.

    ``k``, ``v`` hold only the keys the row sees; ``pivot`` indexes one of them,
    whose ``r = dP_pivot`` anchors ``dP_j - D = (dP_j - r) - offset`` with
    ``offset = D - r = sum_j P_j (dP_j - r)`` (:mod:`golden.fast`, step 4).
    """
    scores, score_exp = dot(k, exact(q_row))
    top = max(scores) if scale >= 0 else min(scores)
    scale_mpf = mpf(scale)
    e = [libmp.mpf_exp(libmp.mpf_mul(libmp.from_man_exp(s - top, score_exp), scale_mpf), prec, RND) for s in scores]
    ell = libmp.mpf_sum(e, prec, RND)
    row_max = libmp.mpf_mul(libmp.from_man_exp(top, score_exp), scale_mpf, prec, RND)
    lse = libmp.mpf_add(row_max, libmp.mpf_log(ell, prec, RND), prec, RND)
    p_values = [libmp.mpf_div(x, ell, prec, RND) for x in e]
    p = _weights(p_values, v)
    out_ints, out_exp = dot(p, v)
    out = [libmp.from_man_exp(o, out_exp, prec, RND) for o in out_ints]
    values = {"out": out, "lse": lse}
    magnitudes = {"out": p.values @ np.abs(v.values), "lse": abs(scale) * np.max(np.abs(k.values @ q_row))}
    if dout_row is None:
        return Row(values, magnitudes)
    dout_x = exact(dout_row)
    values["delta"] = libmp.from_man_exp(int(out_ints @ dout_x.ints()), out_exp + dout_x.exponent, prec, RND)
    dp, dp_exp = dot(v, dout_x)
    shifted = dp - dp[pivot]
    terms = [libmp.mpf_mul(p_j, libmp.from_man_exp(x, dp_exp)) for p_j, x in zip(p_values, shifted)]
    offset = libmp.mpf_sum(terms, prec, RND)
    ds = _ds(p_values, shifted, dp_exp, [offset] * len(p_values), prec, k)
    dq_ints, dq_exp = dot(ds, k)
    values.update(
        offset=offset, dq=[libmp.mpf_mul(libmp.from_man_exp(x, dq_exp), scale_mpf, prec, RND) for x in dq_ints]
    )
    shifted_values = v.values @ dout_row - v.values[pivot] @ dout_row
    magnitudes.update(
        delta=np.abs(dout_row) @ np.abs(np.array([libmp.to_float(o) for o in out])),
        offset=p.values @ np.abs(shifted_values),
        dq=abs(scale) * (np.abs(ds.values) @ np.abs(k.values)),
    )
    return Row(values, magnitudes)


def key_row(k_row: np.ndarray, v: Exact, key: int, heads, scale: float, prec: int) -> Row:
    """``dk`` and ``dv`` of key ``key`` of the kv head whose values are ``v``.

    ``heads``: for each query head of the group, ``(q, dout, lse, pivots, offsets)``
    restricted to the queries that see the key: ``q``, ``dout`` as :class:`Exact`,
    ``lse`` and ``offsets`` as lists of raw mpf, ``pivots`` the key index of each
    query's pivot.  With ``P_ij = exp(S_ij - LSE_i)`` and
    ``dP_ij - D_i = (dP_ij - dP_{i,pivot(i)}) - offset_i``:
    ``dV_j = sum_i P_ij dO_i``, ``dK_j = scale sum_i P_ij (dP_ij - D_i) q_i``.
    """
    k_x = exact(k_row)
    scale_mpf = mpf(scale)
    dk_parts, dv_parts = [], []
    dk_magnitude = dv_magnitude = 0.0
    for q, dout, lse, pivots, offsets in heads:
        scores, score_exp = dot(q, k_x)
        p_values = [
            libmp.mpf_exp(
                libmp.mpf_sub(libmp.mpf_mul(libmp.from_man_exp(s, score_exp), scale_mpf), lse_i, prec, RND), prec, RND
            )
            for s, lse_i in zip(scores, lse)
        ]
        dp, dp_exp = dot(dout, v.rows(key))
        anchors, _ = row_dot(dout, v.rows(pivots))
        p = _weights(p_values, dout)
        ds = _ds(p_values, dp - anchors, dp_exp, offsets, prec, q)
        dv_ints, dv_exp = dot(p, dout)
        dk_ints, dk_exp = dot(ds, q)
        dv_parts.append([libmp.from_man_exp(x, dv_exp) for x in dv_ints])
        dk_parts.append([libmp.from_man_exp(x, dk_exp) for x in dk_ints])
        dv_magnitude = dv_magnitude + p.values @ np.abs(dout.values)
        dk_magnitude = dk_magnitude + abs(scale) * (np.abs(ds.values) @ np.abs(q.values))
    dv = [libmp.mpf_sum(parts, prec, RND) for parts in zip(*dv_parts)]
    dk = [libmp.mpf_mul(libmp.mpf_sum(parts), scale_mpf, prec, RND) for parts in zip(*dk_parts)]
    return Row({"dk": dk, "dv": dv}, {"dk": dk_magnitude, "dv": dv_magnitude})


def _ds(p_values: list, shifted: np.ndarray, shifted_exp: int, offsets: list, prec: int, other: Exact) -> Exact:
    """``dS_j = P_j ((dP_j - r_j) - offset_j)`` as weights for ``other``; ``shifted`` holds ``dP_j - r_j`` as ints."""
    return _weights(
        [
            libmp.mpf_mul(p_j, libmp.mpf_sub(libmp.from_man_exp(x, shifted_exp), offset, prec, RND), prec, RND)
            for p_j, x, offset in zip(p_values, shifted, offsets)
        ],
        other,
    )


def _weights(values: list, other: Exact) -> Exact:
    """Raw mpf weights of a sum ``sum_j w_j other_j`` as exact limbs.

    A weight whose every term is below ``2**-(1086 + log2 n)`` is dropped:
    all of them together change the sum by less than ``2**-1086``, far below
    float64's smallest normal number (the certification ignores differences
    below that, :data:`golden.certify.UNDERFLOW`).
    """
    peak = float(np.max(np.abs(other.values))) if other.values.size else 0.0
    floor = -1086 - math.ceil(math.log2(max(len(values), 1))) - math.frexp(peak)[1]
    kept = [v if peak and v[1] and v[2] + v[3] > floor else libmp.fzero for v in values]
    tops = [exp + bc for _, man, exp, bc in kept if man]
    if not tops:
        return Exact(np.zeros((1, len(values)), dtype=np.int64), 0, np.zeros(len(values)))
    base = min(exp for _, man, exp, _ in kept if man)
    count = -(-(max(tops) - base) // LIMB_BITS)
    magnitudes = np.array([man << (exp - base) if man else 0 for _, man, exp, _ in kept] + [None])[:-1]
    signs = np.array([-1 if sign else 1 for sign, *_ in kept], dtype=np.int64)
    limbs = np.empty((count, len(values)), dtype=np.int64)
    for index in range(count):
        limbs[index] = ((magnitudes >> (LIMB_BITS * index)) & _LIMB_MASK).astype(np.int64) * signs
    approximations = sum(np.ldexp(limb.astype(np.float64), LIMB_BITS * i + base) for i, limb in enumerate(limbs))
    return Exact(limbs, base, approximations)
