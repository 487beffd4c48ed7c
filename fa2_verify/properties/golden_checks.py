"""Checks against the mpmath golden: every output, non-finite values, varlen batches.

``B`` is the first-order bound of :func:`verify.error_model.first_order_bounds`
and ``tau`` its threshold (docs/error-model.md).
"""

from __future__ import annotations

from hypothesis import note

from fa2_verify.properties import verdicts
from fa2_verify.properties.session import Suite
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.layouts import guarded_case
from fa2_verify.core.varlen import VarlenSpec, pack
from fa2_verify.verify.check import check_case, check_varlen


def against_golden(suite: Suite, spec: CaseSpec, output: str) -> None:
    """``output`` of the kernel within ``THRESHOLDS[output] * B`` of the golden, elementwise."""
    verdicts.introduce(suite, spec)
    label = output
    result = check_case(suite.kernel, guarded_case(suite.case(spec)), golden_options=suite.golden_options)
    if result.status == "unsupported":
        verdicts.declined(suite, result.reason or "")
    suite.keep(result)
    comparison = result.comparisons.get(output)
    if comparison is None:
        verdicts.failed_run(suite, spec, label, f"status {result.status}: {result.reason}")
    verdicts.score(suite, label, spec, comparison.normalized.quantiles["max"])
    if not comparison.passed:
        raise verdicts.mismatch(result, output)


def finite_where_golden_finite(suite: Suite, spec: CaseSpec) -> None:
    """No output is NaN or Inf where the golden is finite (which includes elements left unwritten)."""
    verdicts.introduce(suite, spec)
    label = "non-finite elements"
    result = check_case(suite.kernel, guarded_case(suite.case(spec)), golden_options=suite.golden_options)
    if result.status == "unsupported":
        verdicts.declined(suite, result.reason or "")
    suite.keep(result)
    if not result.comparisons:
        verdicts.failed_run(suite, spec, label, f"status {result.status}: {result.reason}")
    counts = {name: comparison.nonfinite for name, comparison in result.comparisons.items()}
    suite.observe(label, float(sum(counts.values())), spec)
    bad = [name for name, count in counts.items() if count]
    if bad:
        raise verdicts.mismatch(result, bad[0])


def varlen_within_error_model(suite: Suite, spec: VarlenSpec, layout: str = "contiguous") -> None:
    """Each packed sequence's outputs, its inputs packed in the memory ``layout``
    (:data:`core.layouts.LAYOUTS`), within ``tau * B`` of the golden of that sequence alone."""
    verdicts.require_working_device(suite)
    case = f"varlen case {spec.describe()}, {layout} inputs"
    note(case)
    suite.running(spec)
    results = check_varlen(suite.kernel, pack(spec, suite.device, layout), golden_options=suite.golden_options)
    if results[0].status == "unsupported":
        verdicts.declined(suite, results[0].reason or "")
    if results[0].status == "error":
        verdicts.failed_run(suite, spec.sequence(0), "out", f"{results[0].reason} ({case})", case=case)
    scores: dict[str, float] = {}
    for result in results:
        for name, comparison in result.comparisons.items():
            scores[name] = max(scores.get(name, 0.0), comparison.normalized.quantiles["max"])
    for name, score in scores.items():
        verdicts.score(suite, name, spec.sequence(0), score)
    for index, result in enumerate(results):
        broken = next((name for name, comparison in result.comparisons.items() if not comparison.passed), None)
        if broken is not None:
            raise verdicts.mismatch(result, broken, f"sequence {index} of varlen case {spec.describe()}, {layout} inputs:\n")
