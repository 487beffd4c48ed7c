"""Certify the fast golden against mpmath on sampled rows of the case it serves.

Rows of ``out``, ``lse`` and ``dq`` are independent, so ``rows`` query rows
(among those that see at least one key) are recomputed by
:func:`golden.rows.query_row`.  A row of ``dk``/``dv`` sums over every query
that sees its key, so ``rows`` key rows (among keys seen by at least one
query) are recomputed by :func:`golden.rows.key_row` from mpmath scores and
the fast path's double-double ``LSE`` and ``D`` of those queries.  That is
sound because both are certified here too, and dK, dV depend on them only
through ``P_ij = exp(S_ij - LSE_i)`` and ``dP_ij - D_i``: an absolute error
``e`` in ``LSE`` changes each ``P_ij`` by the factor ``exp(-e)`` and a relative
error ``r`` in ``D`` changes ``dS`` by at most ``r |D| P``.  Both are checked below
``LIMIT`` (absolute for LSE, relative for D), so they move dK, dV by at most
``LIMIT`` of the terms they sum: the bounds reported for ``dk`` and ``dv``
hold up to that.

The samples always include the first and the last eligible row (mask
boundaries), the rest drawn by a generator seeded from the inputs' hash, so
a case is always certified on the same rows.  For each output the bound is

    max |fast - mpmath|  /  max (|mpmath| + M)        (over every element of the sampled rows)

where ``M`` is the magnitude of the terms the element sums
(:class:`golden.rows.Row`: e.g. ``sum_j P_ij |v_jc|`` for ``out``,
``|scale| sum_j |dS_ij k_jc|`` for ``dq``, ``max_j |S_ij|`` for ``lse``), the
scale of the first-order rounding bound in docs/error-model.md.  Measured
against ``|mpmath|`` alone the bound would be meaningless where the exact
value vanishes by cancellation (``dq = 0`` when all keys are equal, since
``sum_j dS_ij = 0``), although the golden is as good there as anywhere.
The difference is computed in mpmath, and the certification raises
:class:`verify.errors.GoldenError` when a bound exceeds :data:`LIMIT`.
This is a measurement on samples, not a proof for the rows not sampled: the
fast path's error is uniform by construction (:mod:`golden.fast`), which is
what makes a few rows representative.
"""

from __future__ import annotations

import numpy as np
from mpmath import libmp

from golden import rows as ref
from golden.fast import FastResult
from golden.inputs import Problem
from verify.errors import GoldenError

#: Largest certified error accepted, relative: 2**-40 is 2**16 times below
#: float32's unit roundoff, so the golden's own error is invisible in any
#: float16, bfloat16 or float32 kernel's error distribution.
LIMIT = 2.0**-40


def certify(problem: Problem, fast: FastResult, *, rows: int, precision_bits: int, seed: int) -> dict[str, float]:
    """Certified bounds per output name; raises ``GoldenError`` above :data:`LIMIT`."""
    rng = np.random.default_rng(seed)
    cache: dict[tuple[str, int, int], ref.Exact | list] = {}

    def exact(name: str, b: int, head: int) -> ref.Exact:
        if (name, b, head) not in cache:
            cache[(name, b, head)] = ref.exact(getattr(problem, name)[b, head])
        return cache[(name, b, head)]

    def mpf_rows(name: str, b: int, head: int) -> list:
        if (name, b, head) not in cache:
            hi, lo = getattr(fast, name)
            cache[(name, b, head)] = [libmp.mpf_add(ref.mpf(x), ref.mpf(y)) for x, y in zip(hi[b, head], lo[b, head])]
        return cache[(name, b, head)]

    backward = problem.dout is not None
    bounds = {name: _Bound() for name in (("out", "lse", "dq", "delta", "dk", "dv") if backward else ("out", "lse"))}
    lse_dd = _Bound()
    seen = np.flatnonzero(problem.mask.any(axis=1))
    for b, h, i in _sample(problem.batch, problem.heads_q, seen, rows, rng):
        keys = np.flatnonzero(problem.mask[i])
        g = h // problem.group
        expected = ref.query_row(
            problem.q[b, h, i],
            exact("k", b, g).rows(keys),
            exact("v", b, g).rows(keys),
            problem.dout[b, h, i] if backward else None,
            problem.scale,
            precision_bits,
        )
        actual = {"out": fast.out[b, h, i], "lse": [fast.lse[b, h, i]]}
        if backward:
            actual.update(dq=fast.dq[b, h, i], delta=[fast.delta[b, h, i]])
        _add(bounds, actual, expected, precision_bits)
        lse_dd.add(_dd_value(fast.lse_dd, (b, h, i)), expected.values["lse"], 0.0, precision_bits)
    if backward:
        seen_keys = np.flatnonzero(problem.mask.any(axis=0))
        for b, g, j in _sample(problem.batch, problem.heads_kv, seen_keys, rows, rng):
            queries = np.flatnonzero(problem.mask[:, j])
            heads = [
                (
                    exact("q", b, h).rows(queries),
                    exact("dout", b, h).rows(queries),
                    [mpf_rows("lse_dd", b, h)[i] for i in queries],
                    [mpf_rows("delta_dd", b, h)[i] for i in queries],
                )
                for h in range(g * problem.group, (g + 1) * problem.group)
            ]
            expected = ref.key_row(problem.k[b, g, j], problem.v[b, g, j], heads, problem.scale, precision_bits)
            _add(bounds, {"dk": fast.dk[b, g, j], "dv": fast.dv[b, g, j]}, expected, precision_bits)
    observed = {name: bound.relative() for name, bound in bounds.items()}
    _enforce({**observed, "lse (double-double, absolute)": lse_dd.absolute()})
    return {name: value for name, value in observed.items() if name != "delta"}


def _add(bounds: dict, actual: dict, expected: ref.Row, prec: int) -> None:
    for name, values in actual.items():
        expected_values = expected.values[name]
        expected_values = expected_values if isinstance(expected_values, list) else [expected_values]
        magnitudes = np.broadcast_to(expected.magnitudes[name], (len(expected_values),))
        for a, e, m in zip(values, expected_values, magnitudes):
            bounds[name].add(ref.mpf(a), e, float(m), prec)


class _Bound:
    """Running ``max |actual - expected|`` (in mpmath) and ``max (|expected| + magnitude)``."""

    def __init__(self) -> None:
        self.diff = libmp.fzero
        self.scale = 0.0

    def add(self, actual: tuple, expected: tuple, magnitude: float, prec: int) -> None:
        self.diff = _larger(self.diff, libmp.mpf_abs(libmp.mpf_sub(actual, expected, prec, ref.RND)))
        self.scale = max(self.scale, abs(libmp.to_float(expected)) + magnitude)

    def relative(self) -> float:
        if self.scale == 0.0:
            return 0.0 if self.diff == libmp.fzero else float("inf")
        return libmp.to_float(self.diff, rnd=ref.RND) / self.scale

    def absolute(self) -> float:
        return libmp.to_float(self.diff, rnd=ref.RND)


def _larger(a: tuple, b: tuple) -> tuple:
    return a if libmp.mpf_cmp(a, b) >= 0 else b


def _enforce(observed: dict[str, float]) -> None:
    failed = {name: value for name, value in observed.items() if not value <= LIMIT}
    if failed:
        detail = ", ".join(f"{name}={value:.3g}" for name, value in failed.items())
        raise GoldenError(
            f"the fast golden failed certification against mpmath: {detail} above the limit {LIMIT:.3g}; "
            "compute this case with GoldenOptions(method='mpmath')"
        )


def _dd_value(pair: tuple[np.ndarray, np.ndarray], index) -> tuple:
    """``hi + lo`` of a double-double entry as an exact raw mpf."""
    hi, lo = pair
    return libmp.mpf_add(ref.mpf(hi[index]), ref.mpf(lo[index]))


def _sample(batch: int, heads: int, rows: np.ndarray, count: int, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """Up to ``count`` distinct ``(b, head, row)``, ``row`` in ``rows``: the first, the last, then random ones."""
    total = batch * heads * len(rows)
    if total <= count:
        flat = list(range(total))
    else:
        middle = rng.choice(total - 2, size=max(count - 2, 0), replace=False) + 1
        flat = [0, total - 1][:count] + [int(f) for f in middle]
    per_batch = heads * len(rows)
    return [(f // per_batch, f // len(rows) % heads, int(rows[f % len(rows)])) for f in flat]
