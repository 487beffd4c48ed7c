"""Certify the fast golden against mpmath on sampled rows of the case it serves.

Rows of ``out``, ``lse`` and ``dq`` are independent, so ``rows`` query rows
(among those that see at least one key) are recomputed by
:func:`golden.rows.query_row`.  A row of ``dk``/``dv`` sums over every query
that sees its key, so ``rows`` key rows (among keys seen by at least one
query) are recomputed by :func:`golden.rows.key_row` from mpmath scores and
two quantities of those queries taken from the fast path: the double-double
``LSE_i`` and the offset ``b_i = D_i - dP_{i,p(i)}`` (:mod:`golden.fast`,
step 4).  That is sound because both are certified here too, on the sampled
query rows: ``LSE`` to :data:`LIMIT` absolute (an error ``e`` scales every
``P_ij`` by ``exp(-e)``) and ``b`` to :data:`LIMIT` of
``sum_j P_ij |dP_ij - dP_{i,p(i)}|``, the scale of the ``dP_ij - D_i`` it
enters, so neither can move dK or dV by more than :data:`LIMIT` of the
terms they sum without failing the certification.  ``delta`` is certified
like the outputs; none of the three is reported.

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
:class:`core.errors.GoldenError` when a bound exceeds :data:`LIMIT`.
This is a measurement on samples, not a proof for the rows not sampled: the
fast path's error is uniform by construction (:mod:`golden.fast`), which is
what makes a few rows representative.
"""

from __future__ import annotations

import numpy as np
from mpmath import libmp

from fa2_verify.golden import rows as ref
from fa2_verify.golden.fast import FastResult
from fa2_verify.golden.inputs import HeadMajorInputs
from fa2_verify.core.errors import GoldenError

#: Largest certified error accepted, relative: 2**-40 is 2**16 times below
#: float32's unit roundoff, so the golden's own error is invisible in any
#: float16, bfloat16 or float32 kernel's error distribution.
LIMIT = 2.0**-40

#: float64's smallest normal number; differences below it are not counted.
UNDERFLOW = 2.0**-1022


def certify(problem: HeadMajorInputs, fast: FastResult, *, rows: int, precision_bits: int, seed: int) -> dict[str, float]:
    """Certified bounds per output name; raises ``GoldenError`` above :data:`LIMIT`.

    First, every value of every output must be finite (``lse`` on the rows
    that see a key), sampled or not: a NaN or infinity never passes.
    """
    _require_finite(problem, fast)
    rng = np.random.default_rng(seed)
    cache: dict[tuple[str, int, int], ref.Exact | list] = {}

    def exact(name: str, b: int, head: int) -> ref.Exact:
        if (name, b, head) not in cache:
            cache[(name, b, head)] = ref.exact(getattr(problem, name)[b, head])
        return cache[(name, b, head)]

    def mpf_rows(name: str, b: int, head: int) -> list:
        if (name, b, head) not in cache:
            if name == "lse":
                hi, lo = fast.lse_dd
                values = [libmp.mpf_add(ref.mpf(x), ref.mpf(y)) for x, y in zip(hi[b, head], lo[b, head])]
            else:
                values = [ref.mpf(x) for x in fast.offset[b, head]]
            cache[(name, b, head)] = values
        return cache[(name, b, head)]

    backward = problem.dout is not None
    names = ("out", "lse", "dq", "delta", "offset", "dk", "dv") if backward else ("out", "lse")
    bounds = {name: _Bound() for name in names}
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
            int(np.searchsorted(keys, fast.pivot[b, h, i])),
        )
        actual = {"out": fast.out[b, h, i], "lse": [fast.lse[b, h, i]]}
        if backward:
            actual.update(dq=fast.dq[b, h, i], delta=[fast.delta[b, h, i]], offset=[fast.offset[b, h, i]])
        _add(bounds, actual, expected, precision_bits)
        lse_dd.add(mpf_rows("lse", b, h)[i], expected.values["lse"], 0.0, precision_bits)
    if backward:
        seen_keys = np.flatnonzero(problem.mask.any(axis=0))
        for b, g, j in _sample(problem.batch, problem.heads_kv, seen_keys, rows, rng):
            queries = np.flatnonzero(problem.mask[:, j])
            heads = [
                (
                    exact("q", b, h).rows(queries),
                    exact("dout", b, h).rows(queries),
                    [mpf_rows("lse", b, h)[i] for i in queries],
                    fast.pivot[b, h, queries],
                    [mpf_rows("offset", b, h)[i] for i in queries],
                )
                for h in range(g * problem.group, (g + 1) * problem.group)
            ]
            expected = ref.key_row(problem.k[b, g, j], exact("v", b, g), j, heads, problem.scale, precision_bits)
            _add(bounds, {"dk": fast.dk[b, g, j], "dv": fast.dv[b, g, j]}, expected, precision_bits)
    observed = {name: bound.relative() for name, bound in bounds.items()}
    _enforce({**observed, "lse (double-double, absolute)": lse_dd.absolute()})
    return {name: value for name, value in observed.items() if name not in ("delta", "offset")}


def _require_finite(problem: HeadMajorInputs, fast: FastResult) -> None:
    seen = problem.mask.any(axis=1)
    arrays = {"lse": fast.lse[:, :, seen], **{name: getattr(fast, name) for name in ("out", "delta", "dq", "dk", "dv")}}
    for name, array in arrays.items():
        if array is not None and not np.isfinite(array).all():
            index = [int(i) for i in np.argwhere(~np.isfinite(array))[0]]
            raise GoldenError(
                f"the fast golden produced {name}{index}={array[tuple(index)]} (head-major index), not finite: "
                "compute this case with GoldenOptions(method='mpmath')"
            )


def _add(bounds: dict, actual: dict, expected: ref.Row, prec: int) -> None:
    for name, values in actual.items():
        expected_values = expected.values[name]
        expected_values = expected_values if isinstance(expected_values, list) else [expected_values]
        magnitudes = np.broadcast_to(expected.magnitudes[name], (len(expected_values),))
        for a, e, m in zip(values, expected_values, magnitudes):
            bounds[name].add(ref.mpf(a), e, float(m), prec)


class _Bound:
    """Running ``max |actual - expected|`` (in mpmath) and ``max (|expected| + magnitude)``.

    Differences up to :data:`UNDERFLOW` are not counted: a float64 result
    has no relative precision below it (e.g. ``P_ij`` under ``exp(-708)``).
    """

    def __init__(self) -> None:
        self.diff = libmp.fzero
        self.scale = 0.0

    def add(self, actual: tuple, expected: tuple, magnitude: float, prec: int) -> None:
        self.diff = _larger(self.diff, libmp.mpf_abs(libmp.mpf_sub(actual, expected, prec, ref.RND)))
        self.scale = max(self.scale, abs(libmp.to_float(expected)) + magnitude)

    def relative(self) -> float:
        excess = max(libmp.to_float(self.diff, rnd=ref.RND) - UNDERFLOW, 0.0)
        if excess == 0.0:
            return 0.0
        return excess / self.scale if self.scale else float("inf")

    def absolute(self) -> float:
        return max(libmp.to_float(self.diff, rnd=ref.RND) - UNDERFLOW, 0.0)


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


def _sample(batch: int, heads: int, rows: np.ndarray, count: int, rng: np.random.Generator) -> list[tuple]:
    """Up to ``count`` distinct ``(b, head, row)``, ``row`` in ``rows``: the first, the last, then random ones."""
    total = batch * heads * len(rows)
    if total <= count:
        flat = list(range(total))
    else:
        middle = rng.choice(total - 2, size=max(count - 2, 0), replace=False) + 1
        flat = [0, total - 1][:count] + [int(f) for f in middle]
    per_batch = heads * len(rows)
    return [(f // per_batch, f // len(rows) % heads, int(rows[f % len(rows)])) for f in flat]
