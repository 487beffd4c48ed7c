"""Baselines: a kernel's error quantiles and verdicts on the gate corpus, stored as JSON.

A baseline is recorded by running every corpus case of the chosen dtypes
through the kernel (:func:`measure`) and keeping, per (dtype, output,
feature) group, the quantiles of the normalized error and of the ULP distance
(each the largest per-case value of the group, as in :mod:`verify.report_json`),
plus every case's verdict and the kernel's capabilities.  Layout
(schema_version 1; docs/reports-and-gate.md)::

    {"schema": "fa2-verify/baseline", "schema_version": 1,
     "kernel", "device", "device_name", "corpus": {"version", "digest"},
     "dtypes": [...], "repeats": n, "capabilities": Capabilities.as_dict(),
     "environment": {...},
     "groups": [{"dtype", "output", "feature", "cases",
                 "quantiles": {"normalized": {"p50", ...}, "ulp": {...}},
                 "jitter":    {"normalized": {"p50", ...}, "ulp": {...}}}],
     "cases": {name: {"status", "reason", "failed_outputs", "outputs"}}}

``jitter`` is the spread (max - min) of each quantile over ``repeats`` runs:
zero for a deterministic kernel, the size of atomic-accumulation noise for a
kernel such as a default-mode backward with atomic dQ.  The gate widens its
margin by it.  Loading checks every field; anything missing or malformed is a
:class:`~core.errors.BaselineError`, so the gate fails closed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

from fa2_verify.verify.atomic import write_text_atomic
from fa2_verify.verify.check import run_cases
from fa2_verify.verify.corpus import Corpus
from fa2_verify.core.errors import BaselineError
from fa2_verify.verify.metrics import QUANTILES, decode_float, encode_float
from fa2_verify.verify.registry import LoadedKernel
from fa2_verify.verify.report_json import collect_environment, group_comparisons, max_quantiles
from fa2_verify.verify.results import CaseResult, RunResult, device_name

SCHEMA = "fa2-verify/baseline"
SCHEMA_VERSION = 1

#: The metrics a baseline keeps (dimensionless both); :mod:`verify.gate` decides which of them gate.
BASELINE_METRICS: tuple[str, ...] = ("normalized", "ulp")

#: Worse statuses win when repeats disagree.
_STATUS_RANK = {"passed": 0, "unsupported": 1, "failed": 2, "error": 3}


@dataclasses.dataclass(frozen=True)
class GroupBaseline:
    """Quantiles (and their jitter over repeats) of one (dtype, output, feature) group."""

    dtype: str
    output: str
    feature: str
    cases: int
    quantiles: dict[str, dict[str, float]]
    jitter: dict[str, dict[str, float]]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.dtype, self.output, self.feature)

    @property
    def where(self) -> str:
        return f"{self.dtype}/{self.output}/{self.feature}"


@dataclasses.dataclass(frozen=True)
class CaseBaseline:
    """A case's verdict: status, the reason for unsupported/error, and each output's pass/fail."""

    status: str
    reason: str | None
    outputs: dict[str, bool]

    @property
    def failed_outputs(self) -> list[str]:
        return [name for name, passed in self.outputs.items() if not passed]


@dataclasses.dataclass(frozen=True)
class Baseline:
    """What the gate compares a new run against (module docstring)."""

    kernel: str
    device: str
    device_name: str
    corpus_version: int
    corpus_digest: str
    dtypes: tuple[str, ...]
    repeats: int
    capabilities: dict[str, Any]
    groups: dict[tuple[str, str, str], GroupBaseline]
    cases: dict[str, CaseBaseline]
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def encoded(table: dict[str, dict[str, float]]) -> dict[str, dict[str, float | str]]:
            return {metric: {q: encode_float(v) for q, v in values.items()} for metric, values in table.items()}

        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "kernel": self.kernel,
            "device": self.device,
            "device_name": self.device_name,
            "corpus": {"version": self.corpus_version, "digest": self.corpus_digest},
            "dtypes": list(self.dtypes),
            "repeats": self.repeats,
            "capabilities": self.capabilities,
            "environment": self.environment,
            "groups": [
                {
                    "dtype": group.dtype,
                    "output": group.output,
                    "feature": group.feature,
                    "cases": group.cases,
                    "quantiles": encoded(group.quantiles),
                    "jitter": encoded(group.jitter),
                }
                for group in self.groups.values()
            ],
            "cases": {
                name: {
                    "status": case.status,
                    "reason": case.reason,
                    "failed_outputs": case.failed_outputs,
                    "outputs": case.outputs,
                }
                for name, case in self.cases.items()
            },
        }


def _metric_table(record: Any, where: str) -> dict[str, dict[str, float]]:
    if not isinstance(record, dict) or set(record) != set(BASELINE_METRICS):
        raise ValueError(f"{where} must map exactly {list(BASELINE_METRICS)} to quantiles")
    table = {}
    for metric, values in record.items():
        if not isinstance(values, dict) or set(values) != set(QUANTILES):
            raise ValueError(f"{where}.{metric} must have exactly the quantiles {list(QUANTILES)}")
        decoded = {name: decode_float(value) for name, value in values.items()}
        if any(math.isnan(value) or value < 0 for value in decoded.values()):
            raise ValueError(f"{where}.{metric} has a negative or NaN quantile")
        table[metric] = decoded
    return table


def baseline_from_dict(record: Any) -> Baseline:
    """Validate a parsed baseline; raises ``ValueError``/``KeyError``/``TypeError`` on anything malformed."""
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ValueError(f"it is not a {SCHEMA} file")
    groups = {}
    for index, group in enumerate(record["groups"]):
        entry = GroupBaseline(
            dtype=str(group["dtype"]),
            output=str(group["output"]),
            feature=str(group["feature"]),
            cases=int(group["cases"]),
            quantiles=_metric_table(group["quantiles"], f"groups[{index}].quantiles"),
            jitter=_metric_table(group["jitter"], f"groups[{index}].jitter"),
        )
        if entry.key in groups:
            raise ValueError(f"group {entry.where} appears twice")
        groups[entry.key] = entry
    cases = {}
    for name, case in record["cases"].items():
        if case["status"] not in _STATUS_RANK:
            raise ValueError(f"case {name!r} has status {case['status']!r}")
        outputs = case["outputs"]
        if not isinstance(outputs, dict) or not all(isinstance(v, bool) for v in outputs.values()):
            raise ValueError(f"case {name!r}: 'outputs' must map output names to true/false")
        cases[str(name)] = CaseBaseline(status=case["status"], reason=case["reason"], outputs=dict(outputs))
    corpus = record["corpus"]
    capabilities = record["capabilities"]
    if not isinstance(capabilities, dict) or not isinstance(capabilities.get("dtypes"), dict):
        raise ValueError("'capabilities' is not a Capabilities.as_dict() record")
    return Baseline(
        kernel=str(record["kernel"]),
        device=str(record["device"]),
        device_name=str(record["device_name"]),
        corpus_version=int(corpus["version"]),
        corpus_digest=str(corpus["digest"]),
        dtypes=tuple(str(dtype) for dtype in record["dtypes"]),
        repeats=int(record["repeats"]),
        capabilities=capabilities,
        groups=groups,
        cases=cases,
        environment=dict(record.get("environment") or {}),
    )


def load_baseline(path: str | pathlib.Path) -> Baseline:
    """Read a baseline file; a missing, unreadable or corrupt one is a :class:`BaselineError`."""
    path = pathlib.Path(path)
    fix = f"record one with `fa2-verify baseline --kernel NAME --out {path}`"
    if path.is_dir():
        raise BaselineError(f"--baseline={path} is a directory: pass the baseline JSON file")
    if not path.is_file():
        raise BaselineError(f"--baseline={path} does not exist: {fix}")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"--baseline={path} cannot be read ({exc}): {fix}") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"--baseline={path} is corrupt: not valid JSON ({exc.msg} at line {exc.lineno}): {fix}"
        ) from None
    if isinstance(record, dict) and record.get("schema") == SCHEMA and record.get("schema_version") != SCHEMA_VERSION:
        raise BaselineError(
            f"--baseline={path} has schema_version={record.get('schema_version')!r}, this fa2-verify reads "
            f"{SCHEMA_VERSION}: {fix}"
        )
    try:
        return baseline_from_dict(record)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise BaselineError(f"--baseline={path} is corrupt ({detail}): {fix}") from None


def dumps(baseline: Baseline) -> str:
    """Strict JSON, one group and one case per line, so that a baseline's diff reads group by group."""

    def value(item: Any) -> str:
        return json.dumps(item, allow_nan=False, default=str)

    record = baseline.to_dict()
    lines = []
    for key, item in record.items():
        if key == "groups":
            body = ",\n".join(f"  {value(group)}" for group in item)
            lines.append(f' "groups": [\n{body}\n ]')
        elif key == "cases":
            body = ",\n".join(f"  {value(name)}: {value(case)}" for name, case in item.items())
            lines.append(f' "cases": {{\n{body}\n }}')
        else:
            lines.append(f" {value(key)}: {value(item)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_baseline(baseline: Baseline, path: str | pathlib.Path, *, overwrite: bool) -> pathlib.Path:
    """Write ``baseline`` atomically (:func:`dumps`) to the ``--out`` path; an existing file is kept unless ``overwrite``."""
    return write_text_atomic(path, dumps(baseline), overwrite=overwrite, flag="--out")


def measure(
    kernel: LoadedKernel, corpus: Corpus, *, device: str, dtypes: tuple[str, ...] | None, golden_options: Any
) -> RunResult:
    """Every corpus case of ``dtypes`` through ``kernel`` on ``device`` (:func:`verify.check.check_case`)."""
    return run_cases(kernel, corpus.select(dtypes), device, golden_options=golden_options)


def _case_baseline(results: Sequence[CaseResult]) -> CaseBaseline:
    worst = max(results, key=lambda result: _STATUS_RANK[result.status])
    outputs: dict[str, bool] = {}
    for result in results:
        for name, comparison in result.comparisons.items():
            outputs[name] = outputs.get(name, True) and comparison.passed
    return CaseBaseline(status=worst.status, reason=worst.reason, outputs=outputs)


def summarize(
    kernel: LoadedKernel,
    corpus: Corpus,
    runs: Sequence[RunResult],
    *,
    device: str,
    dtypes: tuple[str, ...],
    environment: dict[str, Any],
) -> Baseline:
    """A :class:`Baseline` from one or more runs of the same corpus (repeats measure jitter)."""
    per_run = [group_comparisons(run.cases) for run in runs]
    groups = {}
    for key in sorted({key for run_groups in per_run for key in run_groups}):
        members = [run_groups[key] for run_groups in per_run if key in run_groups]
        quantiles: dict[str, dict[str, float]] = {}
        jitter: dict[str, dict[str, float]] = {}
        for metric in BASELINE_METRICS:
            repeats = [max_quantiles([getattr(comparison, metric) for _, comparison in member]) for member in members]
            quantiles[metric] = {name: max(r[name] for r in repeats) for name in QUANTILES}
            jitter[metric] = {name: _spread([r[name] for r in repeats]) for name in QUANTILES}
        groups[key] = GroupBaseline(*key, cases=max(map(len, members)), quantiles=quantiles, jitter=jitter)
    names = [case.spec.name for case in runs[0].cases]
    cases = {name: _case_baseline([run.cases[index] for run in runs]) for index, name in enumerate(names)}
    return Baseline(
        kernel=kernel.name,
        device=device,
        device_name=device_name(device),
        corpus_version=corpus.version,
        corpus_digest=corpus.digest(),
        dtypes=dtypes,
        repeats=len(runs),
        capabilities=kernel.capabilities.as_dict(),
        groups=groups,
        cases=cases,
        environment=environment,
    )


def _spread(values: Sequence[float]) -> float:
    """max - min over repeats; 0 when a value is infinite (the baseline is then +inf, which nothing exceeds)."""
    if any(math.isinf(value) for value in values):
        return 0.0
    return max(values) - min(values)


def record(
    kernel: LoadedKernel,
    corpus: Corpus,
    *,
    device: str,
    dtypes: tuple[str, ...] | None = None,
    repeats: int = 1,
    golden_options: Any = None,
) -> Baseline:
    """Measure ``kernel`` on the corpus ``repeats`` times and summarize it as a baseline."""
    chosen = tuple(sorted(dtypes)) if dtypes is not None else corpus.dtypes()
    runs = [
        measure(kernel, corpus, device=device, dtypes=chosen, golden_options=golden_options) for _ in range(repeats)
    ]
    return summarize(
        kernel, corpus, runs, device=device, dtypes=chosen, environment=collect_environment(kernel, device)
    )
