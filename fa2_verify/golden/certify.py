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

The samples (:func:`sample`) always include the first eligible row of the
first batch and head and the last eligible row of the last batch and head
(mask boundaries), then ``rows - 2`` rows drawn by a generator seeded from
the inputs' hash, so a case is always certified on the same rows, then, in
the last batch and head, the rows where indexing bugs live, while they
exist and fit in the budget: the first block boundaries ``64`` and
``128`` and their neighbours, the rows just before and at ``2**15``,
``2**16`` and ``2**17`` (16-bit offsets and grid limits), the start of the
last 128-row block (the last key block, for key rows) and its neighbours,
then the rows just after the powers of two.  An mpmath row costs one
``exp`` and a dozen mpf operations per term it sums (the keys a query row
sees, the queries of the whole GQA group that see a key row, 20-50 us
each), so the boundary rows may add at most :data:`TERM_BUDGET` terms and
at most what the other rows cost: at 131,072 tokens that keeps the
certification at seconds per direction, and at 2,048 it at most doubles.  For each output the bound is

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

import multiprocessing as mp
from typing import Any
import os

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

#: Block sizes whose boundaries (plus and minus one) are sampled.
BOUNDARY_BLOCKS = (64, 128)

#: Powers of two around which rows are sampled: int16/uint16 offsets and
#: 65,536-program grid limits fail there.
BOUNDARY_POWERS = (2**15, 2**16, 2**17)

#: Most mpmath terms the boundary rows add per direction (query rows, key
#: rows) beyond the first, the last and the random rows (and never more than
#: those cost): 2**18 terms are a few seconds on one core (docs/benchmarks.md).
TERM_BUDGET = 2**18


#: Fewest mpmath terms (all sampled rows together) for which the rows are
#: evaluated by a pool of processes, one per CPU core: below it, forking
#: costs more than it saves (about 2**16 terms are a second on one core).
PARALLEL_MIN_TERMS = 2**16


def certify(problem: HeadMajorInputs, fast: FastResult, *, rows: int, precision_bits: int, seed: int) -> dict[str, float]:
    """Certified bounds per output name; raises ``GoldenError`` above :data:`LIMIT`.

    First, every value of every output must be finite (``lse`` on the rows
    that see a key), sampled or not: a NaN or infinity never passes.
    """
    _require_finite(problem, fast)
    rng = np.random.default_rng(seed)
    cache: dict[tuple[str, int, int], Any] = {}  # ref.Exact of an input, or a list of mpf rows
    backward = problem.dout is not None

    def exact(name: str, b: int, head: int) -> ref.Exact:
        if (name, b, head) not in cache:
            cache[(name, b, head)] = ref.exact(getattr(problem, name)[b, head])
        return cache[(name, b, head)]

    def mpf_rows(name: str, b: int, head: int) -> list:
        if (name, b, head) not in cache:
            if name == "lse":
                hi, lo = (x[b, head].cpu().numpy() for x in fast.lse_dd)
                values = [libmp.mpf_add(ref.mpf(x), ref.mpf(y)) for x, y in zip(hi, lo)]
            else:
                values = [ref.mpf(x) for x in fast.offset[b, head].cpu().numpy()]
            cache[(name, b, head)] = values
        return cache[(name, b, head)]

    names = ("out", "lse", "dq", "delta", "offset", "dk", "dv") if backward else ("out", "lse")
    bounds = {name: _Bound() for name in names}
    lse_dd = _Bound()
    jobs: list[tuple] = []  # (function, arguments, the fast path's values, the row's served LSE or None, terms)
    query_cost = lambda i: len(problem.keys_of(i))
    for b, h, i in sample(problem.batch, problem.heads_q, problem.seen_queries(), rows, rng, query_cost):
        keys = problem.keys_of(i)
        span, g = slice(keys.start, keys.stop), h // problem.group
        arguments = (
            problem.q[b, h, i].cpu().numpy(),
            exact("k", b, g).rows(span),
            exact("v", b, g).rows(span),
            problem.dout[b, h, i].cpu().numpy() if backward else None,
            problem.scale,
            precision_bits,
            int(fast.pivot[b, h, i]) - keys.start,
        )
        actual = {"out": fast.out[b, h, i].cpu().numpy(), "lse": [float(fast.lse[b, h, i])]}
        if backward:
            actual.update(
                dq=fast.dq[b, h, i].cpu().numpy(), delta=[float(fast.delta[b, h, i])], offset=[float(fast.offset[b, h, i])]
            )
        jobs.append((ref.query_row, arguments, actual, mpf_rows("lse", b, h)[i], len(keys)))
    if backward:
        key_cost = lambda j: problem.group * len(problem.queries_of(j))
        for b, g, j in sample(problem.batch, problem.heads_kv, problem.seen_keys(), rows, rng, key_cost):
            queries = problem.queries_of(j)
            span = slice(queries.start, queries.stop)
            heads = [
                (
                    exact("q", b, h).rows(span),
                    exact("dout", b, h).rows(span),
                    mpf_rows("lse", b, h)[span],
                    fast.pivot[b, h, span].cpu().numpy(),
                    mpf_rows("offset", b, h)[span],
                )
                for h in range(g * problem.group, (g + 1) * problem.group)
            ]
            arguments = (problem.k[b, g, j].cpu().numpy(), exact("v", b, g), j, heads, problem.scale, precision_bits)
            actual = {"dk": fast.dk[b, g, j].cpu().numpy(), "dv": fast.dv[b, g, j].cpu().numpy()}
            jobs.append((ref.key_row, arguments, actual, None, key_cost(j)))
    for (*_, actual, served_lse, _), expected in zip(jobs, _evaluate(jobs)):
        _add(bounds, actual, expected, precision_bits)
        if served_lse is not None:
            lse_dd.add(served_lse, expected.values["lse"], 0.0, precision_bits)
    observed = {name: bound.relative() for name, bound in bounds.items()}
    _enforce({**observed, "lse (double-double, absolute)": lse_dd.absolute()})
    return {name: value for name, value in observed.items() if name not in ("delta", "offset")}


#: The rows of one certification, while a pool of forked processes evaluates them.
_JOBS: list[tuple] = []


def _evaluate(jobs: list[tuple]) -> list[ref.Row]:
    """Each job's mpmath row, in order: in this process, or across the CPU cores above :data:`PARALLEL_MIN_TERMS`.

    The rows are independent, pure Python and numpy (their inputs were made
    exact and copied to the host here), so forked workers read them from
    the inherited memory without pickling the inputs; only the rows' mpf
    results come back.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = min(cores, len(jobs))
    if workers < 2 or sum(job[-1] for job in jobs) < PARALLEL_MIN_TERMS or "fork" not in mp.get_all_start_methods():
        return [function(*arguments) for function, arguments, *_ in jobs]
    _JOBS[:] = jobs
    try:
        with mp.get_context("fork").Pool(workers) as pool:
            return pool.map(_evaluate_job, range(len(jobs)), chunksize=1)
    finally:
        _JOBS.clear()


def _evaluate_job(index: int) -> ref.Row:
    function, arguments, *_ = _JOBS[index]
    return function(*arguments)


def _require_finite(problem: HeadMajorInputs, fast: FastResult) -> None:
    seen = problem.seen_queries()
    arrays = {
        "lse": fast.lse[:, :, seen.start : seen.stop],
        **{name: getattr(fast, name) for name in ("out", "delta", "dq", "dk", "dv")},
    }
    for name, tensor in arrays.items():
        if tensor is None:
            continue
        finite = tensor.isfinite()
        if not bool(finite.all()):
            index = [int(i) for i in (~finite).nonzero()[0]]
            if name == "lse":
                index[2] += seen.start
            value = float(getattr(fast, name)[tuple(index)])
            raise GoldenError(
                f"the fast golden produced {name}{index}={value} (head-major index), not finite: "
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


def boundary_rows(eligible: range) -> list[int]:
    """Rows of ``eligible`` where indexing bugs live, most telling first (see the module docstring)."""
    if not eligible:
        return []
    last = eligible.stop - 1
    near = [block + step for block in BOUNDARY_BLOCKS for step in (-1, 0, 1)]
    crossings = [power + step for power in BOUNDARY_POWERS for step in (-1, 0)]
    final = [last // BOUNDARY_BLOCKS[-1] * BOUNDARY_BLOCKS[-1] + step for step in (-1, 0, 1)]
    after = [power + 1 for power in BOUNDARY_POWERS]
    ordered = dict.fromkeys(row for row in near + crossings + final + after if row in eligible)
    return list(ordered)


def sample(batch: int, heads: int, eligible: range, count: int, rng: np.random.Generator, cost) -> list[tuple]:
    """Distinct ``(b, head, row)``, ``row`` in ``eligible``: the first, the last, random ones, then boundary rows.

    The first row is taken in batch 0, head 0, and the last in the last batch
    and head; up to ``count`` rows in all come from those two and a uniform
    draw over every ``(b, head, row)``.  Then each of :func:`boundary_rows`, in
    the last batch and head (whose inputs the last row already converted for
    mpmath), while the sum of their ``cost(row)`` stays within both
    :data:`TERM_BUDGET` and the cost of the rows already picked (so the
    boundary rows at most double the certification's time).
    """
    rows = len(eligible)
    total = batch * heads * rows
    if total <= count:
        flat = list(range(total))
    else:
        middle = rng.choice(total - 2, size=max(count - 2, 0), replace=False) + 1
        flat = [0, total - 1][:count] + [int(f) for f in middle]
    per_batch = heads * rows
    picks = [(f // per_batch, f // rows % heads, eligible[f % rows]) for f in flat]
    budget = min(TERM_BUDGET, sum(cost(row) for *_, row in picks))
    spent = 0
    for row in boundary_rows(eligible):
        pick = (batch - 1, heads - 1, row)
        if pick in picks or spent + cost(row) > budget:
            continue
        spent += cost(row)
        picks.append(pick)
    return picks
