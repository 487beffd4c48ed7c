"""Checks against the mpmath golden: every output, non-finite values, varlen batches.

``B`` is the first-order bound of :func:`verify.error_model.first_order_bounds`
and ``tau`` its threshold (docs/error-model.md).
"""

from __future__ import annotations

from hypothesis import note

from fa2_verify.properties import verdicts
from fa2_verify.properties.harness import Verdict
from fa2_verify.properties.runs import run_varlen
from fa2_verify.properties.session import Suite
from fa2_verify.properties.varlen import VarlenSpec, pack
from fa2_verify.verify import error_model, metrics
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.verify.check import check_case
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.verify.kernel_call import KernelFailure
from fa2_verify.verify.metrics import describe_failure
from fa2_verify.verify.results import CaseResult


def against_golden(suite: Suite, spec: CaseSpec, output: str) -> Verdict:
    """``output`` of the kernel within ``THRESHOLDS[output] * B`` of the golden, elementwise."""
    verdicts.introduce(suite, spec)
    label = output
    result = check_case(suite.kernel, make_case(spec, suite.device), golden_options=suite.golden_options)
    if result.status == "unsupported":
        verdicts.declined(suite, result.reason or "")
    suite.keep(result)
    comparison = result.comparisons.get(output)
    if comparison is None:
        return verdicts.failed_run(suite, spec, label, f"status {result.status}: {result.reason}")
    verdicts.score(suite, label, spec, comparison.normalized.quantiles["max"])
    return Verdict(comparison.passed, "" if comparison.passed else describe_failure(result, output))


def finite_where_golden_finite(suite: Suite, spec: CaseSpec) -> Verdict:
    """No output is NaN or Inf where the golden is finite (which includes elements left unwritten)."""
    verdicts.introduce(suite, spec)
    label = "non-finite elements"
    result = check_case(suite.kernel, make_case(spec, suite.device), golden_options=suite.golden_options)
    if result.status == "unsupported":
        verdicts.declined(suite, result.reason or "")
    suite.keep(result)
    if not result.comparisons:
        return verdicts.failed_run(suite, spec, label, f"status {result.status}: {result.reason}")
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
        verdicts.declined(suite, str(exc))
    except KernelFailure as failure:
        return verdicts.failed_run(suite, spec.sequence(0), "out", f"{failure} (varlen case {spec.describe()})")
    names = ("out", "lse", *verdicts.GRADIENTS) if spec.backward else ("out", "lse")
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
        expected = verdicts.golden_of(suite, case)
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
        verdicts.score(suite, name, spec.sequence(0), score)
    return Verdict(failure is None, failure or "")
