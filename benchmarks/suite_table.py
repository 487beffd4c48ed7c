"""Aggregating the suite-time plugin's records (:mod:`benchmarks.suite_phases`) into a table per property.

Each record is one test in one process (or, under :data:`suite_phases.OUTSIDE`,
a process's time outside tests): its wall seconds, its exclusive seconds per
phase, the examples it ran.  :func:`aggregate` sums them per test id; what the
phases leave of a test's wall time is reported as ``hypothesis`` (Hypothesis'
generation, shrinking and database, and the harness around the phases).
Rows come sorted by wall time, the slowest first, followed by the processes'
time outside tests and the total over all of them (worker-seconds: with N
workers about N times the pass's wall-clock).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Iterable

from benchmarks.suite_phases import OUTSIDE, TARGETS
from fa2_verify.core.errors import UsageError

#: The timed phases, in table order (each target's phase, first appearance first).
PHASES: tuple[str, ...] = tuple(dict.fromkeys(phase for _, _, phase in TARGETS))
#: The column of the time no phase accounts for.
REST = "hypothesis"


def read_records(directory: pathlib.Path) -> list[dict[str, Any]]:
    """Every record of ``directory``'s ``*.jsonl`` files; a line that is not a JSON object is a one-line error."""
    records = []
    for path in sorted(directory.glob("*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{number}: not a suite-time record: {exc}") from None
            if not isinstance(record, dict) or not {"test", "seconds", "phases", "examples"} <= record.keys():
                raise UsageError(f"{path}:{number}: not a suite-time record: {line[:80]}")
            records.append(record)
    return records


def _row(test: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row: the sums of ``records``, the rest of the wall time, the outcome (``failed`` wins)."""
    seconds = sum(record["seconds"] for record in records)
    phases = {phase: sum(record["phases"].get(phase, 0.0) for record in records) for phase in PHASES}
    outcomes = {record.get("outcome", "") for record in records} - {""}
    outcome = next((name for name in ("failed", "passed", "skipped") if name in outcomes), "")
    return {
        "test": test,
        "outcome": outcome,
        "examples": sum(record["examples"] for record in records),
        "seconds": seconds,
        "phases": phases,
        REST: seconds - sum(phases.values()),
        "processes": len(records),
    }


def aggregate(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Rows per test id (slowest first), the time outside tests, the total, and what the processes reported."""
    records = list(records)
    by_test: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["test"] != OUTSIDE:
            by_test.setdefault(record["test"], []).append(record)
    outside = [record for record in records if record["test"] == OUTSIDE]
    tests = sorted((_row(test, group) for test, group in by_test.items()), key=lambda row: -row["seconds"])
    return {
        "tests": tests,
        "outside": _row(OUTSIDE, outside),
        "total": _row("total", records),
        "missing": sorted({name for record in outside for name in record.get("missing", ())}),
        "packages": sorted({record["package"] for record in outside if "package" in record}),
    }


def _short(test: str) -> str:
    """A property's name from its node id (``.../test_golden.py::test_out_within_error_model``)."""
    return test.rsplit("::", 1)[-1]


def _cells(row: dict[str, Any], total: float) -> list[str]:
    times = [row["seconds"], *(row["phases"][phase] for phase in PHASES), row[REST]]
    share = "" if total <= 0 else f" ({100 * row['seconds'] / total:.0f}%)"
    per_example = f"{row['seconds'] / row['examples']:.2f}" if row["examples"] else "-"
    return [_short(row["test"]), row["outcome"], str(row["examples"]), f"{times[0]:.1f}{share}",
            *(f"{value:.1f}" for value in times[1:]), per_example]  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    """The Markdown table of :func:`aggregate`'s result: seconds per phase, per property."""
    columns = ["property", "outcome", "examples", "wall s", *(f"{phase} s" for phase in PHASES), f"{REST} s",
               "s/example"]  # fmt: skip
    total = result["total"]["seconds"]
    rows = [*result["tests"], result["outside"], result["total"]]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(columns) - 2)) + "|"]
    lines += ["| " + " | ".join(_cells(row, total)) + " |" for row in rows]
    return "\n".join(lines)
