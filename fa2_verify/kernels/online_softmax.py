"""The online-softmax recurrences of FlashAttention for one query row, generic
over the number type (``mpmath.mpf`` at any precision, or Python float64).

For one query row with scores ``s_1..s_n`` (already multiplied by the softmax
scale; ``-inf`` where a key is masked) and value rows ``v_1..v_n``, attention is

    out = Σ_j p_j v_j,    p_j = exp(s_j - lse),    lse = log Σ_j exp(s_j).

A tiled kernel visits the keys in blocks ``B_1..B_T`` and keeps a running max
``m``, a running sum ``ℓ`` and an accumulator ``O`` (Dao 2023, FlashAttention-2,
Algorithm 1, lines 8-13).  Per block ``B``:

    m'   = max(m, max_{j∈B} s_j)                               (line 9)
    P~_j = exp(s_j - m'),   α = exp(m - m')                      (line 9)
    ℓ'   = α ℓ + Σ_{j∈B} P~_j                                    (line 9)
    deferred (FA2):  O' = α O + Σ_{j∈B} P~_j v_j                 (line 10)
    eager (FA1):     O' = (α ℓ O + Σ_{j∈B} P~_j v_j) / ℓ'
    finish: out = O / ℓ (deferred, line 12), out = O (eager); lse = m + log ℓ (line 13)

After the blocks seen so far, ``ℓ = Σ_seen exp(s_j - m)`` and (deferred)
``O = Σ_seen exp(s_j - m) v_j`` (eager: ``O`` is that divided by ``ℓ``); each
step keeps the invariant because ``α = exp(m - m')`` moves the reference point
from ``m`` to ``m'``.  So all three (untiled, eager, deferred) are the same
number in exact arithmetic, for every partition of the keys, and
``lse = m + log ℓ`` exactly.  A reference point of ``-inf`` (no visible key yet)
is replaced by 0, so a fully masked block contributes exactly 0 and never
``exp(-inf - (-inf)) = NaN``; a row that sees no key has ``out = 0`` and
``lse = -inf``.

Rounding bound (:func:`error_bound`).  With unit roundoff ``u`` (2^-53 for
float64, 2^-prec for mpmath), exp and log accurate to 1 ulp (relative error
<= 2u), ``n`` keys, ``T`` blocks and score spread ``w = max s_j - min s_j`` over
the visible keys, and no underflow (in float64: every nonzero ``|v_j| >= 2^-800``
and ``w <= 100`` keep all intermediates normal), every term ``exp(s_j - m_t) v_j``
that reaches ``O`` carries

- one exp of a rounded difference ``fl(s_j - m_t)``: <= 2u + w u,
- at most ``T - 1`` rescales, each an exp of a rounded ``fl(m - m')``
  (the ``|m - m'|`` telescope to at most ``w``) and a multiplication: <= 3u each
  plus w u in all,
- its product with ``v_j`` (u) and at most ``n - 1`` additions (u each),

so ``O`` and ``ℓ`` each have relative error (with respect to their sums of
absolute terms) at most ``(n + 3T + 2w) u``.  Dividing by ``ℓ`` adds ``ℓ``'s
error and u, hence for the deferred form

    |out_computed - out| <= (2n + 6T + 4w + 1) u · Σ_j p_j |v_j|.

The eager form divides by ``ℓ'`` and multiplies by ``α ℓ / ℓ'`` once per block
(the computed ``ℓ``'s cancel between consecutive blocks, leaving only the
roundings of the multiply, divide and ratio: <= 4u per block), and ``lse``
gains ``log``'s 2u plus u |lse| from the final addition.  One bound covers all
forms and leaves room for the second-order terms when ``n u << 1``:

    |out_computed - out| <= (2n + 10T + 4w + 8) u · Σ_j p_j |v_j|
    |lse_computed - lse| <= (2n + 10T + 4w + 8) u · (1 + |lse|)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import mpmath

Number = Any  #: a float or an ``mpmath.mpf``
Values = Sequence[Sequence[Number]]  #: one row of value columns per key

NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class Arithmetic:
    """A number type: exact conversion of float inputs, exp, log, unit roundoff.

    ``unit_roundoff`` is a function because mpmath's depends on the working
    precision in effect when it is called (``mpmath.workprec``).
    """

    name: str
    convert: Callable[[float], Number]
    exp: Callable[[Number], Number]
    log: Callable[[Number], Number]
    unit_roundoff: Callable[[], float]


FLOAT64 = Arithmetic("float64", float, math.exp, math.log, lambda: 2.0**-53)
MPMATH = Arithmetic("mpmath", mpmath.mpf, mpmath.exp, mpmath.log, lambda: 2.0 ** -mpmath.mp.prec)


@dataclasses.dataclass(frozen=True)
class RowState:
    """Running max ``m``, running sum ``ℓ`` and accumulator ``O`` of one row."""

    m: Number
    l: Number
    o: tuple[Number, ...]


@dataclasses.dataclass(frozen=True)
class BlockUpdate:
    """What one block contributes (Algorithm 1, line 9): the new running max,
    the rescale factor ``α = exp(m - m')`` and ``P~_j = exp(s_j - m')``."""

    m: Number
    alpha: Number
    p: tuple[Number, ...]


def initial_state(columns: int, arithmetic: Arithmetic) -> RowState:
    """``m = -inf``, ``ℓ = 0``, ``O = 0`` (Algorithm 1, line 5)."""
    zero = arithmetic.convert(0.0)
    return RowState(m=arithmetic.convert(NEG_INF), l=zero, o=(zero,) * columns)


def reference_point(m: Number, arithmetic: Arithmetic) -> Number:
    """``m``, or 0 while no key has been visible (keeps ``exp(-inf - m)`` at 0)."""
    return arithmetic.convert(0.0) if m == NEG_INF else m


def block_update(state: RowState, scores: Sequence[Number], arithmetic: Arithmetic) -> BlockUpdate:
    """Line 9: ``m' = max(m, max s)``, ``α = exp(m - m')``, ``P~ = exp(s - m')``."""
    m_new = max([state.m, *scores])
    base = reference_point(m_new, arithmetic)
    return BlockUpdate(
        m=m_new,
        alpha=arithmetic.exp(state.m - base),
        p=tuple(arithmetic.exp(s - base) for s in scores),
    )


def _weighted(p: Sequence[Number], values: Values, column: int, arithmetic: Arithmetic) -> Number:
    total = arithmetic.convert(0.0)
    for weight, row in zip(p, values):
        total = total + weight * row[column]
    return total


def _total(p: Sequence[Number], arithmetic: Arithmetic) -> Number:
    total = arithmetic.convert(0.0)
    for weight in p:
        total = total + weight
    return total


def deferred_step(state: RowState, scores: Sequence[Number], values: Values, arithmetic: Arithmetic) -> RowState:
    """FA2 (lines 9-10): ``ℓ' = α ℓ + Σ P~``, ``O' = α O + Σ P~ v`` (unnormalised)."""
    update = block_update(state, scores, arithmetic)
    return RowState(
        m=update.m,
        l=update.alpha * state.l + _total(update.p, arithmetic),
        o=tuple(
            update.alpha * o + _weighted(update.p, values, c, arithmetic) for c, o in enumerate(state.o)
        ),
    )


def eager_step(state: RowState, scores: Sequence[Number], values: Values, arithmetic: Arithmetic) -> RowState:
    """FA1: ``O' = (α ℓ O + Σ P~ v) / ℓ'``, normalised after every block."""
    update = block_update(state, scores, arithmetic)
    l_new = update.alpha * state.l + _total(update.p, arithmetic)
    if l_new == 0:
        return RowState(m=update.m, l=l_new, o=state.o)
    carried = update.alpha * state.l
    return RowState(
        m=update.m,
        l=l_new,
        o=tuple(
            (carried * o + _weighted(update.p, values, c, arithmetic)) / l_new for c, o in enumerate(state.o)
        ),
    )


def log_sum_exp(state: RowState, arithmetic: Arithmetic) -> Number:
    """Line 13: ``lse = m + log ℓ`` (``-inf`` for a row that saw no key)."""
    if state.l == 0:
        return arithmetic.convert(NEG_INF)
    return state.m + arithmetic.log(state.l)


def deferred_finish(state: RowState, arithmetic: Arithmetic) -> tuple[tuple[Number, ...], Number]:
    """Line 12: ``out = O / ℓ`` (0 for a row that saw no key), and the lse."""
    if state.l == 0:
        return state.o, log_sum_exp(state, arithmetic)
    return tuple(o / state.l for o in state.o), log_sum_exp(state, arithmetic)


def eager_finish(state: RowState, arithmetic: Arithmetic) -> tuple[tuple[Number, ...], Number]:
    """``O`` is already normalised; only the lse is left."""
    return state.o, log_sum_exp(state, arithmetic)


Step = Callable[[RowState, Sequence[Number], Values, Arithmetic], RowState]
Finish = Callable[[RowState, Arithmetic], tuple[tuple[Number, ...], Number]]


@dataclasses.dataclass(frozen=True)
class Recurrence:
    """A per-block step and the finish that turns the last state into ``(out, lse)``."""

    name: str
    step: Step
    finish: Finish


DEFERRED = Recurrence("deferred", deferred_step, deferred_finish)
EAGER = Recurrence("eager", eager_step, eager_finish)


def final_state(
    recurrence: Recurrence,
    scores: Sequence[float],
    values: Sequence[Sequence[float]],
    blocks: Sequence[int],
    arithmetic: Arithmetic,
) -> RowState:
    """Run ``recurrence`` over consecutive key blocks of the given sizes."""
    if sum(blocks) != len(scores) or any(size <= 0 for size in blocks):
        raise ValueError(f"blocks={list(blocks)} is not a partition of {len(scores)} keys into non-empty blocks")
    s = [arithmetic.convert(x) for x in scores]
    v = [[arithmetic.convert(x) for x in row] for row in values]
    state = initial_state(len(values[0]) if values else 0, arithmetic)
    start = 0
    for size in blocks:
        state = recurrence.step(state, s[start : start + size], v[start : start + size], arithmetic)
        start += size
    return state


def tiled(
    recurrence: Recurrence,
    scores: Sequence[float],
    values: Sequence[Sequence[float]],
    blocks: Sequence[int],
    arithmetic: Arithmetic,
) -> tuple[tuple[Number, ...], Number]:
    """``(out, lse)`` of one row computed block by block."""
    return recurrence.finish(final_state(recurrence, scores, values, blocks, arithmetic), arithmetic)


def untiled(
    scores: Sequence[float], values: Sequence[Sequence[float]], arithmetic: Arithmetic
) -> tuple[tuple[Number, ...], Number]:
    """The formula itself: ``m = max s``, ``ℓ = Σ exp(s - m)``, ``out = Σ exp(s - m) v / ℓ``."""
    return tiled(DEFERRED, scores, values, [len(scores)], arithmetic)


def error_bound(*, keys: int, blocks: int, spread: float, unit_roundoff: float) -> float:
    """``(2n + 10T + 4w + 8) u``: the relative bound derived in the module docstring."""
    return (2 * keys + 10 * blocks + 4 * spread + 8) * unit_roundoff
