"""Error-free transformations in float64 and an Ozaki-split matrix product, in torch.

A pair ``(hi, lo)`` of float64 tensors stands for the unevaluated sum
``hi + lo`` (double-double).  The transformations below are exact for finite
inputs without overflow, on the CPU and on CUDA alike: each torch operation
is its own kernel and rounds once (no operation is contracted into a fused
multiply-add across them), and float64 products never take the reduced
precision paths that ``torch.backends.cuda.matmul.allow_tf32`` and
``allow_fp16_reduced_precision_reduction`` govern (those apply to float32 and
float16 only):

* :func:`two_sum` (Knuth): ``s + e == a + b`` with ``s = fl(a + b)``.
* :func:`two_prod` (Dekker, Veltkamp split): ``p + e == a * b`` with ``p = fl(a * b)``.
* :func:`dd_matmul` (after Ozaki, Ogita, Oishi and Rump 2012, "Error-free
  transformations of matrix multiplication"): the leading slices of the rows
  of ``a`` and the columns of ``b`` are integers of at most ``beta`` bits times
  a power of two common to the row (column).  With
  ``beta_a + beta_b + ceil(log2 k) <= 53`` their product is computed by
  float64 BLAS (cuBLAS on CUDA) *exactly*, whatever the summation order and
  whether or not it uses fused multiply-adds; the remainders, at least
  ``2**beta`` times smaller, are multiplied in plain float64.
"""

from __future__ import annotations

import dataclasses
import math

import torch

#: Veltkamp's splitter for float64: 2**27 + 1.
SPLITTER = 134217729.0

#: Bits of the leading slice of ``a`` when ``b`` is exact in one slice: what is
#: left of the 53-bit budget after ``log2 k`` and float16's 27 bits (|v| < 8,
#: down to its smallest subnormal) for k = 2048.
MIN_SLICE_BITS = 15

#: Row exponents for which ``sigma`` of :func:`leading_slice` is a normal float64.
_MIN_EXPONENT, _MAX_EXPONENT = -900, 900


def two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, e)`` with ``s = fl(a + b)`` and ``s + e = a + b`` exactly."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def two_prod(a: torch.Tensor, b) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p, e)`` with ``p = fl(a * b)`` and ``p + e = a * b`` exactly (|a|, |b| < 2**995); ``b`` may be a float."""
    p = a * b
    a_hi, a_lo = _veltkamp(a)
    b_hi, b_lo = _veltkamp(b)
    return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def odd_form(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(odd, power)``, int64, with ``x = odd * 2**power`` exactly and ``odd`` odd, for finite float64 ``x``
    (``(0, 0)`` where ``x`` is 0): the value's integer significand without its trailing zero bits."""
    mantissa, exponent = torch.frexp(x)
    integers = (mantissa * 2.0**53).to(torch.int64)
    nonzero = integers != 0
    trailing = torch.where(nonzero, torch.frexp((integers & -integers).to(torch.float64)).exponent.to(torch.int64) - 1, 0)
    return integers >> trailing, torch.where(nonzero, exponent.to(torch.int64) - 53 + trailing, 0)


def dd_matmul(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a @ b`` as an unevaluated pair ``hi + lo`` for float64 ``a`` (..., m, k), ``b`` (..., k, n), one device.

    Leading dimensions are a batch of independent products (broadcast as in ``torch.matmul``); each
    matrix of the batch takes the path below that it would take alone.

    With ``budget = 53 - ceil(log2 k)`` bits for the exact product of two
    slices: when every column of ``b`` is exactly a ``budget - MIN_SLICE_BITS``
    bit slice (a float16 or bfloat16 input usually is), ``a`` is split once,
    ``a = a0 + ra`` (:func:`leading_slice`, ``MIN_SLICE_BITS`` bits), and

        hi = a0 @ b,   lo = ra @ b;

    otherwise both are split with ``budget / 2`` bits each and

        hi = a0 @ b0,  lo = a0 @ rb + ra @ b.

    ``hi`` is exact (every partial sum is an integer below 2**53 units);
    ``|ra| <= min(|a|, 2**(e_i - beta))`` entrywise (likewise ``rb``) and
    ``|a0| <= 2 |a|``, so with ``g = k 2**-53`` and ``beta`` the bits of ``a0``:

        |hi + lo - a @ b| <= 3 g min(2**-beta k 2**(e_i + f_j), sum_c |a_ic b_cj|) + 2**-53 |lo|,

    double-double accuracy relative to the leading magnitudes and never worse
    than float64 relative to the magnitude of the terms of each entry.
    """
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if m == 0 or n == 0 or k == 0:
        shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), m, n)
        return a.new_zeros(shape), a.new_zeros(shape)
    return Columns.of(b).matmul(a, slice(None))


@dataclasses.dataclass(frozen=True)
class Columns:
    """``b`` (..., k, n), k >= 1, made ready once for :func:`dd_matmul` of many ``a`` with slices of its columns
    (the golden's ``Q K^T`` and ``dO V^T`` of every row block, over the keys of each): which columns are one exact
    slice (``exact``, (..., 1, n)) and, where some is not, the two-slice path's split ``b = b0 + rb``.  Both are
    properties of each column alone, so a slice of them is what :func:`dd_matmul` finds for that slice of ``b``
    (but for rows beyond :func:`leading_slice`'s exponent range, which it splits per matrix)."""

    b: torch.Tensor
    budget: int
    exact: torch.Tensor
    b0: torch.Tensor | None
    rb: torch.Tensor | None

    @classmethod
    def of(cls, b: torch.Tensor) -> "Columns":
        budget = 53 - math.ceil(math.log2(b.shape[-2]))
        exact = _exact_columns(b, budget)
        if bool(exact.all()):
            return cls(b, budget, exact, None, None)
        b0 = leading_slice(b, -2, budget // 2)
        return cls(b, budget, exact, b0, b - b0)

    def matmul(self, a: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`dd_matmul` of ``a`` (..., m, k) with ``b[..., columns]``."""
        b = self.b[..., columns]
        exact = self.exact[..., columns].all(-1, keepdim=True)
        if bool(exact.all()):
            return _one_slice(a, b)
        assert self.b0 is not None and self.rb is not None  # made by Columns.of wherever a column is not exact
        two = (self.b0[..., columns], self.rb[..., columns])
        if not bool(exact.any()):
            return _two_slices(a, b, *two, self.budget)
        (hi1, lo1), (hi2, lo2) = _one_slice(a, b), _two_slices(a, b, *two, self.budget)
        return torch.where(exact, hi1, hi2), torch.where(exact, lo1, lo2)

    @property
    def bits(self) -> int | None:
        """The bits of ``a``'s leading slice in :func:`dd_matmul` with the whole ``b``, when every matrix of ``b``
        takes the same path: ``MIN_SLICE_BITS`` (one slice), half the budget (two slices); None when they differ."""
        exact = self.exact.all(-1)
        if bool(exact.all()):
            return MIN_SLICE_BITS
        return None if bool(exact.any()) else self.budget // 2

    def sigma(self, peak: torch.Tensor) -> torch.Tensor | None:
        """:func:`leading_slice`'s ``sigma`` that splits rows of ``a`` whose largest magnitudes are ``peak`` into
        :attr:`bits` bits; None when the matrices of ``b`` take different paths, or a row is out of the range
        where ``sigma`` is a normal float64 (:func:`leading_slice` then scales instead)."""
        bits = self.bits
        if bits is None:
            return None
        exponent = torch.frexp(peak).exponent.to(torch.int64)
        if not bool(((exponent > _MIN_EXPONENT) & (exponent < _MAX_EXPONENT)).all()):
            return None
        return torch.ldexp(torch.full_like(peak, 0.75), exponent - bits + 53)

    def split_matmul(self, leading: torch.Tensor, rest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`dd_matmul`'s pair for ``a = leading + rest`` with the whole ``b``, ``a`` already split as it
        splits it (by :meth:`sigma`): the same products in the same order."""
        if self.b0 is None or self.rb is None:
            return matmul(leading, self.b), matmul(rest, self.b)
        lo = matmul(leading, self.rb)
        hi = matmul(leading, self.b0)
        lo += matmul(rest, self.b)
        return hi, lo


def _exact_columns(b: torch.Tensor, budget: int) -> torch.Tensor:
    """Whether each column of ``b`` (..., k, n) is exactly one ``budget - MIN_SLICE_BITS`` bit slice, (..., 1, n)."""
    return (leading_slice(b, -2, budget - MIN_SLICE_BITS) == b).all(-2, keepdim=True)


def _per_matrix(condition: torch.Tensor) -> torch.Tensor:
    """``condition`` (..., r, c) holds for the whole matrix, as (..., 1, 1)."""
    return condition.flatten(-2).all(-1)[..., None, None]


def _one_slice(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dd_matmul` when ``b`` is one exact slice: ``hi = a0 @ b``, ``lo = ra @ b``."""
    a0 = leading_slice(a, -1, MIN_SLICE_BITS)
    hi = matmul(a0, b)
    return hi, matmul(torch.sub(a, a0, out=a0), b)


def _two_slices(a: torch.Tensor, b: torch.Tensor, b0: torch.Tensor, rb: torch.Tensor,
                budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dd_matmul` splitting both: ``hi = a0 @ b0``, ``lo = a0 @ rb + ra @ b`` (``b`` already split)."""
    a0 = leading_slice(a, -1, budget // 2)
    lo = matmul(a0, rb)
    hi = matmul(a0, b0)
    lo += matmul(torch.sub(a, a0, out=a0), b)
    return hi, lo


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` in float64: cuBLAS on CUDA; on the CPU numpy's BLAS on the same memory.

    numpy's OpenBLAS ran float64 products about 1.4 times faster than torch's
    MKL on the project's AMD CI machine (docs/benchmarks.md, "Golden"); both
    are exact on the leading slices, which is all :func:`dd_matmul` relies on.
    """
    if a.device.type != "cpu":
        return a @ b
    return torch.from_numpy(a.numpy() @ b.numpy())


def _veltkamp(a):
    c = SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def leading_slice(x: torch.Tensor, axis: int, beta: int) -> torch.Tensor:
    """``x`` rounded to a multiple of ``2**(e - beta)`` along ``axis``, ``2**e`` bounding each row's magnitudes.

    Rump's ExtractScalar: ``fl(x + sigma) - sigma`` with
    ``sigma = 0.75 * 2**(e - beta + 53)`` is that rounding, exactly; entries
    are integers of magnitude at most ``2**beta`` in the unit ``2**(e - beta)``,
    and ``x - slice`` is exact.  Rows too far out of float64's exponent range
    for ``sigma`` scale by powers of two and ``trunc`` (integers below ``2**beta``); the choice is made per
    matrix of the leading (batch) dimensions, so a batch slices each matrix as it would be sliced alone.
    """
    peak = _peak(x, axis)
    exponent = torch.frexp(peak).exponent.to(torch.int64)
    in_range = _per_matrix((exponent > _MIN_EXPONENT) & (exponent < _MAX_EXPONENT))
    if bool(in_range.all()):
        sigma = torch.ldexp(torch.full_like(peak, 0.75), exponent - beta + 53)
        piece = x + sigma
        piece -= sigma
        return piece
    shift = beta - exponent
    truncated = ldexp(torch.trunc(ldexp(x, shift)), -shift)
    if not bool(in_range.any()):
        return truncated
    sigma = torch.ldexp(torch.full_like(peak, 0.75), (exponent - beta + 53).clamp(_MIN_EXPONENT, _MAX_EXPONENT))
    return torch.where(in_range, (x + sigma) - sigma, truncated)


def _peak(x: torch.Tensor, axis: int) -> torch.Tensor:
    """``max |x|`` along ``axis`` (kept), exactly and without an ``|x|`` temporary: one fused pass on CUDA;
    ``amax`` and ``-amin`` on the CPU, where torch's vectorised min and max run several times faster than its norm."""
    if x.device.type != "cpu":
        return torch.linalg.vector_norm(x, math.inf, dim=axis, keepdim=True)
    return torch.maximum(x.amax(dim=axis, keepdim=True), x.amin(dim=axis, keepdim=True).neg_())


def ldexp(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """``x * 2**exponent`` in two exact steps, so that neither power of two overflows (|exponent| < 2046)."""
    half = torch.div(exponent, 2, rounding_mode="floor")
    return torch.ldexp(torch.ldexp(x, half), exponent - half)
