"""Double-double arithmetic on tensors: ``(hi, lo)`` pairs of float64 carrying about 106 bits.

The reference rows of the certification (:mod:`golden.dd_rows`) are
evaluated with these, on the case's device.  Each operation is built from the
error-free transformations of :mod:`golden.eft` (``two_sum``, ``two_prod``,
exact for finite operands below ``2**995``) and rounds a few times at
``u = 2**-106`` relative to its operands (Hida, Li and Bailey 2001, "Algorithms
for quad-double precision floating point arithmetic"; Joldes, Muller and Popescu
2017, "Tight and rigorous error bounds for basic building blocks of
double-word arithmetic", Algorithms 6, 10 and 17):

* :func:`add`: ``|err| <= 3u |a + b|``; :func:`mul`: ``|err| <= 5u |a b|``;
  :func:`div`: ``|err| <= 10u |a / b|``;
* :func:`exp`: ``exp(x) = 2**k (1 + expm1(r / 2**10))**(2**10)`` with
  ``r = x - k log 2``, ``|r| <= log(2) / 2``; ``expm1`` by its Taylor series to
  degree 9 (remainder below ``2**-120`` of it) and ten squarings of
  ``1 + e`` carried as ``e``: relative error about ``2**10 * 8u = 2**-93``;
* :func:`log`: one Newton step ``y = y0 + (a exp(-y0) - 1)`` from the float64
  ``y0 = log(a_hi)`` (quadratic convergence from ``2**-52``), absolute error
  about ``2**-93``;
* :func:`total`: pairwise summation, ``ceil(log2 n)`` levels of :func:`add`:
  ``|err| <= 3u ceil(log2 n) sum |x_i|``.

None of this is a bound the certification relies on: the reference rows are
themselves checked against mpmath (:mod:`golden.certify`).  Entries must be
finite; callers zero masked entries before and after.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from fa2_verify.golden.eft import ldexp, two_prod, two_sum

DD = tuple[torch.Tensor, torch.Tensor]

#: ``log 2`` as a double-double.
_LN2 = (0.6931471805599453, 2.3190468138462996e-17)

#: ``1 / n!`` for n = 0..11 as double-doubles, for :func:`exp`'s Taylor series.
_INVERSE_FACTORIALS = tuple(
    (float(Fraction(1, math.factorial(n))), float(Fraction(1, math.factorial(n)) - Fraction(float(Fraction(1, math.factorial(n))))))
    for n in range(12)
)

#: Squarings after the argument's reduction by ``2**SQUARINGS``.
SQUARINGS = 10


def of(x: torch.Tensor) -> DD:
    """``x`` as a double-double (``lo = 0``)."""
    return x, torch.zeros_like(x)


def value(x: DD) -> torch.Tensor:
    """``hi + lo`` rounded to float64."""
    return x[0] + x[1]


def _fast_two_sum(a: torch.Tensor, b: torch.Tensor) -> DD:
    """``s + e = a + b`` exactly when ``|a| >= |b|`` (or ``a = 0``)."""
    s = a + b
    return s, b - (s - a)


def add(a: DD, b: DD) -> DD:
    """``a + b``, Joldes-Muller-Popescu's AccurateDWPlusDW."""
    s, e = two_sum(a[0], b[0])
    t, f = two_sum(a[1], b[1])
    s, e = _fast_two_sum(s, e + t)
    return _fast_two_sum(s, e + f)


def neg(a: DD) -> DD:
    return -a[0], -a[1]


def sub(a: DD, b: DD) -> DD:
    return add(a, neg(b))


def mul(a: DD, b: DD) -> DD:
    """``a * b``: the exact product of the high parts plus the cross terms."""
    p, e = two_prod(a[0], b[0])
    return _fast_two_sum(p, e + (a[0] * b[1] + a[1] * b[0]))


def scaled(a: DD, factor: float) -> DD:
    """``a * factor`` for a float64 ``factor``."""
    p, e = two_prod(a[0], factor)
    return _fast_two_sum(p, e + a[1] * factor)


def div(a: DD, b: DD) -> DD:
    """``a / b`` by long division: three float64 quotient digits, each remainder formed in double-double."""
    q1 = a[0] / b[0]
    r = sub(a, mul(b, of(q1)))
    q2 = r[0] / b[0]
    r = sub(r, mul(b, of(q2)))
    q3 = r[0] / b[0]
    q1, q2 = _fast_two_sum(q1, q2)
    return add((q1, q2), of(q3))


#: Below this ``exp`` is 0 in float64 (``exp(-746) < 2**-1075``).
_EXP_UNDERFLOW = -746.0


def exp(x: DD) -> DD:
    """``exp(x)`` for finite ``x`` (module docstring); 0 below float64's range, ``x`` above ``709`` overflows."""
    below = x[0] < _EXP_UNDERFLOW
    x = (torch.where(below, 0.0, x[0]), torch.where(below, 0.0, x[1]))  # reduced in range, then zeroed
    k = torch.round(x[0] / _LN2[0])
    k_ln2 = add(two_prod(k, _LN2[0]), of(k * _LN2[1]))
    r = sub(x, k_ln2)
    s = (r[0] * 2.0**-SQUARINGS, r[1] * 2.0**-SQUARINGS)  # exact unless r[1] is subnormal, which costs nothing
    series = (torch.full_like(s[0], _INVERSE_FACTORIALS[10][0]), torch.full_like(s[0], _INVERSE_FACTORIALS[10][1]))
    for n in range(9, 0, -1):  # expm1(s) / s = sum_{n >= 1} s**(n-1) / n!
        series = add(mul(series, s), (torch.full_like(s[0], _INVERSE_FACTORIALS[n][0]),
                                       torch.full_like(s[0], _INVERSE_FACTORIALS[n][1])))
    e = mul(series, s)
    for _ in range(SQUARINGS):  # expm1(2 t) = expm1(t) (2 + expm1(t))
        e = mul(e, add(e, of(torch.full_like(e[0], 2.0))))
    one_plus = add(of(torch.ones_like(e[0])), e)
    k = k.to(torch.int64)
    return torch.where(below, 0.0, ldexp(one_plus[0], k)), torch.where(below, 0.0, ldexp(one_plus[1], k))


def log(a: DD) -> DD:
    """``log(a)`` for positive finite ``a``: one Newton step from float64's ``log(a_hi)``."""
    y0 = torch.log(a[0])
    correction = add(mul(a, exp(of(-y0))), of(torch.full_like(y0, -1.0)))
    return add(of(y0), correction)


def total(x: DD, dim: int = -1) -> DD:
    """``sum(x, dim)`` by pairwise :func:`add` (``ceil(log2 n)`` levels)."""
    hi, lo = x[0].movedim(dim, -1), x[1].movedim(dim, -1)
    if hi.shape[-1] == 0:
        return hi.sum(-1), lo.sum(-1)
    while hi.shape[-1] > 1:
        if hi.shape[-1] % 2:
            pad = hi.new_zeros((*hi.shape[:-1], 1))
            hi, lo = torch.cat((hi, pad), -1), torch.cat((lo, pad), -1)
        hi, lo = add((hi[..., 0::2], lo[..., 0::2]), (hi[..., 1::2], lo[..., 1::2]))
    return hi[..., 0], lo[..., 0]

