"""Error-free transformations in float64 and an Ozaki-split matrix product.

A pair ``(hi, lo)`` of float64 arrays stands for the unevaluated sum
``hi + lo`` (double-double).  The transformations below are exact for finite
inputs without overflow:

* :func:`two_sum` (Knuth): ``s + e == a + b`` with ``s = fl(a + b)``.
* :func:`two_prod` (Dekker, Veltkamp split; numpy has no fused multiply-add):
  ``p + e == a * b`` with ``p = fl(a * b)``.
* :func:`dot2` (Ogita, Rump and Oishi 2005, "Accurate sum and dot product",
  Algorithm Dot2): a dot product as accurate as if computed in twice the
  working precision.
* :func:`dd_matmul` (Ozaki, Ogita, Oishi and Rump 2012, "Error-free
  transformations of matrix multiplication"): each row of ``a`` and each column
  of ``b`` is split into slices ``a = a_0 + a_1 + ...`` whose entries are
  integers of at most ``beta`` bits times a power of two common to the row
  (column).  With ``2*beta + ceil(log2 k) <= 53`` every product
  ``a_s @ b_t`` is computed by float64 BLAS *exactly*, whatever the
  summation order; the leading product is kept apart from the sum of the
  others, which are at least ``2**beta`` times smaller.
"""

from __future__ import annotations

import math

import numpy as np

#: Veltkamp's splitter for float64: 2**27 + 1.
SPLITTER = 134217729.0

#: Bits kept below a row's (column's) leading bit by :func:`dd_matmul`: ten
#: more than float64 carries, so the truncation is below the rounding of the
#: operands themselves.
OZAKI_BITS = 63

#: Row exponents for which every ``sigma`` of :func:`_slices` is a normal float64.
_MIN_EXPONENT, _MAX_EXPONENT = -900, 900


def two_sum(a, b):
    """``(s, e)`` with ``s = fl(a + b)`` and ``s + e = a + b`` exactly."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def two_prod(a, b):
    """``(p, e)`` with ``p = fl(a * b)`` and ``p + e = a * b`` exactly (|a|, |b| < 2**995)."""
    p = a * b
    a_hi, a_lo = _veltkamp(a)
    b_hi, b_lo = _veltkamp(b)
    return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def dot2(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Double-double ``sum(x * y, axis=-1)``, error ~ ``2**-106 * sum|x*y|`` plus ``2**-53 |x.y|``."""
    hi, lo = two_prod(x[..., 0], y[..., 0])
    for c in range(1, x.shape[-1]):
        product, product_err = two_prod(x[..., c], y[..., c])
        hi, sum_err = two_sum(hi, product)
        lo = lo + (product_err + sum_err)
    return two_sum(hi, lo)


def dd_matmul(a: np.ndarray, b: np.ndarray, *, bits: int = OZAKI_BITS) -> tuple[np.ndarray, np.ndarray]:
    """``a @ b`` as an unevaluated pair ``hi + lo`` for 2-D float64 ``a`` (m, k), ``b`` (k, n).

    ``hi = a_0 @ b_0`` exactly; ``lo`` sums, in float64, the other exact products
    ``a_s @ b_t`` with ``s + t < count`` (``count = ceil(bits / beta)`` slices
    each), all at most ``2**-beta`` of the leading scale.  With
    ``M = k max_c|a_ic| max_c|b_cj|``:

        |hi + lo - a @ b| <= (count**2 + 2) 2**-bits M + count 2**-(53 + beta) M.
    """
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n)), np.zeros((m, n))
    beta = (53 - math.ceil(math.log2(k))) // 2
    count = -(-bits // beta)
    a_slices = _slices(a, 1, beta, count)
    b_slices = _slices(b, 0, beta, count)
    pairs = sorted(((s, t) for s in range(len(a_slices)) for t in range(len(b_slices)) if 0 < s + t < count), key=sum)
    hi = a_slices[0] @ b_slices[0]
    if not pairs:
        return hi, np.zeros_like(hi)
    lo = a_slices[pairs[-1][0]] @ b_slices[pairs[-1][1]]
    for s, t in reversed(pairs[:-1]):
        lo += a_slices[s] @ b_slices[t]
    return hi, lo


def _veltkamp(a):
    c = SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def _slices(x: np.ndarray, axis: int, beta: int, count: int) -> list[np.ndarray]:
    """Error-free split of ``x`` into at most ``count`` slices aligned along ``axis``.

    Slice ``s`` (from 1) is ``x``'s remainder rounded to a multiple of
    ``2**(e - beta s)`` (Rump's ExtractScalar: ``fl(r + sigma) - sigma`` with
    ``sigma = 0.75 * 2**(e - beta s + 53)``), so its entries are integers of
    magnitude at most ``2**beta`` in that unit; ``2**e`` bounds the row's
    (column's) magnitudes.  Rows too far out of float64's exponent range for
    ``sigma`` fall back to ``ldexp``/``trunc`` slices (integers below
    ``2**beta``), exact unless the slice's unit underflows.
    """
    peak = np.maximum(np.max(x, axis=axis, keepdims=True), -np.min(x, axis=axis, keepdims=True))
    exponent = np.frexp(peak)[1]
    safe = bool(np.all((exponent > _MIN_EXPONENT) & (exponent < _MAX_EXPONENT)))
    slices = []
    rest = x
    for s in range(1, count + 1):
        if safe:
            sigma = np.ldexp(0.75, exponent - beta * s + 53)
            piece = rest + sigma
            piece -= sigma
        else:
            shift = beta * s - exponent
            piece = np.ldexp(np.trunc(np.ldexp(rest, shift)), -shift)
        slices.append(piece)
        if s == count:
            break
        rest = rest - piece if rest is x else np.subtract(rest, piece, out=rest)
        if not rest.any():
            break
    return slices
