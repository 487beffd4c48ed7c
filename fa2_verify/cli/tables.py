"""The table of case results that ``run`` and ``repro`` print, and the description of each failure.

One row per (case, output), an output the kernel does not provide included
(with the reason); one row for an unsupported or errored case, with its
reason.  Columns: case, output, dtype, p50/p99/max normalized error, max ULP,
flash-attn ratio, verdict.
"""

from __future__ import annotations

from fa2_verify.app.cases.sets import case_label
from fa2_verify.verify.metrics import describe_failure
from fa2_verify.verify.results import CaseResult

_COLUMNS = (
    ("case", "<30"), ("output", "<6"), ("dtype", "<8"), ("p50", ">9"), ("p99", ">9"), ("max", ">9"),
    ("max ULP", ">9"), ("fa ratio", ">9"), ("verdict", "<"),
)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def format_table(cases: list[CaseResult]) -> str:
    """One row per (case, output), an output the kernel does not provide included (with the reason);
    one row for an unsupported or errored case, with its reason."""
    rows = [tuple(name for name, _ in _COLUMNS)]
    for case in cases:
        name = case_label(case.spec)
        if not case.comparisons:
            rows.append((name, "-", case.spec.dtype, "-", "-", "-", "-", "-", f"{case.status}: {case.reason}"))
            continue
        for output, comparison in case.comparisons.items():
            quantiles = comparison.normalized.quantiles
            rows.append((
                name,
                output,
                comparison.dtype,
                _number(quantiles["p50"]),
                _number(quantiles["p99"]),
                _number(quantiles["max"]),
                _number(comparison.ulp.quantiles["max"]),
                _number(comparison.flash_ratio),
                "passed" if comparison.passed else f"FAILED ({comparison.mismatches}/{comparison.numel})",
            ))
        for output, reason in case.skipped_outputs.items():
            rows.append((name, output, case.spec.dtype, "-", "-", "-", "-", "-", f"unsupported: {reason}"))
    return "\n".join(
        " ".join(f"{cell:{align}}" for cell, (_, align) in zip(row, _COLUMNS)).rstrip() for row in rows
    )


def failure_descriptions(cases: list[CaseResult]) -> list[str]:
    """:func:`verify.metrics.describe_failure` for every failing output and every errored case."""
    descriptions = []
    for case in cases:
        if case.status == "error":
            descriptions.append(describe_failure(case))
        descriptions.extend(describe_failure(case, output) for output in case.failed_outputs())
    return descriptions
