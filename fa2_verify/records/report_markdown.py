"""Markdown summaries for a CI job summary (``>> $GITHUB_STEP_SUMMARY``).

:func:`render_tolerance` summarizes a tolerance report (:mod:`records.report_json`):
the verdict, the environment, one table row per (dtype, output, feature) group
with its normalized-error and ULP quantiles (docs/error-model.md), every
failure with its reproduction line, and the unsupported capabilities.
:func:`render_gate` summarizes a gate verdict (:mod:`records.gate`).
Both are plain functions of plain data: they never touch a kernel or a file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fa2_verify.verify.metrics import decode_float

if TYPE_CHECKING:
    from fa2_verify.records.gate import GateResult

#: Failures listed in full before the rest are only counted (the JSON has them all).
MAX_FAILURES = 20


def _number(value: float | str | None) -> str:
    if value is None:
        return "-"
    number = decode_float(value)
    return f"{number:.3g}"


def _environment_line(environment: dict[str, Any]) -> str:
    fields = [
        ("device", environment.get("device_name") or environment.get("device")),
        ("driver", environment.get("nvidia_driver")),
        ("torch", environment.get("torch")),
        ("CUDA", environment.get("cuda")),
        ("triton", environment.get("triton")),
        ("kernel", environment.get("kernel_version")),
        ("fa2-verify", environment.get("fa2_verify")),
    ]
    return ", ".join(f"{name} {value}" for name, value in fields if value)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _fence(text: str) -> str:
    return "```\n" + text.replace("```", "'''") + "\n```"


def render_tolerance(report: dict[str, Any]) -> str:
    """A Markdown summary of a tolerance report dict (schema of :mod:`records.report_json`)."""
    summary = report["summary"]
    lines = [
        f"## fa2-verify: `{report['kernel']}` on `{report['device']}`: {report['verdict'].upper()}",
        "",
        f"{sum(summary.values())} cases: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['error']} error, {summary['unsupported']} unsupported.",
    ]
    environment = _environment_line(report.get("environment", {}))
    if environment:
        lines += ["", f"Environment: {environment}."]
    if report["groups"]:
        lines += [
            "",
            "Normalized error = |actual - expected| / first-order bound (docs/error-model.md); "
            "quantiles are the largest per-case value in each group.",
            "",
            "| dtype | output | feature | cases | verdict | normalized p50 | p99 | max | threshold "
            "| ULP p99 | ULP max | mismatches |",
            "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for group in report["groups"]:
            normalized = group["metrics"]["normalized"]["quantiles"]
            ulp = group["metrics"]["ulp"]["quantiles"]
            verdict = "passed" if group["verdict"] == "passed" else f"**FAILED** ({group['failed']})"
            lines.append(
                f"| {group['dtype']} | {group['output']} | {group['feature']} | {group['cases']} | {verdict} "
                f"| {_number(normalized['p50'])} | {_number(normalized['p99'])} | {_number(normalized['max'])} "
                f"| {_number(group['threshold'])} | {_number(ulp['p99'])} | {_number(ulp['max'])} "
                f"| {group['mismatches']} of {group['elements']} |"
            )
    failures = report["failures"]
    if failures:
        lines += ["", f"### Failures ({len(failures)})", ""]
        for failure in failures[:MAX_FAILURES]:
            outputs = ", ".join(failure["outputs"]) or failure["status"]
            lines += [
                f"<details><summary><code>{failure['case'] or '(unnamed)'}</code>: {outputs}</summary>",
                "",
                _fence(failure["message"]),
                "",
                "</details>",
                "",
            ]
        if len(failures) > MAX_FAILURES:
            lines.append(f"... and {len(failures) - MAX_FAILURES} more in tolerance.json.")
    if report["unsupported"]:
        lines += ["", "### Unsupported (listed, never counted as passed)", ""]
        for entry in report["unsupported"]:
            lines.append(
                f"- {entry['reason']}: {len(entry['cases'])} case(s) ({', '.join(entry['cases'][:8])}"
                f"{', ...' if len(entry['cases']) > 8 else ''})"
            )
    return "\n".join(lines).rstrip() + "\n"


def render_gate(result: GateResult) -> str:
    """A Markdown summary of a gate verdict: pass/fail and every finding with its numbers."""
    baseline = result.baseline
    head = "PASSED" if result.passed else "FAILED"
    lines = [
        f"## fa2-verify gate: `{baseline.kernel}` on `{baseline.device_name}`: {head}",
        "",
        f"Corpus version {baseline.corpus_version} ({result.cases} cases); "
        f"{len(result.regressions)} regression(s), {len(result.notes)} note(s).",
    ]
    if result.regressions:
        lines += ["", "| regression | where | what changed |", "|---|---|---|"]
        lines += [f"| {f.kind} | {_cell(f.where)} | {_cell(f.detail)} |" for f in result.regressions]
    if result.notes:
        lines += ["", "Notes:", ""]
        lines += [f"- {finding.explain()}" for finding in result.notes]
    return "\n".join(lines).rstrip() + "\n"
