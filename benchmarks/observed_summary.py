"""Examples per second and the largest shapes of a property-suite run, from Hypothesis' observations.

Run the suite with ``HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY=1`` (and
``HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER=1``: no line tracing) and
Hypothesis appends one JSON line per example to
``.hypothesis/observed/*_testcases.jsonl`` as soon as the example ends, so a
run stopped by a time limit still has a record of every example it finished.
``python3 benchmarks/observed_summary.py [--wall SECONDS] FILE...`` prints, per property, the examples
(passed, failed, invalid), the seconds spent executing them, examples per
second, and the largest case drawn by work (``batch * heads_q * seqlen_q *
seqlen_k * head_dim``); then the longest sequence lengths, largest head dim
and largest batch x heads over the whole run.  With ``--wall``, the run's
wall-clock seconds, it also prints the examples over them: the throughput
of a run whose workers execute tests at the same time, where the summed
execution seconds count each parallel second once per worker.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any, Iterator


def drawn_cases(arguments: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The case records among an example's drawn arguments (any dict with sequence lengths)."""
    for value in arguments.values():
        if isinstance(value, dict) and "seqlen_q" in value:
            yield value


def work(case: dict[str, Any]) -> int:
    return case["batch"] * case["heads_q"] * case["seqlen_q"] * case["seqlen_k"] * case["head_dim"]


def shape(case: dict[str, Any]) -> str:
    return (
        f"b{case['batch']} h{case['heads_q']}/{case['heads_kv']} sq{case['seqlen_q']} sk{case['seqlen_k']} "
        f"d{case['head_dim']} {case['dtype']}{' causal' if case.get('causal') else ''}"
    )


def summary(paths: list[pathlib.Path], wall: float | None = None) -> str:
    rows: dict[str, dict[str, Any]] = {}
    cases = []
    for path in paths:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("type") != "test_case":
                continue
            row = rows.setdefault(record["property"], {"passed": 0, "failed": 0, "gave_up": 0, "seconds": 0.0, "largest": None})
            row[record["status"]] = row.get(record["status"], 0) + 1
            row["seconds"] += record["timing"].get("execute:test", 0.0)
            for case in drawn_cases(record["arguments"]):
                cases.append(case)
                if row["largest"] is None or work(case) > work(row["largest"]):
                    row["largest"] = case
    lines = ["| property | passed | failed | invalid | seconds | examples/s | largest case |", "|---|---|---|---|---|---|---|"]
    for name, row in sorted(rows.items()):
        examples = row["passed"] + row["failed"] + row["gave_up"]
        rate = examples / row["seconds"] if row["seconds"] else float("inf")
        largest = shape(row["largest"]) if row["largest"] else "-"
        lines.append(
            f"| `{name.split('::')[-1]}` | {row['passed']} | {row['failed']} | {row['gave_up']} | "
            f"{row['seconds']:.1f} | {rate:.3f} | {largest} |"
        )
    if cases:
        examples = sum(row["passed"] + row["failed"] + row["gave_up"] for row in rows.values())
        seconds = sum(row["seconds"] for row in rows.values())
        lines.append("")
        lines.append(f"{examples} examples in {seconds:.1f} s of test execution ({examples / seconds:.3f} examples/s)")
        if wall:
            lines.append(f"{examples} examples in {wall:.0f} s of wall time ({examples / wall:.3f} examples/s)")
        for field in ("seqlen_q", "seqlen_k", "head_dim"):
            biggest = max(cases, key=lambda case: case[field])
            lines.append(f"largest {field}: {biggest[field]} ({shape(biggest)})")
        biggest = max(cases, key=lambda case: case["batch"] * case["heads_q"])
        lines.append(f"largest batch x heads_q: {biggest['batch'] * biggest['heads_q']} ({shape(biggest)})")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wall", type=float, help="the run's wall-clock seconds")
    parser.add_argument("files", nargs="+", type=pathlib.Path, help="Hypothesis' *_testcases.jsonl")
    arguments = parser.parse_args()
    print(summary(arguments.files, arguments.wall))
