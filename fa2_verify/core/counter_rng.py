"""Random draws that are the same bits on every device: Philox4x32-10, a counter-based generator.

Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3"
(SC 2011), section 3.2: value ``i`` of a draw is a keyed bijection of a
counter, ``philox(counter=(i_lo, i_hi, draw, 0), key=(seed_lo, seed_hi))``,
so a draw of any size is generated on the device that will use it, in
parallel, and independently of every other draw.  A :class:`CounterRNG`
numbers its draws in the order they are made, as a ``torch.Generator``
advances its state.

Every step is exact integer arithmetic on int64 tensors (the 32 x 32-bit
products are split into 16-bit halves, so no product reaches 2^63) or a
single correctly rounded IEEE float64 operation (``+``, ``-``, ``*``, ``/``)
per torch call, so that nothing is contracted into a fused multiply-add:
CPUs and CUDA devices evaluate those alike.  ``log``, ``cos``, ``sin`` and
``sqrt`` of the normal draws are therefore written here (:func:`_log`,
:func:`_cos_sin`, :func:`_sqrt`), not taken from the platform, whose last bit
differs between devices (torch's ``sqrt`` does, in one float64 of 130 on an
H100 against the CPU: lab/probes/probe_device_values.py ``--steps``).
tests/test_counter_rng.py holds Random123's known answers and, on a GPU, the
device-equality check.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

_MASK32 = 0xFFFFFFFF
#: Philox4x32's multipliers and key increments (Random123, philox.h).
_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_KEY_STEPS = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10

#: Counters per chunk of a draw, on the CPU per intra-op thread (each thread's int64 temporaries stay in its
#: cache, and every thread has work: torch splits an elementwise operation into grains of 2^15), on CUDA
#: per launch (work enough).  A value depends on its counter only, never on the chunking.
_CPU_THREAD_COUNTERS, _CUDA_CHUNK_COUNTERS = 1 << 16, 1 << 22

#: 2^-53: a 53-bit integer times this is a float64 in [0, 1), exactly.
_UNIT = 2.0**-53

#: Terms of the series of ``log(m) = 2 atanh(s)``, ``s = (m - 1) / (m + 1)``, ``|s| <= 3 - 2 sqrt(2)``:
#: ``s^2 <= 0.0295``, so the 11th term is below 2^-56 of the first.
_ATANH_COEFFICIENTS = tuple(1.0 / (2 * k + 1) for k in range(11))
#: Taylor terms of ``sin`` and ``cos`` on ``[0, pi/2)``: the next terms are below 2^-60.
_SIN_COEFFICIENTS = tuple((-1.0) ** k / math.factorial(2 * k + 1) for k in range(12))
_COS_COEFFICIENTS = tuple((-1.0) ** k / math.factorial(2 * k) for k in range(12))


def _mulhilo(word: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The high and low 32-bit halves of ``word * multiplier`` (both below 2^32), without an int64 overflow."""
    high = word * (multiplier >> 16)
    low = word * (multiplier & 0xFFFF)
    middle = low + ((high & 0xFFFF) << 16)
    return (high >> 16) + (middle >> 32), middle & _MASK32


def philox(counter: torch.Tensor, key: tuple[int, int], rounds: int = ROUNDS) -> torch.Tensor:
    """Philox4x32-``rounds`` of ``counter`` (int64, ``(n, 4)``, each word below 2^32) under ``key``: ``(n, 4)`` words."""
    c0, c1, c2, c3 = counter.unbind(-1)
    k0, k1 = key
    for step in range(rounds):
        if step:
            k0, k1 = (k0 + _KEY_STEPS[0]) & _MASK32, (k1 + _KEY_STEPS[1]) & _MASK32
        hi0, lo0 = _mulhilo(c0, _MULTIPLIERS[0])
        hi1, lo1 = _mulhilo(c2, _MULTIPLIERS[1])
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack((c0, c1, c2, c3), dim=-1)


def _horner(coefficients: tuple[float, ...], variable: torch.Tensor) -> torch.Tensor:
    """Horner's scheme for ``sum_k coefficients[k] variable^k``, one rounded operation per call."""
    total = torch.full_like(variable, coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        total = total * variable
        total = total + coefficient
    return total


def _log(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive normal float64 ``x``, within a few ulps, the same bits on every device.

    ``x = m 2^e`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` (read from the bits),
    ``log x = e ln 2 + 2 atanh((m - 1) / (m + 1))`` by its series.
    """
    bits = x.view(torch.int64)
    exponent = ((bits >> 52) & 0x7FF) - 1023
    mantissa = ((bits & ((1 << 52) - 1)) | (1023 << 52)).view(torch.float64)
    high = mantissa > math.sqrt(2.0)
    mantissa = torch.where(high, mantissa * 0.5, mantissa)
    exponent = exponent + high.to(torch.int64)
    s = (mantissa - 1.0) / (mantissa + 1.0)
    series = _horner(_ATANH_COEFFICIENTS, s * s)
    return exponent.to(torch.float64) * math.log(2.0) + 2.0 * s * series


def _cos_sin(turns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of ``2 pi turns`` for float64 ``turns`` in ``[0, 1)`` with 53-bit resolution.

    The quadrant ``q`` and the fraction ``f`` of ``4 turns`` are exact; the
    Taylor series take ``phi = f pi/2`` in ``[0, pi/2)``.
    """
    quarters = turns * 4.0
    quadrant = quarters.floor()
    phi = (quarters - quadrant) * (math.pi / 2)
    square = phi * phi
    sin = phi * _horner(_SIN_COEFFICIENTS, square)
    cos = _horner(_COS_COEFFICIENTS, square)
    q = quadrant.to(torch.int64)
    cosine = torch.where(q == 0, cos, torch.where(q == 1, -sin, torch.where(q == 2, -cos, sin)))
    sine = torch.where(q == 0, sin, torch.where(q == 1, cos, torch.where(q == 2, -sin, -cos)))
    return cosine, sine


#: Newton steps of :func:`_sqrt`: from a first guess within 1/16 the relative error squares each step.
_SQRT_STEPS = 6


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """Square root of non-negative float64 ``x`` within an ulp, the same bits on every device: Newton's
    ``y <- (y + x / y) / 2`` from the guess that halves ``x``'s exponent in its bits."""
    positive = x > 0
    safe = torch.where(positive, x, 1.0)
    y = (((safe.view(torch.int64) - (1023 << 52)) >> 1) + (1023 << 52)).view(torch.float64)
    for _ in range(_SQRT_STEPS):
        y = (y + safe / y) * 0.5
    return torch.where(positive, y, 0.0)


class CounterRNG:
    """Draws of a seed (below 2^64), numbered in order, each on the device asked for.

    Every draw of ``n`` values takes ``ceil(n / 2)`` counters; values ``2j`` and
    ``2j + 1`` come from the words of counter ``j``.  ``device`` is where draws
    go unless a call names another; the values do not depend on it.
    """

    def __init__(self, seed: int, device: str | torch.device = "cpu") -> None:
        self.key = (seed & _MASK32, (seed >> 32) & _MASK32)
        self.device = torch.device(device)
        self.draws = 0

    def _draw(self, shape: tuple[int, ...], device: torch.device | str | None, dtype: torch.dtype,
              pair: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
              ) -> torch.Tensor:
        """The next draw: ``pair`` turns each counter's four words into its two values, a chunk at a time."""
        where = self.device if device is None else torch.device(device)
        draw, self.draws = self.draws, self.draws + 1
        count = math.prod(shape)
        counters = -(-count // 2)
        values = torch.empty((counters, 2), dtype=dtype, device=where)
        chunk = _CUDA_CHUNK_COUNTERS if where.type == "cuda" else _CPU_THREAD_COUNTERS * torch.get_num_threads()
        for start in range(0, counters, chunk):
            index = torch.arange(start, min(counters, start + chunk), dtype=torch.int64, device=where)
            counter = torch.stack((index & _MASK32, index >> 32, torch.full_like(index, draw), torch.zeros_like(index)), -1)
            first, second = pair(*philox(counter, self.key).unbind(-1))
            values[start : start + len(index), 0] = first
            values[start : start + len(index), 1] = second
        return values.reshape(-1)[:count].reshape(shape)

    @staticmethod
    def _fraction(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
        """53 bits of two words as a float64 in ``[0, 1)``: an integer below 2^53 times 2^-53 (exact)."""
        return ((high << 21) | (low >> 11)).to(torch.float64) * _UNIT

    def uniform(self, shape: tuple[int, ...], low: float = 0.0, high: float = 1.0,
                device: torch.device | str | None = None) -> torch.Tensor:
        """float64 ``low + (high - low) u`` with ``u`` uniform on the multiples of 2^-53 in ``[0, 1)``."""
        unit = self._draw(shape, device, torch.float64,
                          lambda w0, w1, w2, w3: (self._fraction(w0, w1), self._fraction(w2, w3)))
        return unit * (high - low) + low

    def normal(self, shape: tuple[int, ...], device: torch.device | str | None = None) -> torch.Tensor:
        """Standard normal float64 by the Box-Muller transform: ``sqrt(-2 log u1) (cos, sin)(2 pi u2)``,
        ``u1`` in ``(0, 1]``."""

        def box_muller(w0, w1, w2, w3):
            radius = _sqrt(_log(self._fraction(w0, w1) + _UNIT) * -2.0)
            cosine, sine = _cos_sin(self._fraction(w2, w3))
            return radius * cosine, radius * sine

        return self._draw(shape, device, torch.float64, box_muller)

    def integers(self, high: int, shape: tuple[int, ...], device: torch.device | str | None = None) -> torch.Tensor:
        """int64 uniform on ``[0, high)``, ``high <= 2^31``: ``floor(w high / 2^32)`` of a 32-bit word ``w``."""
        if not 1 <= high <= 1 << 31:
            raise ValueError(f"high={high} is outside [1, 2^31]")
        return self._draw(shape, device, torch.int64, lambda w0, w1, w2, w3: ((w0 * high) >> 32, (w2 * high) >> 32))

    def bernoulli(self, probability: float, shape: tuple[int, ...],
                  device: torch.device | str | None = None) -> torch.Tensor:
        """bool, true with ``probability`` (a uniform draw below it)."""
        return self.uniform(shape, device=device) < probability

    def permutation(self, count: int, device: torch.device | str | None = None) -> torch.Tensor:
        """A uniformly random permutation of ``range(count)`` (int64): the order of ``count`` uniform draws,
        sorted on the host (ties, two equal 53-bit draws, broken by index), so alike everywhere."""
        order = torch.sort(self.uniform((count,), device="cpu"), stable=True).indices
        return order.to(self.device if device is None else device)
