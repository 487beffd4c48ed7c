"""Eager rescaling, deferred rescaling and the untiled softmax are the same
number (Dao 2023, Algorithm 1, lines 8-13; derivation and float64 bound in
:mod:`kernels.online_softmax`).

For random rows and random block partitions of the keys:

- in mpmath each form is within the rounding bound at the working precision of
  the exact value (computed at four times that precision), so they agree to the
  working precision;
- in float64 each form is within the stated bound ``(2n + 10T + 4w + 8) u``;
- ``lse = m + log ℓ`` equals ``log Σ exp(s_j)``;
- a recurrence that skips the rescale ``α = exp(m - m')`` fails these checks.
"""

from __future__ import annotations

import dataclasses
import math

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fa2_verify.kernels import online_softmax as osm

WORKING_PRECISION = 113
EXACT_PRECISION = 4 * WORKING_PRECISION
SCORE_RANGE = 30.0
VALUE_RANGE = 100.0
MIN_VALUE = 2.0**-800  # with SCORE_RANGE, keeps every float64 intermediate normal (no underflow)
COLUMNS = 2


@dataclasses.dataclass(frozen=True)
class Row:
    """One query row: scores (``-inf`` = masked), value rows, block sizes."""

    scores: list[float]
    values: list[list[float]]
    blocks: list[int]

    @property
    def spread(self) -> float:
        visible = [s for s in self.scores if s != osm.NEG_INF]
        return max(visible) - min(visible) if visible else 0.0

    def bound(self, unit_roundoff: float) -> float:
        return osm.error_bound(
            keys=len(self.scores), blocks=len(self.blocks), spread=self.spread, unit_roundoff=unit_roundoff
        )


def _partition(n: int, cuts: set[int]) -> list[int]:
    edges = [0, *sorted(cuts), n]
    return [end - start for start, end in zip(edges, edges[1:])]


@st.composite
def rows(draw, *, max_keys: int = 24, min_blocks: int = 1, masked: bool = True) -> Row:
    """A row of up to max_keys keys, some masked, partitioned into at least min_blocks blocks.

    Nonzero values have magnitude >= MIN_VALUE: the bound assumes no underflow.
    """
    n = draw(st.integers(min_blocks, max_keys))
    finite = st.floats(-SCORE_RANGE, SCORE_RANGE, allow_nan=False, allow_infinity=False)
    score = st.one_of(finite, st.just(osm.NEG_INF)) if masked else finite
    magnitude = st.floats(MIN_VALUE, VALUE_RANGE)
    value = st.one_of(st.just(0.0), magnitude, magnitude.map(lambda x: -x))
    scores = draw(st.lists(score, min_size=n, max_size=n))
    values = draw(st.lists(st.lists(value, min_size=COLUMNS, max_size=COLUMNS), min_size=n, max_size=n))
    cuts = draw(st.sets(st.integers(1, n - 1), min_size=min_blocks - 1)) if n > 1 else set()
    return Row(scores=scores, values=values, blocks=_partition(n, cuts))


def _exact(row: Row):
    """``(out, lse, Σ_j p_j |v_j|)`` at :data:`EXACT_PRECISION` bits."""
    with mpmath.workprec(EXACT_PRECISION):
        out, lse = osm.untiled(row.scores, row.values, osm.MPMATH)
        if lse == osm.NEG_INF:
            weights = (mpmath.mpf(0),) * COLUMNS
        else:
            p = [mpmath.exp(mpmath.mpf(s) - lse) for s in row.scores]
            weights = tuple(mpmath.fsum(pj * abs(mpmath.mpf(v[c])) for pj, v in zip(p, row.values)) for c in range(COLUMNS))
        return out, lse, weights


def assert_within_bound(actual, row: Row, unit_roundoff: float) -> None:
    """``actual = (out, lse)`` is within the module's rounding bound of the exact row."""
    out, lse = actual
    expected_out, expected_lse, weights = _exact(row)
    bound = row.bound(unit_roundoff)
    with mpmath.workprec(EXACT_PRECISION):
        for column, (a, e, w) in enumerate(zip(out, expected_out, weights)):
            error = abs(mpmath.mpf(a) - e)
            assert error <= bound * w, (
                f"out[{column}]: |actual - expected| = {float(error):.3e} > {bound:.3e} * {float(w):.3e}"
            )
        if expected_lse == osm.NEG_INF:
            assert lse == osm.NEG_INF, f"lse = {lse} for a row that sees no key, expected -inf"
        else:
            error = abs(mpmath.mpf(lse) - expected_lse)
            allowed = bound * (1 + abs(expected_lse))
            assert error <= allowed, f"lse: |actual - expected| = {float(error):.3e} > {float(allowed):.3e}"


FORMS = {
    "deferred": lambda row, arithmetic: osm.tiled(osm.DEFERRED, row.scores, row.values, row.blocks, arithmetic),
    "eager": lambda row, arithmetic: osm.tiled(osm.EAGER, row.scores, row.values, row.blocks, arithmetic),
    "untiled": lambda row, arithmetic: osm.untiled(row.scores, row.values, arithmetic),
}


@pytest.mark.parametrize("form", sorted(FORMS))
@settings(max_examples=100, deadline=None)
@given(row=rows())
def test_tiled_softmax_exact_in_mpmath(form: str, row: Row) -> None:
    """|form_mpmath(prec) - exact| <= (2n + 10T + 4w + 8) 2^-prec Σ p|v|: the forms agree to the working precision."""
    with mpmath.workprec(WORKING_PRECISION):
        actual = FORMS[form](row, osm.MPMATH)
        unit_roundoff = osm.MPMATH.unit_roundoff()
    assert_within_bound(actual, row, unit_roundoff)


@pytest.mark.parametrize("form", sorted(FORMS))
@settings(max_examples=200, deadline=None)
@given(row=rows())
def test_tiled_softmax_within_float64_bound(form: str, row: Row) -> None:
    """|form_float64 - exact| <= (2n + 10T + 4w + 8) 2^-53 Σ p|v|."""
    assert_within_bound(FORMS[form](row, osm.FLOAT64), row, osm.FLOAT64.unit_roundoff())


@pytest.mark.parametrize("recurrence", [osm.DEFERRED, osm.EAGER], ids=lambda r: r.name)
@settings(max_examples=100, deadline=None)
@given(row=rows())
def test_lse_equals_max_plus_log_sum(recurrence: osm.Recurrence, row: Row) -> None:
    """m_T + log ℓ_T = log Σ_j exp(s_j) (Algorithm 1, line 13), to the working precision."""
    with mpmath.workprec(WORKING_PRECISION):
        state = osm.final_state(recurrence, row.scores, row.values, row.blocks, osm.MPMATH)
        lse = osm.log_sum_exp(state, osm.MPMATH)
        bound = row.bound(osm.MPMATH.unit_roundoff())
    with mpmath.workprec(EXACT_PRECISION):
        total = mpmath.fsum(mpmath.exp(mpmath.mpf(s)) for s in row.scores)
        expected = mpmath.log(total) if total > 0 else mpmath.mpf(osm.NEG_INF)
        if expected == osm.NEG_INF:
            assert lse == osm.NEG_INF
        else:
            assert abs(lse - expected) <= bound * (1 + abs(expected))


def _skip_rescale_step(state, scores, values, arithmetic):
    """The deferred step without the factor α = exp(m - m') on ℓ and O."""
    update = osm.block_update(state, scores, arithmetic)
    return osm.RowState(
        m=update.m,
        l=state.l + sum(update.p, arithmetic.convert(0.0)),
        o=tuple(o + sum((p * v[c] for p, v in zip(update.p, values)), arithmetic.convert(0.0)) for c, o in enumerate(state.o)),
    )


SKIP_RESCALE = osm.Recurrence("skip-rescale", _skip_rescale_step, osm.deferred_finish)


@st.composite
def rows_with_rising_max(draw) -> Row:
    """At least two blocks, no masked key, and the last block's max is the row max plus 1."""
    row = draw(rows(max_keys=16, min_blocks=2, masked=False))
    scores = list(row.scores)
    last = len(scores) - 1 - draw(st.integers(0, row.blocks[-1] - 1))
    scores[last] = max(scores) + 1.0
    return dataclasses.replace(row, scores=scores)


@pytest.mark.parametrize("arithmetic", [osm.FLOAT64, osm.MPMATH], ids=lambda a: a.name)
@settings(max_examples=50, deadline=None)
@given(row=rows_with_rising_max())
def test_skipped_rescale_is_detected(arithmetic: osm.Arithmetic, row: Row) -> None:
    """When the running max rises, a recurrence without α fails the bound check (and FA2's passes it)."""
    with mpmath.workprec(WORKING_PRECISION):
        unit_roundoff = arithmetic.unit_roundoff()
        correct = osm.tiled(osm.DEFERRED, row.scores, row.values, row.blocks, arithmetic)
        broken = osm.tiled(SKIP_RESCALE, row.scores, row.values, row.blocks, arithmetic)
    assert_within_bound(correct, row, unit_roundoff)
    with pytest.raises(AssertionError):
        assert_within_bound(broken, row, unit_roundoff)


def test_fully_masked_block_contributes_nothing() -> None:
    """A block whose keys are all masked leaves (m, ℓ, O) unchanged: no exp(-inf - (-inf)) = NaN."""
    state = osm.deferred_step(osm.initial_state(1, osm.FLOAT64), [osm.NEG_INF] * 3, [[1.0]] * 3, osm.FLOAT64)
    assert (state.m, state.l, state.o) == (osm.NEG_INF, 0.0, (0.0,))
    out, lse = osm.tiled(osm.DEFERRED, [osm.NEG_INF, 0.5], [[7.0], [2.0]], [1, 1], osm.FLOAT64)
    assert out == (2.0,) and lse == 0.5
    out, lse = osm.tiled(osm.EAGER, [osm.NEG_INF, osm.NEG_INF], [[7.0], [2.0]], [1, 1], osm.FLOAT64)
    assert out == (0.0,) and lse == osm.NEG_INF and not any(map(math.isnan, out))


def test_partition_must_cover_the_keys() -> None:
    with pytest.raises(ValueError, match=r"blocks=\[2, 2\] is not a partition of 3 keys"):
        osm.tiled(osm.DEFERRED, [0.0, 1.0, 2.0], [[1.0]] * 3, [2, 2], osm.FLOAT64)
