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
  integer multiples of ``2**(e - beta*(s+1))`` below ``2**(e - beta*s)``
  (``2**e`` bounds the row's largest magnitude).  With
  ``2*beta + ceil(log2 k) <= 53`` every product ``a_s @ b_t`` is computed by
  float64 BLAS *exactly*, whatever the summation order.  Summing the products
  with :func:`two_sum` gives ``a @ b`` as a double-double.
"""

from __future__ import annotations

import math

import numpy as np

#: Veltkamp's splitter for float64: 2**27 + 1.
SPLITTER = 134217729.0

#: Bits kept below a row's (column's) leading bit by :func:`dd_matmul`.
OZAKI_BITS = 80

#: |shift| beyond which multiplying by 2**shift could overflow or underflow.
_SAFE_SHIFT = 1022


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
    """Double-double ``a @ b`` for 2-D float64 ``a`` (m, k) and ``b`` (k, n).

    Slices keep ``bits`` bits below each row's (column's) leading bit, and the
    products ``a_s @ b_t`` with ``s + t`` below the slice count are summed, so

        |hi + lo - a @ b| <= (count**2 + 2) * k * 2**-bits * 4 * max_c|a_ic| * max_c|b_cj|

    with ``count = ceil(bits / beta)``; the products themselves are exact.
    """
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n)), np.zeros((m, n))
    beta = (53 - math.ceil(math.log2(k))) // 2
    count = -(-bits // beta)
    a_slices = _slices(a, 1, beta, count)
    b_slices = _slices(b, 0, beta, count)
    hi = lo = None
    for level in range(count):
        for s in range(level + 1):
            t = level - s
            if s >= len(a_slices) or t >= len(b_slices):
                continue
            product = a_slices[s] @ b_slices[t]
            if hi is None:
                hi, lo = product, np.zeros_like(product)
            else:
                hi, err = two_sum(hi, product)
                lo += err
    return two_sum(hi, lo)


def _veltkamp(a):
    c = SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def _slices(x: np.ndarray, axis: int, beta: int, count: int) -> list[np.ndarray]:
    """Split ``x`` into at most ``count`` slices aligned along ``axis`` (error-free)."""
    exponent = np.frexp(np.max(np.abs(x), axis=axis, keepdims=True))[1]
    slices = []
    rest = x
    for s in range(1, count + 1):
        shift = beta * s - exponent
        piece = _times_pow2(np.trunc(_times_pow2(rest, shift)), -shift)
        slices.append(piece)
        rest = rest - piece
        if not rest.any():
            break
    return slices


def _times_pow2(x: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``x * 2**shift`` exactly: a multiply by a normal power of two, else ``ldexp``."""
    if shift.size and int(np.max(np.abs(shift))) <= _SAFE_SHIFT:
        return x * np.ldexp(1.0, shift)
    return np.ldexp(x, shift)
