"""The checks behind the property tests: run the kernel on a case, decide, explain.

Each check takes the :class:`~properties.session.Suite` and a drawn case,
returns a :class:`~properties.harness.Verdict`, reports its score to
``hypothesis.target`` (so the search climbs toward the worst inputs) and to
:meth:`Suite.observe` (so the run reports the worst case found), and attaches
the one-line reproduction with ``hypothesis.note``.  Failure messages go
through :func:`verify.metrics.describe_failure` (STYLE rule 5).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NoReturn

import torch
from hypothesis import note, reject, target

import golden
from properties import relations
from properties.determinism import config_block_k, dq_spread_bound
from properties.harness import Verdict
from properties.runs import KernelFailure, Outputs, run, run_varlen
from properties.varlen import VarlenSpec, pack
from properties.session import Suite
from verify import error_model, metrics
from verify.case import Case, CaseSpec, make_case
from verify.errors import UnsupportedCase
from verify.check import check_case
from verify.metrics import OutputComparison, describe_failure
from verify.results import CaseResult

GRADIENTS = ("dq", "dk", "dv")


def _score(suite: Suite, label: str, spec: CaseSpec, score: float) -> None:
    suite.observe(label, score, spec)
    if math.isfinite(score):
        target(score, label=label)


def _introduce(suite: Suite, spec: CaseSpec) -> None:
    note(f"reproduce: {spec.reproduction(suite.kernel.name)}")


def _declined(suite: Suite, reason: str) -> NoReturn:
    """Discard an example the kernel declined at run time, counting it as unsupported."""
    suite.decline(reason)
    reject()


def _failed_run(suite: Suite, spec: CaseSpec, label: str, reason: str) -> Verdict:
    suite.observe(label, math.inf, spec)
    result = CaseResult(spec=spec, kernel=suite.kernel.name, device=suite.device, status="error", reason=reason)
    return Verdict(False, describe_failure(result))


# Against the golden ----------------------------------------------------------


def against_golden(suite: Suite, spec: CaseSpec, output: str) -> Verdict:
    """``output`` of the kernel within ``THRESHOLDS[output] * B`` of the golden, elementwise."""
    _introduce(suite, spec)
    label = output
    result = check_case(suite.kernel, make_case(spec, suite.device), golden_options=suite.golden_options)
    if result.status == "unsupported":
        _declined(suite, result.reason or "")
    comparison = result.comparisons.get(output)
    if comparison is None:
        return _failed_run(suite, spec, label, f"status {result.status}: {result.reason}")
    _score(suite, label, spec, comparison.normalized.quantiles["max"])
    return Verdict(comparison.passed, "" if comparison.passed else describe_failure(result, output))


def finite_where_golden_finite(suite: Suite, spec: CaseSpec) -> Verdict:
    """No output is NaN or Inf where the golden is finite (which includes elements left unwritten)."""
    _introduce(suite, spec)
    label = "non-finite elements"
    result = check_case(suite.kernel, make_case(spec, suite.device), golden_options=suite.golden_options)
    if result.status == "unsupported":
        _declined(suite, result.reason or "")
    if not result.comparisons:
        return _failed_run(suite, spec, label, f"status {result.status}: {result.reason}")
    counts = {name: comparison.nonfinite for name, comparison in result.comparisons.items()}
    suite.observe(label, float(sum(counts.values())), spec)
    bad = [name for name, count in counts.items() if count]
    return Verdict(not bad, describe_failure(result, bad[0]) if bad else "")


def varlen_within_error_model(suite: Suite, spec: VarlenSpec) -> Verdict:
    """Each packed sequence's outputs within ``tau * B`` of the golden of that sequence alone."""
    note(f"varlen case: {spec.describe()}")
    packed = pack(spec, suite.device)
    try:
        outputs = run_varlen(suite.kernel, packed, backward=spec.backward)
    except UnsupportedCase as exc:
        _declined(suite, str(exc))
    except KernelFailure as failure:
        return _failed_run(suite, spec.sequence(0), "out", f"{failure} (varlen case {spec.describe()})")
    names = ("out", "lse", *GRADIENTS) if spec.backward else ("out", "lse")
    scores: dict[str, float] = {}
    failure = None
    for index, case in enumerate(packed.cases):
        rows_q, rows_k = packed.rows(index)
        actual = {
            "out": outputs.out[rows_q],
            "lse": outputs.lse[:, rows_q],
            "dq": outputs.dq[rows_q] if spec.backward else None,
            "dk": outputs.dk[rows_k] if spec.backward else None,
            "dv": outputs.dv[rows_k] if spec.backward else None,
        }
        expected = _golden(suite, case)
        bounds = error_model.first_order_bounds(case, expected)
        for name in names:
            comparison = metrics.compare(
                name, actual[name].unsqueeze(0), getattr(expected, name), bounds[name], threshold=error_model.THRESHOLDS[name]
            )
            scores[name] = max(scores.get(name, 0.0), comparison.normalized.quantiles["max"])
            if failure is None and not comparison.passed:
                result = CaseResult(
                    spec=case.spec, kernel=suite.kernel.name, device=suite.device, status="failed", comparisons={name: comparison}
                )
                failure = f"sequence {index} of varlen case {spec.describe()}:\n" + describe_failure(result, name)
    for name, score in scores.items():
        _score(suite, name, spec.sequence(0), score)
    return Verdict(failure is None, failure or "")


# Kernel against kernel -------------------------------------------------------


def _bounds(suite: Suite, case: Case) -> dict[str, torch.Tensor]:
    """First-order bounds for ``case`` (docs/error-model.md), from the golden."""
    return error_model.first_order_bounds(case, _golden(suite, case))


def _golden(suite: Suite, case: Case) -> Any:
    spec = case.spec
    return golden.compute(
        case.q,
        case.k,
        case.v,
        case.dout if spec.backward else None,
        softmax_scale=spec.scale,
        causal=spec.causal,
        window_size=spec.window_size,
        options=suite.golden_options,
    )


def _conclude(suite: Suite, spec: CaseSpec, statement: str, comparisons: list[OutputComparison]) -> Verdict:
    """Score each output by its largest normalized difference, then fail on the first broken comparison."""
    scores: dict[str, float] = {}
    for comparison in comparisons:
        scores[comparison.output] = max(scores.get(comparison.output, 0.0), comparison.normalized.quantiles["max"])
    for output, score in scores.items():
        _score(suite, output, spec, score)
    broken = next((comparison for comparison in comparisons if not comparison.passed), None)
    if broken is None:
        return Verdict(True)
    result = CaseResult(
        spec=spec, kernel=suite.kernel.name, device=suite.device, status="failed", comparisons={broken.output: broken}
    )
    return Verdict(
        False,
        f"relation {statement} does not hold for {broken.output} ('expected' is the related run):\n"
        + describe_failure(result, broken.output),
    )


def _runs(suite: Suite, spec: CaseSpec, label: str, *cases: Case, backward: bool | None = None) -> list[Outputs] | Verdict:
    """The kernel's outputs on each case, or the failed verdict of a kernel that raised or broke the contract."""
    try:
        return [run(suite.kernel, case, backward=backward) for case in cases]
    except UnsupportedCase as exc:
        _declined(suite, str(exc))
    except KernelFailure as failure:
        return _failed_run(suite, spec, label, str(failure))


def keys_permuted(suite: Suite, spec: CaseSpec, output: str) -> Verdict:
    """``output(Q, PK, PV) = output(Q, K, V)`` for an unmasked case and a key permutation P."""
    statement = f"{output}(q, k[perm], v[perm]) = {output}(q, k, v)"
    _introduce(suite, spec)
    case = make_case(spec, suite.device)
    permuted, _ = relations.permute_keys(case)
    runs = _runs(suite, spec, output, case, permuted, backward=False)
    if isinstance(runs, Verdict):
        return runs
    tolerance = 2 * _bounds(suite, case)[output]
    return _conclude(suite, spec, statement, [_compare(output, runs[0][output], runs[1][output], tolerance)])


def _compare(output: str, first: torch.Tensor, second: torch.Tensor, tolerance: torch.Tensor) -> OutputComparison:
    return relations.compare_runs(output, first, second, tolerance, threshold=error_model.THRESHOLDS[output])


def scores_shifted(suite: Suite, spec: CaseSpec, output: str) -> Verdict:
    """``O(S + t) = O(S)`` and ``LSE(S + t) = LSE(S) + t`` for a per-row shift ``t``."""
    statement = "out(S + t) = out(S)" if output == "out" else "lse(S + t) = lse(S) + t"
    _introduce(suite, spec)
    base, shifted, shift = relations.shift_scores(make_case(spec, suite.device))
    runs = _runs(suite, spec, output, base, shifted, backward=False)
    if isinstance(runs, Verdict):
        return runs
    tolerance = _bounds(suite, base)[output] + _bounds(suite, shifted)[output]
    first = runs[0][output]
    if output == "lse":
        first = first.to("cpu", torch.float64) + shift
    return _conclude(suite, spec, statement, [_compare(output, first, runs[1][output], tolerance)])


def independent(suite: Suite, spec: CaseSpec, *, batch: int | None = None, head: int | None = None) -> Verdict:
    """``out[b]`` (or query head ``h``) unchanged when every other batch element (every other head) changes."""
    axis = f"batch {batch}" if batch is not None else f"query head {head}"
    statement = f"out of {axis} is independent of the other inputs"
    _introduce(suite, spec)
    case = make_case(spec, suite.device)
    other = make_case(dataclasses.replace(spec, seed=(spec.seed + 1) % 2**32), suite.device)
    mixed = relations.replace_except(case, other, batch=batch, head=head)
    runs = _runs(suite, spec, "out", case, mixed, backward=False)
    if isinstance(runs, Verdict):
        return runs
    if batch is not None:
        kept = (slice(batch, batch + 1), slice(None), slice(None))
    else:
        kept = (slice(None), slice(None), slice(head, head + 1))
    tolerance = 2 * _bounds(suite, case)["out"][kept]
    return _conclude(suite, spec, statement, [_compare("out", runs[0].out[kept], runs[1].out[kept], tolerance)])


def gqa_as_mha(suite: Suite, spec: CaseSpec, outputs: tuple[str, ...]) -> Verdict:
    """GQA equals MHA with K, V repeated over each group: same out; dk, dv are the group sums of MHA's.

    The MHA gradients of a group are summed in float64 and rounded once to
    the dtype, which adds at most ``u |sum_h dk_h| <= u sum_h |dk_h|`` beyond
    the summed MHA bounds; the tolerance includes that term.
    """
    statement = "gqa(q, k, v) = mha(q, repeat(k), repeat(v))"
    _introduce(suite, spec)
    case = make_case(spec, suite.device)
    mha = relations.repeat_kv(case)
    runs = _runs(suite, spec, outputs[0], case, mha)
    if isinstance(runs, Verdict):
        return runs
    group = spec.heads_q // spec.heads_kv
    gqa_bounds, mha_bounds = _bounds(suite, case), _bounds(suite, mha)
    comparisons = []
    for output in outputs:
        second = runs[1][output]
        if output == "out":
            tolerance = gqa_bounds[output] + mha_bounds[output]
        else:
            magnitude = relations.group_sum(second.to("cpu", torch.float64).abs(), group)
            second = relations.group_sum(second.to(torch.float64), group).to(second.dtype)
            rounding = error_model.unit_roundoff(spec.torch_dtype) * magnitude
            tolerance = gqa_bounds[output] + relations.group_sum(mha_bounds[output], group) + rounding
        comparisons.append(_compare(output, runs[0][output], second, tolerance))
    return _conclude(suite, spec, statement, comparisons)


def causal_as_window(suite: Suite, spec: CaseSpec) -> Verdict:
    """``causal=True, window=(left, w)`` equals ``causal=False, window=(left, 0)``."""
    left = spec.window_size[0]
    statement = f"out(causal, window=({left}, *)) = out(window=({left}, 0))"
    _introduce(suite, spec)
    case = make_case(spec, suite.device)
    windowed = dataclasses.replace(case, spec=dataclasses.replace(spec, causal=False, window_size=(left, 0)))
    runs = _runs(suite, spec, "out", case, windowed, backward=False)
    if isinstance(runs, Verdict):
        return runs
    tolerance = 2 * _bounds(suite, case)["out"]
    return _conclude(suite, spec, statement, [_compare("out", runs[0].out, runs[1].out, tolerance)])


def causal_prefix(suite: Suite, spec: CaseSpec, rows: int) -> Verdict:
    """The first ``rows`` rows of a causal output from the first queries and keys alone equal the full call's."""
    statement = f"out(q[:{rows}], k[:{rows}+sk-sq], v[:{rows}+sk-sq]) = out(q, k, v)[:{rows}]"
    _introduce(suite, spec)
    case = make_case(spec, suite.device)
    runs = _runs(suite, spec, "out", case, relations.causal_prefix(case, rows), backward=False)
    if isinstance(runs, Verdict):
        return runs
    tolerance = 2 * _bounds(suite, case)["out"][:, :rows]
    return _conclude(suite, spec, statement, [_compare("out", runs[0].out[:, :rows], runs[1].out, tolerance)])


def layout_invariant(suite: Suite, spec: CaseSpec, layout: str) -> Verdict:
    """Every output is the same when q, k, v and dout are non-contiguous views (``layout``) of the same values."""
    statement = f"outputs({layout} inputs) = outputs(contiguous inputs)"
    _introduce(suite, spec)
    case = make_case(spec, suite.device)
    runs = _runs(suite, spec, "out", case, relations.in_layout(case, layout))
    if isinstance(runs, Verdict):
        return runs
    bounds = _bounds(suite, case)
    names = ("out", "lse", *GRADIENTS) if spec.backward else ("out", "lse")
    return _conclude(suite, spec, statement, [_compare(name, runs[0][name], runs[1][name], 2 * bounds[name]) for name in names])


# Determinism -----------------------------------------------------------------


def _bitwise(name: str, first: torch.Tensor, again: torch.Tensor) -> OutputComparison:
    """Bitwise equality as a comparison with tolerance 1 and threshold 0: any difference mismatches."""
    return relations.compare_runs(name, first, again, torch.ones(first.shape, dtype=torch.float64), threshold=0.0)


def reproducible(suite: Suite, spec: CaseSpec, outputs: tuple[str, ...], repeats: int) -> Verdict:
    """``outputs`` bitwise identical over ``1 + repeats`` calls on the same inputs."""
    statement = f"{', '.join(outputs)} bitwise identical across calls"
    _introduce(suite, spec)
    case = make_case(spec, suite.device)
    runs = _runs(suite, spec, outputs[0], *([case] * (1 + repeats)))
    if isinstance(runs, Verdict):
        return runs
    comparisons = [_bitwise(name, runs[0][name], again[name]) for again in runs[1:] for name in outputs]
    return _conclude(suite, spec, statement, comparisons)


def dq_spread_bounded(suite: Suite, spec: CaseSpec, repeats: int) -> Verdict:
    """``|dq_r - dq_0| <= spread bound`` (docs/error-model.md, "Determinism of atomic dQ") over repeated backward calls."""
    statement = "dq run-to-run spread within the atomic-accumulation bound"
    _introduce(suite, spec)
    case = make_case(spec, suite.device)
    runs = _runs(suite, spec, "dq", *([case] * (1 + repeats)))
    if isinstance(runs, Verdict):
        return runs
    dq_runs = [outputs["dq"] for outputs in runs]
    bound = dq_spread_bound(case, _golden(suite, case), dq_runs, block_k=config_block_k(suite.kernel.config()))
    comparisons = [relations.compare_runs("dq", dq_runs[0], dq, bound, threshold=1.0) for dq in dq_runs[1:]]
    return _conclude(suite, spec, statement, comparisons)
