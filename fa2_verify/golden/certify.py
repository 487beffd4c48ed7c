"""Certify the fast golden on sampled rows against double-double reference rows, themselves checked against mpmath.

Rows of ``out``, ``lse`` and ``dq`` are independent, so sampled query rows
(among those that see at least one key) are recomputed by
:func:`golden.dd_rows.query_rows`.  A row of ``dk``/``dv`` sums over every
query that sees its key, so sampled key rows (among keys seen by at least one
query) are recomputed by :func:`golden.dd_rows.key_rows` from reference scores
and two quantities of those queries taken from the fast path: the
double-double ``LSE_i`` and the offset ``b_i = D_i - dP_{i,p(i)}``
(:mod:`golden.fast`, step 4).  That is sound because both are certified here
too, on the sampled query rows: ``LSE`` to :data:`LIMIT` absolute (an error
``e`` scales every ``P_ij`` by ``exp(-e)``) and ``b`` to :data:`LIMIT` of
``sum_j P_ij |dP_ij - dP_{i,p(i)}|``, the scale of the ``dP_ij - D_i`` it
enters, so neither can move dK or dV by more than :data:`LIMIT` of the terms
they sum without failing the certification.  ``delta`` is certified like the
outputs; none of the three is reported.

The reference rows are an independent computation (exact fixed-point
products and double-double arithmetic, :mod:`golden.fixed`, :mod:`golden.dd`,
where the fast path splits its products adaptively and takes ``exp`` in
float64), evaluated many rows at a time on the case's device.  They are
checked against mpmath on every case (:func:`golden.rows.query_row`,
:func:`golden.rows.key_row`): the sampled query row and key row that sum the
most terms, each restricted to at most :data:`MPMATH_TERMS` of them (a random
subset that keeps the pivot key), must agree with mpmath to
:data:`REFERENCE_LIMIT`, about ``2**40`` times tighter than the fast path's
limit.  Those rows evaluate the same arithmetic on the case's own data
(its exponents, its masks, its scale); the only difference on a full row is
more terms of the same pairwise sums, whose error grows with ``log2`` of the
count (:mod:`golden.dd`).

The samples (:func:`sample`) always include the first eligible row of the
first batch and head and the last eligible row of the last batch and head
(mask boundaries), then ``rows - 2`` rows drawn by a generator seeded from
the inputs (the cache key, or :func:`golden.inputs.fingerprint`), so a case
is always certified on the same rows, then, in the last batch and head, the
rows where indexing bugs live, while they exist and fit in
:data:`TERM_BUDGET` terms: the first block boundaries ``64`` and ``128`` and
their neighbours, the rows just before and at ``2**15``, ``2**16`` and
``2**17`` (16-bit offsets and grid limits), the start of the last 128-row
block (the last key block, for key rows) and its neighbours, then the rows
just after the powers of two.  For each output the bound is

    (max |fast - reference| + slack)  /  max (|reference| + M)  +  REFERENCE_LIMIT

over every element of the sampled rows, where ``M`` is the magnitude of the
terms the element sums (:class:`golden.rows.Row`: e.g. ``sum_j P_ij |v_jc|``
for ``out``, ``|scale| sum_j |dS_ij k_jc|`` for ``dq``, ``max_j |S_ij|`` for
``lse``), the scale of the first-order rounding bound in
docs/error-model.md, and ``slack`` the fixed-point products' remainder bound
(:func:`golden.fixed.matmul`).  Measured against ``|reference|`` alone the
bound would be meaningless where the exact value vanishes by cancellation
(``dq = 0`` when all keys are equal, since ``sum_j dS_ij = 0``), although the
golden is as good there as anywhere.  The certification raises
:class:`core.errors.GoldenError` when a bound exceeds :data:`LIMIT` or the
reference rows disagree with mpmath.  This is a measurement on samples, not a
proof for the rows not sampled: the fast path's error is uniform by
construction (:mod:`golden.fast`), which is what makes the sampled rows
representative (docs/error-model.md, "The golden").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np
import torch
from mpmath import libmp

from fa2_verify.golden import dd, dd_rows
from fa2_verify.golden import rows as mp_rows
from fa2_verify.golden.fast import FastResult
from fa2_verify.golden.inputs import HeadMajorInputs
from fa2_verify.core.errors import GoldenError

#: Largest certified error accepted, relative: 2**-40 is 2**16 times below
#: float32's unit roundoff, so the golden's own error is invisible in any
#: float16, bfloat16 or float32 kernel's error distribution.
LIMIT = 2.0**-40

#: Largest disagreement of the reference rows with mpmath, relative like the bounds: it is added to every
#: reported bound, and about 2**10 times the reference's own error (``2**-90``, :mod:`golden.dd`).
REFERENCE_LIMIT = 2.0**-80

#: float64's smallest normal number; differences below it are not counted.
UNDERFLOW = 2.0**-1022

#: Block sizes whose boundaries (plus and minus one) are sampled.
BOUNDARY_BLOCKS = (64, 128)

#: Powers of two around which rows are sampled: int16/uint16 offsets and
#: 65,536-program grid limits fail there.
BOUNDARY_POWERS = (2**15, 2**16, 2**17)

#: Most terms the boundary rows add per direction (query rows, key rows): every boundary row of a case of
#: 131,072 tokens fits, at about 2**22 double-double elements per batch of rows.
TERM_BUDGET = 2**24

#: Most (row, term) elements of one batch of reference rows: a few dozen float64 temporaries of this size live at
#: once (32 MiB each).
BATCH_TERMS = 2**22

#: Most elements of a batch that stacks several kv heads, per device type: on CUDA, which pays per launch, as many
#: as a batch may hold; on the CPU, which pays per element, only while launches outweigh the padding of the rows to
#: a common count and span.
STACKED_TERMS = {"cpu": 2**16, "cuda": BATCH_TERMS}

#: Terms of each row checked against mpmath (about 50 us each, :mod:`golden.rows`).
MPMATH_TERMS = 256

_QUERY_NAMES = ("out", "lse", "delta", "offset", "dq")
_KEY_NAMES = ("dk", "dv")


def certify(problem: HeadMajorInputs, fast: FastResult, *, rows: int, precision_bits: int, seed: int) -> dict[str, float]:
    """Certified bounds per output name; raises ``GoldenError`` above :data:`LIMIT`.

    First, every value of every output must be finite (``lse`` on the rows
    that see a key), sampled or not: a NaN or infinity never passes.
    """
    _require_finite(problem, fast)
    rng = np.random.default_rng(seed)
    backward = problem.dout is not None
    names = _QUERY_NAMES + _KEY_NAMES if backward else ("out", "lse")
    bounds = {name: _Bound() for name in names}
    lse_dd = _Bound()
    query_cost = lambda i: len(problem.keys_of(i))
    query_picks = sample(problem.batch, problem.heads_q, problem.seen_queries(), rows, rng, query_cost)
    for batch in _batches(query_picks, problem.group, problem.keys_of, problem.device):
        reference, served, served_lse = _query_batch(problem, fast, batch)
        for name, bound in bounds.items():
            if name in reference.values:
                bound.add(served[name], reference.values[name], reference.magnitudes[name], reference.slack[name])
        lse_dd.add_dd(served_lse, reference.values["lse"])
    key_picks: list[tuple] = []
    if backward:
        key_cost = lambda j: problem.group * len(problem.queries_of(j))
        key_picks = sample(problem.batch, problem.heads_kv, problem.seen_keys(), rows, rng, key_cost)
        for batch in _batches(key_picks, 1, problem.queries_of, problem.device, problem.group):
            reference, served = _key_batch(problem, fast, batch)
            for name in _KEY_NAMES:
                bounds[name].add(served[name], reference.values[name], reference.magnitudes[name], reference.slack[name])
    _check_reference(problem, fast, query_picks, key_picks, precision_bits, rng)
    observed = {name: bound.relative() for name, bound in bounds.items()}
    _enforce({**observed, "lse (double-double, absolute)": lse_dd.absolute()})
    return {name: value + REFERENCE_LIMIT for name, value in observed.items() if name not in ("delta", "offset")}


@dataclasses.dataclass(frozen=True)
class _Batch:
    """Sampled rows evaluated at once: per kv head ``(b[u], g[u])``, the rows ``rows[u]`` (of query heads
    ``heads[u]``; key rows have none), padded to a common count by repeating the last; ``terms`` the span of
    terms (keys, or queries) every row of the batch is evaluated over."""

    b: torch.Tensor
    g: torch.Tensor
    heads: torch.Tensor
    rows: torch.Tensor
    terms: torch.Tensor


def _batches(
    picks: list[tuple], group: int, terms_of: Callable[[int], range], device: torch.device, heads_per_term: int = 1
) -> Iterator[_Batch]:
    """Batches of ``picks`` ``(b, head, row)``: the rows of one kv head (``head // group``) in row order, kv heads
    stacked while the batch stays within ``STACKED_TERMS[device.type]`` (kv heads x rows x the union of their
    terms x ``heads_per_term``), one kv head's rows within :data:`BATCH_TERMS`, at least one row each."""
    by_head: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for b, head, row in picks:
        by_head.setdefault((b, head // group), []).append((head, row))
    stacked = STACKED_TERMS.get(device.type, STACKED_TERMS["cuda"])
    units: list[tuple[int, int, list[tuple[int, int]]]] = []
    for (b, g), members in sorted(by_head.items()):
        members.sort(key=lambda member: member[1])
        units.append((b, g, []))
        for member in members:
            if units[-1][2] and _cost([units[-1][2] + [member]], terms_of, heads_per_term) > BATCH_TERMS:
                units.append((b, g, []))
            units[-1][2].append(member)
    batch: list[tuple[int, int, list[tuple[int, int]]]] = []
    for unit in sorted(units, key=lambda unit: len(unit[2])):  # kv heads of similar row counts pad little
        if batch and _cost([u[2] for u in batch + [unit]], terms_of, heads_per_term) > stacked:
            yield _stack(batch, terms_of)
            batch = []
        batch.append(unit)
    if batch:
        yield _stack(batch, terms_of)


def _span(members: list[list[tuple[int, int]]], terms_of: Callable[[int], range]) -> range:
    spans = [terms_of(row) for rows in members for _, row in rows]
    return range(min(span.start for span in spans), max(span.stop for span in spans))


def _cost(members: list[list[tuple[int, int]]], terms_of: Callable[[int], range], heads_per_term: int) -> int:
    return len(members) * max(len(rows) for rows in members) * len(_span(members, terms_of)) * heads_per_term


def _stack(batch: list[tuple[int, int, list[tuple[int, int]]]], terms_of: Callable[[int], range]) -> _Batch:
    width = max(len(rows) for *_, rows in batch)
    padded = [rows + rows[-1:] * (width - len(rows)) for *_, rows in batch]
    span = _span(padded, terms_of)
    tensor = lambda values: torch.tensor(values, dtype=torch.int64)
    return _Batch(
        b=tensor([b for b, *_ in batch]), g=tensor([g for _, g, _ in batch]),
        heads=tensor([[h for h, _ in rows] for rows in padded]), rows=tensor([[i for _, i in rows] for rows in padded]),
        terms=torch.arange(span.start, span.stop),
    )


def _query_batch(problem: HeadMajorInputs, fast: FastResult, batch: _Batch):
    """The reference of a batch of query rows, the served values, and the served LSE as a double-double."""
    device = problem.device
    b, g = batch.b.to(device)[:, None], batch.g.to(device)[:, None]
    heads, rows, keys = batch.heads.to(device), batch.rows.to(device), batch.terms.to(device)
    first, last = problem.device_ranges
    visible = (keys >= first[rows][..., None]) & (keys <= last[rows][..., None])
    dout = problem.dout[b, heads, rows] if problem.dout is not None else None
    reference = dd_rows.query_rows(
        problem.q[b, heads, rows], problem.k[b, g, keys], problem.v[b, g, keys], dout, visible, problem.scale
    )
    served = {name: getattr(fast, name)[b, heads, rows] for name in _QUERY_NAMES if name in reference.values}
    return reference, served, (fast.lse_dd[0][b, heads, rows], fast.lse_dd[1][b, heads, rows])


def _key_batch(problem: HeadMajorInputs, fast: FastResult, batch: _Batch):
    """The reference of a batch of key rows, and the served values."""
    device = problem.device
    b, g, keys = batch.b.to(device)[:, None], batch.g.to(device)[:, None], batch.rows.to(device)
    queries = batch.terms.to(device)[None, :]
    heads = [_query_head(problem, fast, b, g * problem.group + member, keys, queries) for member in range(problem.group)]
    reference = dd_rows.key_rows(problem.k[b, g, keys], problem.v[b, g, keys], heads, problem.scale)
    served = {name: getattr(fast, name)[b, g, keys] for name in _KEY_NAMES}
    return reference, served


def _query_head(
    problem: HeadMajorInputs, fast: FastResult, b: torch.Tensor, h: torch.Tensor, keys: torch.Tensor,
    queries: torch.Tensor,
) -> dd_rows.QueryHead:
    """Query heads ``h`` (G, 1) of batches ``b`` (G, 1): their share of the key rows ``keys`` (G, R), over the
    queries ``queries`` (G or 1, m)."""
    assert problem.dout is not None and fast.offset is not None  # key rows exist only with a backward
    first, last = problem.device_ranges
    return dd_rows.QueryHead(
        q=problem.q[b, h, queries],
        dout=problem.dout[b, h, queries],
        lse=(fast.lse_dd[0][b, h, queries], fast.lse_dd[1][b, h, queries]),
        offset=fast.offset[b, h, queries],
        pivot_v=problem.v[b, h // problem.group, fast.pivot[b, h, queries]],
        visible=(keys[:, None, :] >= first[queries][..., None]) & (keys[:, None, :] <= last[queries][..., None]),
    )


def _check_reference(
    problem: HeadMajorInputs, fast: FastResult, query_picks: list, key_picks: list, precision_bits: int,
    rng: np.random.Generator,
) -> None:
    """Raise ``GoldenError`` unless the reference rows agree with mpmath to :data:`REFERENCE_LIMIT` on the sampled
    query row and key row that sum the most terms, each cut to at most :data:`MPMATH_TERMS` terms (module
    docstring)."""
    bounds: dict[str, _Bound] = {}
    for b, h, i in _widest(query_picks, lambda i: len(problem.keys_of(i))):
        g = h // problem.group
        keys = np.arange(problem.first[i], problem.last[i] + 1)
        pivot = int(fast.pivot[b, h, i])
        chosen = _subset(keys, pivot, MPMATH_TERMS, rng)
        index = torch.from_numpy(chosen).to(problem.device)
        k, v = problem.k[b, g][index], problem.v[b, g][index]
        q = problem.q[b, h, i][None]
        dout = problem.dout[b, h, i][None] if problem.dout is not None else None
        reference = dd_rows.query_rows(q, k, v, dout, torch.ones((1, len(chosen)), dtype=torch.bool, device=q.device),
                                       problem.scale)
        expected = mp_rows.query_row(
            q[0].cpu().numpy(), mp_rows.exact(k), mp_rows.exact(v), dout[0].cpu().numpy() if dout is not None else None,
            problem.scale, precision_bits, int(np.searchsorted(chosen, pivot)),
        )
        _compare_with_mpmath(bounds, reference, expected, precision_bits)
    for b, g, j in _widest(key_picks, lambda j: len(problem.queries_of(j))):
        assert problem.dout is not None and fast.offset is not None  # key rows exist only with a backward
        span = problem.queries_of(j)
        key = torch.tensor([j], device=problem.device)
        heads, mp_heads, value_rows = [], [], [problem.v[b, g][key]]  # value row 0 is the key's, then the pivots'
        for h in range(g * problem.group, (g + 1) * problem.group):
            chosen = _subset(np.arange(span.start, span.stop), None, max(MPMATH_TERMS // problem.group, 1), rng)
            queries = torch.from_numpy(chosen).to(problem.device)
            heads.append(_query_head(problem, fast, torch.tensor([[b]], device=problem.device),
                                     torch.tensor([[h]], device=problem.device), key[None], queries[None]))
            first_pivot = sum(len(rows) for rows in value_rows)
            value_rows.append(problem.v[b, g][fast.pivot[b, h][queries]])
            lse_hi, lse_lo = (x[b, h][queries].cpu().numpy() for x in fast.lse_dd)
            mp_heads.append((
                mp_rows.exact(problem.q[b, h][queries]),
                mp_rows.exact(problem.dout[b, h][queries]),
                [libmp.mpf_add(mp_rows.mpf(x), mp_rows.mpf(y)) for x, y in zip(lse_hi, lse_lo)],
                np.arange(first_pivot, first_pivot + len(chosen)),
                [mp_rows.mpf(x) for x in fast.offset[b, h][queries].cpu().numpy()],
            ))
        reference = dd_rows.key_rows(problem.k[b, g][key][None], problem.v[b, g][key][None], heads, problem.scale)
        expected = mp_rows.key_row(
            problem.k[b, g, j].cpu().numpy(), mp_rows.exact(torch.cat(value_rows)), 0, mp_heads, problem.scale,
            precision_bits,
        )
        _compare_with_mpmath(bounds, reference, expected, precision_bits)
    detail = _above({name: bound.relative() for name, bound in bounds.items()}, REFERENCE_LIMIT)
    if detail:
        raise GoldenError(
            f"the certification's double-double reference rows disagree with mpmath: {detail} above "
            f"{REFERENCE_LIMIT:.3g}; compute this case with GoldenOptions(method='mpmath')"
        )


def _widest(picks: list[tuple], terms: Callable[[int], int]) -> list[tuple]:
    """The pick whose row sums the most terms (the first of them), none when there are no picks."""
    return [max(picks, key=lambda pick: terms(pick[-1]))] if picks else []


def _subset(terms: np.ndarray, keep: int | None, count: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``count`` of ``terms`` (sorted), drawn at random, always with ``keep`` when given."""
    if len(terms) <= count:
        return terms
    drawn = rng.choice(terms, size=count, replace=False)
    if keep is not None and keep not in drawn:
        drawn[0] = keep
    return np.sort(drawn)


def _compare_with_mpmath(bounds: dict, reference: dd_rows.Reference, expected: mp_rows.Row, prec: int) -> None:
    """Add the reference row's disagreement with mpmath's ``expected`` to ``bounds``, per output."""
    for name, values in expected.values.items():
        expected_values = values if isinstance(values, list) else [values]
        hi, lo = (part.reshape(-1).cpu().numpy() for part in reference.values[name])
        magnitudes = np.broadcast_to(expected.magnitudes[name], (len(expected_values),))
        bound = bounds.setdefault(name, _Bound())
        for h, l, e, m in zip(hi, lo, expected_values, magnitudes):
            actual = libmp.mpf_add(mp_rows.mpf(h), mp_rows.mpf(l))
            difference = libmp.mpf_abs(libmp.mpf_sub(actual, e, prec, mp_rows.RND))
            bound.include(libmp.to_float(difference, rnd=libmp.round_up), abs(libmp.to_float(e)) + float(m))


def _largest(values: torch.Tensor) -> float:
    return float(values.max()) if values.numel() else 0.0


class _Bound:
    """Running ``max(|served - reference| + slack)`` and ``max(|reference| + M)`` over the sampled elements.

    Differences up to :data:`UNDERFLOW` are not counted: a float64 result has
    no relative precision below it (e.g. ``P_ij`` under ``exp(-708)``).
    """

    def __init__(self) -> None:
        self.diff = 0.0
        self.scale = 0.0

    def include(self, difference: float, scale: float) -> None:
        self.diff = max(self.diff, difference)
        self.scale = max(self.scale, scale)

    def add(self, served: torch.Tensor, reference: dd.DD, magnitude: torch.Tensor, slack: torch.Tensor) -> None:
        """Served float64 values against the reference's double-doubles, ``slack`` added to each difference."""
        difference = ((served - reference[0]) - reference[1]).abs() + slack
        self.include(_largest(difference), _largest(dd.value(reference).abs() + magnitude))

    def add_dd(self, served: dd.DD, reference: dd.DD) -> None:
        """Served double-doubles against the reference's, absolute only."""
        self.include(_largest(dd.value(dd.sub(served, reference)).abs()), 0.0)

    def relative(self) -> float:
        excess = max(self.diff - UNDERFLOW, 0.0)
        if excess == 0.0:
            return 0.0
        return excess / self.scale if self.scale else float("inf")

    def absolute(self) -> float:
        return max(self.diff - UNDERFLOW, 0.0)


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


def _above(observed: dict[str, float], limit: float) -> str:
    """``name=value`` of each observed bound above ``limit`` (NaN included), comma-separated; "" when none is."""
    return ", ".join(f"{name}={value:.3g}" for name, value in observed.items() if not value <= limit)


def _enforce(observed: dict[str, float]) -> None:
    detail = _above(observed, LIMIT)
    if detail:
        raise GoldenError(
            f"the fast golden failed certification against its reference rows: {detail} above the limit {LIMIT:.3g}; "
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
    the last batch and head, while the sum of their ``cost(row)`` stays within
    :data:`TERM_BUDGET`.
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
    spent = 0
    for row in boundary_rows(eligible):
        pick = (batch - 1, heads - 1, row)
        if pick in picks or spent + cost(row) > TERM_BUDGET:
            continue
        spent += cost(row)
        picks.append(pick)
    return picks
