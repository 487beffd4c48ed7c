"""Baselines: a kernel's error quantiles and verdicts on the gate corpus, stored as JSON.

A baseline is recorded by running every corpus case of the chosen dtypes
through the kernel (:func:`measure`) and keeping, per (dtype, output,
feature) group, the quantiles of the normalized error and of the ULP distance
(each the largest per-case value of the group, as in :mod:`records.report_json`),
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
margin by it.  Loading validates the whole file against its JSON Schema
(:data:`SCHEMA_PATH`) and then the invariants a schema cannot state
(:func:`baseline_from_dict`); :func:`require_coverage` checks, before the gate
runs, that it holds every case and group of the corpus it gates, and
:func:`require_consistent_verdicts` that no group's quantiles contradict the
verdicts of its cases.  Anything
missing or malformed is a :class:`~core.errors.BaselineError` naming the
field, so the gate fails closed; a baseline is validated the same way before
it is written.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import jsonschema

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import Capabilities
from fa2_verify.core.outputs import write_text_atomic
from fa2_verify.verify.check import run_cases
from fa2_verify.verify.corpus import Corpus
from fa2_verify.core.errors import BaselineError, InputJsonError
from fa2_verify.core.user_json import parse_json
from fa2_verify.verify.error_model import THRESHOLDS
from fa2_verify.verify.metrics import QUANTILES, encode_float
from fa2_verify.verify.registry import LoadedKernel
from fa2_verify.records.report_json import collect_environment, group_comparisons, max_quantiles
from fa2_verify.verify.results import CaseResult, RunResult, device_name

SCHEMA = "fa2-verify/baseline"
SCHEMA_VERSION = 1

#: The JSON Schema of a baseline file (package data); :func:`baseline_from_dict` adds what a schema cannot state.
SCHEMA_PATH = pathlib.Path(__file__).resolve().parent / "schemas" / "baseline.schema.json"

#: The metrics a baseline keeps (dimensionless both); :mod:`records.gate` decides which of them gate.
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


def _field(parts: Sequence[str | int]) -> str:
    """A JSON path as a field name: ``groups[3].quantiles.normalized.max``."""
    name = ""
    for part in parts:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "baseline"


@functools.cache
def _schema_validator() -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))


def _check_schema(record: Any) -> None:
    """Raise ``ValueError`` naming the field where ``record`` breaks :data:`SCHEMA_PATH` (the most relevant one)."""
    error = jsonschema.exceptions.best_match(_schema_validator().iter_errors(record))
    if error is not None:
        raise ValueError(f"{_field(list(error.absolute_path))}: {error.message}")


def _check_group(group: GroupBaseline, where: str, repeats: int) -> None:
    """The invariants of a group's numbers that the schema cannot state.

    Every quantile is finite (a group holding an infinite or NaN error cannot
    be gated: nothing exceeds +inf) and ``p50 <= p90 <= p99 <= p99.9 <= max``,
    as each stored quantile is a maximum over cases and repeats of ordered
    per-case quantiles.  The jitter of a quantile is the spread
    ``max - min >= 0`` of its values over the repeats while the quantile is
    their maximum, so ``0 <= jitter <= quantile``, and ``jitter = 0`` when
    there was one repeat.
    """
    for metric in BASELINE_METRICS:
        values, spreads = group.quantiles[metric], group.jitter[metric]
        for table, kind in ((values, "quantiles"), (spreads, "jitter")):
            for name, value in table.items():
                if not math.isfinite(value):
                    raise ValueError(f"{where}.{kind}.{metric}.{name}={value!r}: must be a finite number")
        ordered = list(QUANTILES)
        for lower, upper in zip(ordered, ordered[1:]):
            if values[lower] > values[upper]:
                raise ValueError(
                    f"{where}.quantiles.{metric}.{upper}={values[upper]!r}: below {lower}={values[lower]!r}, "
                    "quantiles must rise from p50 to max"
                )
        for name, spread in spreads.items():
            if spread > values[name] or (repeats == 1 and spread != 0):
                limit = "0 with repeats=1" if repeats == 1 else f"at most the quantile, {values[name]!r}"
                raise ValueError(f"{where}.jitter.{metric}.{name}={spread!r}: must be {limit}")


def _check_case(case: CaseBaseline, failed_outputs: list[str], where: str) -> None:
    """A case's verdict agrees with itself: its status, reason and per-output pass/fail."""
    if sorted(failed_outputs) != sorted(case.failed_outputs):
        raise ValueError(
            f"{where}.failed_outputs={failed_outputs!r}: must list the outputs that are false, {case.failed_outputs}"
        )
    compared = case.status in ("passed", "failed")
    if compared != (case.reason is None):
        raise ValueError(f"{where}.reason={case.reason!r}: a {case.status} case has {'no' if compared else 'a'} reason")
    if case.status == "passed" and (not case.outputs or case.failed_outputs):
        raise ValueError(f"{where}.outputs={case.outputs!r}: a passed case has every output compared and true")
    if case.status == "failed" and not case.failed_outputs:
        raise ValueError(f"{where}.outputs={case.outputs!r}: a failed case has an output that is false")


def baseline_from_dict(record: Any) -> Baseline:
    """Validate a parsed baseline: the schema, then the invariants of its groups and cases.

    Raises ``ValueError`` whose one-line message starts with the field, e.g.
    ``groups[0].jitter.normalized.max=1000000000.0: must be at most the quantile, 0.5``.
    """
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ValueError(f"it is not a {SCHEMA} file")
    _check_schema(record)
    repeats = record["repeats"]
    groups = {}
    for index, group in enumerate(record["groups"]):
        entry = GroupBaseline(
            dtype=group["dtype"],
            output=group["output"],
            feature=group["feature"],
            cases=group["cases"],
            quantiles={metric: {q: float(v) for q, v in table.items()} for metric, table in group["quantiles"].items()},
            jitter={metric: {q: float(v) for q, v in table.items()} for metric, table in group["jitter"].items()},
        )
        _check_group(entry, f"groups[{index}]", repeats)
        if entry.key in groups:
            raise ValueError(f"groups[{index}]: the group {entry.where} appears twice")
        groups[entry.key] = entry
    cases = {}
    for name, case in record["cases"].items():
        case_entry = CaseBaseline(status=case["status"], reason=case["reason"], outputs=dict(case["outputs"]))
        _check_case(case_entry, case["failed_outputs"], f"cases.{name}")
        cases[name] = case_entry
    corpus = record["corpus"]
    return Baseline(
        kernel=record["kernel"],
        device=record["device"],
        device_name=record["device_name"],
        corpus_version=corpus["version"],
        corpus_digest=corpus["digest"],
        dtypes=tuple(record["dtypes"]),
        repeats=repeats,
        capabilities=record["capabilities"],
        groups=groups,
        cases=cases,
        environment=dict(record["environment"]),
    )


def compared_outputs(spec: CaseSpec) -> tuple[str, ...]:
    """The outputs a run of ``spec`` compares with the golden: the forward's, and the backward's when it has one."""
    return ("out", "lse", "dq", "dk", "dv") if spec.backward else ("out", "lse")


def _capabilities(record: dict[str, Any]) -> Capabilities:
    """The :class:`Capabilities` of a schema-valid ``Capabilities.as_dict()`` record (unknown fields ignored)."""
    return Capabilities(
        dtypes={device: tuple(names) for device, names in record["dtypes"].items()},
        head_dims=tuple(record["head_dims"]),
        device_head_dims={device: tuple(dims) for device, dims in record.get("device_head_dims", {}).items()},
        **{flag: record[flag] for flag in ("causal", "window", "gqa", "backward", "deterministic_backward", "varlen")},
        **{field: record[field] for field in ("causal_only", "causal_alignment", "custom_softmax_scale", "unaligned_inputs")
           if field in record},
    )


def require_coverage(baseline: Baseline, specs: Sequence[CaseSpec]) -> None:
    """Raise ``ValueError`` unless ``baseline`` holds exactly what a gate run of ``specs`` compares.

    Every case has a verdict; a case compared (passed or failed) is one the
    baseline's own capabilities support, with every output of
    :func:`compared_outputs`; every (dtype, output, feature) group of those
    outputs is present, counting between the cases that compared it and
    those plus the errored or unsupported cases that compared it in some
    repeat; and no group is left that no case compares.  A baseline with a
    group deleted, or capabilities emptied, would otherwise leave part of the
    corpus ungated while the gate passes.
    """
    names = [spec.name for spec in specs]
    missing, extra = sorted(set(names) - set(baseline.cases)), sorted(set(baseline.cases) - set(names))
    if missing or extra:
        raise ValueError(f"cases: {missing or 'none'} missing, {extra or 'none'} not in the corpus")
    capabilities = _capabilities(baseline.capabilities)
    required: dict[tuple[str, str, str], int] = {}
    possible: dict[tuple[str, str, str], int] = {}
    for spec in specs:
        case, outputs = baseline.cases[spec.name], compared_outputs(spec)
        compared = case.status in ("passed", "failed")
        where = f"cases.{spec.name}"
        reason = spec.unsupported_reason(capabilities, baseline.device) if compared else None
        if reason is not None:
            raise ValueError(f"{where}.status={case.status!r}: the baseline's capabilities exclude it ({reason})")
        recorded = set(case.outputs)
        if not (recorded == set(outputs) if compared else recorded <= set(outputs)):
            raise ValueError(f"{where}.outputs: has {sorted(recorded)}, the case compares {sorted(outputs)}")
        tally = required if compared else possible
        for output in case.outputs:
            key = (spec.dtype, output, spec.feature())
            tally[key] = tally.get(key, 0) + 1
    for key, count in required.items():
        group = baseline.groups.get(key)
        where = "/".join(key)
        if group is None:
            raise ValueError(f"groups: {where} is missing, though {count} case(s) of it were compared")
        if not count <= group.cases <= count + possible.get(key, 0):
            raise ValueError(f"groups[{where}].cases={group.cases}: {count} case(s) of it were compared")
    for key, group in baseline.groups.items():
        if key not in required and key not in possible:
            raise ValueError(f"groups[{group.where}]: no case of the corpus compares it")


def require_consistent_verdicts(baseline: Baseline, specs: Sequence[CaseSpec]) -> None:
    """Raise ``ValueError`` naming the first group whose quantiles contradict the verdicts of its cases.

    An output passes when no element's normalized error exceeds the output's
    threshold (:data:`verify.error_model.THRESHOLDS`), and a group's normalized
    ``max`` is the largest over its cases and repeats; a case's verdict on an
    output is true only if it passed in every repeat that compared it.  So
    where every case that recorded the group's output (``specs`` of its dtype
    and feature) passed it, the group's ``max``, and with it every lower
    quantile, is at most the threshold.  A baseline saying otherwise was not
    recorded by fa2-verify: gating against its inflated quantiles would let a
    regression of that size through.  (The converse does not hold: a failure
    can be a non-finite element with a small normalized error.)  Call it after
    :func:`require_coverage`, which maps every case of ``specs`` to its verdict.
    """
    members: dict[tuple[str, str, str], list[bool]] = {}
    for spec in specs:
        for output, passed in baseline.cases[spec.name].outputs.items():
            members.setdefault((spec.dtype, output, spec.feature()), []).append(passed)
    for key, group in baseline.groups.items():
        threshold, largest = THRESHOLDS[group.output], group.quantiles["normalized"]["max"]
        verdicts = members.get(key, [])
        if verdicts and all(verdicts) and largest > threshold:
            raise ValueError(
                f"groups[{group.where}].quantiles.normalized.max={largest!r}: above the pass threshold "
                f"{threshold:g}, yet all {len(verdicts)} case(s) of the group passed {group.output}"
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
        data = path.read_bytes()
    except OSError as exc:
        raise BaselineError(f"--baseline={path} cannot be read ({exc.strerror or exc}): {fix}") from None
    try:
        record = parse_json(data, f"--baseline={path}")
    except InputJsonError as exc:
        raise BaselineError(f"--baseline={path} is corrupt: {exc.problem}: {fix}") from None
    if isinstance(record, dict) and record.get("schema") == SCHEMA and record.get("schema_version") != SCHEMA_VERSION:
        raise BaselineError(
            f"--baseline={path} has schema_version={record.get('schema_version')!r}, this fa2-verify reads "
            f"{SCHEMA_VERSION}: {fix}"
        )
    try:
        return baseline_from_dict(record)
    except ValueError as exc:
        raise BaselineError(f"--baseline={path} is corrupt ({exc}): {fix}") from None


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
    """Write ``baseline`` atomically (:func:`dumps`) to the ``--out`` path; an existing file is kept unless ``overwrite``.

    It is validated as :func:`load_baseline` would read it, so a baseline that
    could not gate (e.g. a group with a non-finite error) is never written.
    """
    text = dumps(baseline)
    try:
        baseline_from_dict(json.loads(text))
    except ValueError as exc:
        raise BaselineError(
            f"the run of {baseline.kernel} cannot be a baseline ({exc}): a group whose errors are not finite "
            "cannot be gated; fix the kernel, or leave that dtype out with --dtypes"
        ) from None
    return write_text_atomic(path, text, overwrite=overwrite, flag="--out")


def measure(
    kernel: LoadedKernel,
    corpus: Corpus,
    *,
    device: str,
    dtypes: tuple[str, ...] | None,
    golden_options: Any,
    max_golden_seconds: float | None = None,
) -> RunResult:
    """Every corpus case of ``dtypes`` through ``kernel`` on ``device`` (:func:`verify.check.run_cases`)."""
    return run_cases(
        kernel, corpus.select(dtypes), device, golden_options=golden_options, max_golden_seconds=max_golden_seconds
    )


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
    max_golden_seconds: float | None = None,
) -> Baseline:
    """Measure ``kernel`` on the corpus ``repeats`` times and summarize it as a baseline."""
    chosen = tuple(sorted(dtypes)) if dtypes is not None else corpus.dtypes()
    runs = [
        measure(kernel, corpus, device=device, dtypes=chosen, golden_options=golden_options,
                max_golden_seconds=max_golden_seconds)
        for _ in range(repeats)
    ]
    return summarize(
        kernel, corpus, runs, device=device, dtypes=chosen, environment=collect_environment(kernel, device)
    )
