"""Exact fixed-point matrix products on the device, rounded once to a double-double.

A row ``x`` of a matrix (the entries one output element sums against) is
written on a common exponent ``E``, ``2**E`` bounding its magnitudes:

    x_j = sum_{l < count} limb_{l,j} 2**(E - LIMB_BITS (l + 1))  +  r_j,    |r_j| <= 2**(E - LIMB_BITS count)

with integer limbs ``|limb| <= 2**LIMB_BITS`` (:func:`fixed`; a double-double
``x`` works the same way).  A product ``sum_j a_ij b_jc`` of two such operands,
rows of ``a`` and columns of ``b``, is then a sum over limb pairs of integer
products below ``2**(2 LIMB_BITS)``: in chunks of :data:`CHUNK` terms every
partial sum is an integer below ``2**53``, so float64 GEMMs (cuBLAS on CUDA)
compute them exactly in any order; the chunks add exactly in int64, and the
per-shift totals are rounded once into a double-double (:func:`matmul`).  The
only errors are the dropped remainders ``r``, bounded per element by

    sum_j |a_ij| 2**Fb_c'  +  2**Ea_i' |b_jc|  +  2**Ea_i' 2**Fb_c'     (primes: the remainders' exponents)

which :func:`matmul` returns beside the product (its ``slack``), and the
double-double rounding of the result (``2**-104`` of it).  After Ozaki, Ogita,
Oishi and Rump (2012), "Error-free transformations of matrix multiplication",
with a fixed rather than adaptive split: an independent computation from the
fast golden's :func:`golden.eft.dd_matmul`.
"""

from __future__ import annotations

import dataclasses

import torch

from fa2_verify.golden import dd
from fa2_verify.golden.eft import ldexp, odd_form, two_prod, two_sum

#: Bits per limb: a product of two limbs is at most ``2**40``.
LIMB_BITS = 20

#: Terms per exact float64 partial sum: ``CHUNK * 2**(2 LIMB_BITS) <= 2**53``.
CHUNK = 2 ** (53 - 2 * LIMB_BITS)

#: Limbs kept of a double-double operand: 120 bits below its row's largest magnitude.
LIMBS = 6

#: Most limbs of an input operand: exact for rows whose magnitudes span up to 187 binades of float64 values.
INPUT_LIMBS = 12

#: Chunks summed in int64 before the running total moves to double-double: each shift adds at most
#: ``INPUT_LIMBS`` limb pairs of ``2**6`` chunks below ``2**53``, ``12 * 2**59 < 2**63``.
_CHUNKS_PER_GROUP = 2**6


@dataclasses.dataclass(frozen=True)
class Fixed:
    """Limbs ``(count, *shape)`` of integers in float64; the exponent ``E`` (int64, the contracted axis of size 1);
    the bound of each entry's dropped remainder, ``2**(E + 1 - LIMB_BITS count)`` (0 where the limbs are exact);
    the bound ``2**E`` of its magnitude (both float64, of the exponent's shape)."""

    limbs: torch.Tensor
    exponent: torch.Tensor
    remainder: torch.Tensor
    peak: torch.Tensor


def fixed(x: torch.Tensor | dd.DD, axis: int, count: int | None = None) -> Fixed:
    """``x`` (float64, or a double-double) as limbs on one exponent per row along ``axis``.

    A double-double takes :data:`LIMBS` limbs; a float64 tensor ``count``, by
    default as many as its widest row needs to be exact (at most
    :data:`INPUT_LIMBS`).  Limbs are taken by truncation from the scaled
    value, the double-double being renormalized after each (its remainder
    stays below one unit of the next limb), so each limb's magnitude is at
    most ``2**LIMB_BITS``.
    """
    hi, lo = (x, torch.zeros_like(x)) if isinstance(x, torch.Tensor) else x
    peak, exponent = _row_exponent(hi, axis)
    if isinstance(x, torch.Tensor):
        needed = _needed_limbs(x, exponent)
        count = count or min(needed, INPUT_LIMBS)
        exact = needed <= count
    else:
        count, exact = LIMBS, False
    scale = -exponent
    hi, lo = ldexp(hi, scale), ldexp(lo, scale)
    limbs = torch.empty((count, *hi.shape), dtype=torch.float64, device=hi.device)
    for index in range(count):
        hi, lo = hi * 2.0**LIMB_BITS, lo * 2.0**LIMB_BITS  # exact: powers of two, far from the range's ends
        limb = torch.trunc(hi)
        limbs[index] = limb
        hi, lo = two_sum(hi - limb, lo)
    remainder = ldexp(torch.ones_like(peak), exponent - LIMB_BITS * count + 1)  # (1 + 2**-50) units, rounded up
    remainder = torch.where(peak > 0, remainder, 0.0) if not exact else torch.zeros_like(peak)
    return Fixed(limbs, exponent, remainder, ldexp(torch.ones_like(peak), exponent))


def exact_limbs(*tensors: torch.Tensor) -> int:
    """Limbs that hold every row of every tensor exactly (along its last axis), at most :data:`INPUT_LIMBS`:
    operands given this common count split a shared row into the same limbs."""
    return min(max(_needed_limbs(x, _row_exponent(x, -1)[1]) for x in tensors), INPUT_LIMBS)


def _row_exponent(x: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(peak, E)`` per row along ``axis``: the largest magnitude and the exponent with ``|x| < 2**(E - 1)``
    (one spare bit for a double-double's low part; 0 for a row of zeros)."""
    peak = x.abs().amax(dim=axis, keepdim=True)
    return peak, torch.where(peak > 0, torch.frexp(peak).exponent.to(torch.int64) + 1, 0)


def _needed_limbs(x: torch.Tensor, exponent: torch.Tensor) -> int:
    """Limbs that hold every row of ``x`` exactly below its exponent (at least 1)."""
    odd, lowest_bit = odd_form(x)
    nonzero = odd != 0
    if not bool(nonzero.any()):
        return 1
    lowest_bit = torch.where(nonzero, lowest_bit, exponent)
    return max(1, -(-int((exponent - lowest_bit).max()) // LIMB_BITS))


def matmul(a: Fixed, b: Fixed) -> tuple[dd.DD, torch.Tensor]:
    """``(a @ b as a double-double, slack)``: ``a`` (..., m, k) with exponents per row, ``b`` (..., k, n) per column,
    leading dimensions a batch of independent products.

    ``slack`` (..., m, n) bounds ``|a_true @ b_true - a_limbs @ b_limbs|`` from the two remainders (module
    docstring).
    """
    m, k = a.limbs.shape[-2:]
    n = b.limbs.shape[-1]
    chunk = min(k, CHUNK) or 1
    pad = -k % chunk
    a_limbs = torch.nn.functional.pad(a.limbs, (0, pad)).unflatten(-1, (-1, chunk)).movedim(-2, -3)
    b_limbs = torch.nn.functional.pad(b.limbs, (0, 0, 0, pad)).unflatten(-2, (-1, chunk))
    chunks = a_limbs.shape[-3]
    shape = (*torch.broadcast_shapes(a.limbs.shape[1:-2], b.limbs.shape[1:-2]), m, n)
    total = (a.limbs.new_zeros(shape), a.limbs.new_zeros(shape))
    for start in range(0, chunks, _CHUNKS_PER_GROUP):
        group = slice(start, start + _CHUNKS_PER_GROUP)
        shifts: dict[int, torch.Tensor] = {}
        for i, a_limb in enumerate(a_limbs[..., group, :, :]):
            for j, b_limb in enumerate(b_limbs[..., group, :, :]):
                exact = torch.matmul(a_limb, b_limb).to(torch.int64).sum(-3)  # every partial sum an integer < 2**53
                shifts[i + j] = shifts[i + j] + exact if i + j in shifts else exact
        for shift, integers in shifts.items():
            hi = integers.to(torch.float64)
            lo = (integers - hi.to(torch.int64)).to(torch.float64)
            unit = 2.0 ** (-LIMB_BITS * (shift + 2))  # exact: integers below 2**63 times at least 2**-560
            total = dd.add(total, (hi * unit, lo * unit))
    exponent = a.exponent + b.exponent  # (..., m, 1) + (..., 1, n)
    product = (ldexp(total[0], exponent), ldexp(total[1], exponent))
    slack = k * (a.peak * b.remainder + a.remainder * b.peak + a.remainder * b.remainder)
    return product, slack


def exact_dot(a: torch.Tensor, b: torch.Tensor) -> dd.DD:
    """``sum(a * b, -1)`` of float64 tensors as a double-double: exact products, pairwise double-double sum."""
    return dd.total(two_prod(a, b))

