"""``tolerance.json``: the versioned JSON report of one verification run.

Layout (schema_version 2; docs/reports-and-gate.md has every field)::

    {"schema": "fa2-verify/tolerance", "schema_version": 2,
     "kernel", "device", "config", "environment", "thresholds", "error_model",
     "summary":     {"passed": n, "failed": n, "unsupported": n, "error": n},
     "verdict":     "passed" | "failed" | "nothing-ran",
     "groups":      [{"kernel", "device", "dtype", "output", "feature", "verdict",
                      "cases", "passed", "failed", "elements", "mismatches", "nonfinite",
                      "threshold", "flash_ratio_max",
                      "metrics": {"normalized"|"ulp"|"abs_err"|"rel_err":
                                  {"quantiles": {...}, "histogram": {"edges", "counts"}}}}],
     "unsupported": [{"reason", "cases": [name, ...]}],
     "failures":    [{"case", "status", "outputs", "message", "reproduction", "spec"}],
     "cases":       [CaseResult.to_dict(), ...]}

A group is every compared output of one (dtype, output, feature) triple, the
feature being :meth:`core.case.CaseSpec.feature`.  Its histogram is the
bin-wise sum of the cases' fixed-edge histograms (:mod:`verify.metrics`); its
quantiles are, for each quantile name, the largest value among its cases (the
worst case's p50, p99, ...), since per-case quantiles cannot be pooled exactly.
The gate (:mod:`records.gate`) compares these same group quantiles.
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from fa2_verify import __version__
from fa2_verify.core.outputs import write_text_atomic
from fa2_verify.core.errors import InputJsonError, ReportError
from fa2_verify.core.user_json import read_json
from fa2_verify.verify.metrics import Distribution, OutputComparison, describe_failure, encode_float

if TYPE_CHECKING:
    from fa2_verify.verify.registry import LoadedKernel
    from fa2_verify.verify.results import CaseResult, RunResult

#: Version of the layout above.  Version 1 was the flat list of cases only.
SCHEMA_VERSION = 2
SCHEMA = "fa2-verify/tolerance"

#: The distributions every group summarizes, in report order.
METRICS: tuple[str, ...] = ("normalized", "ulp", "abs_err", "rel_err")

GroupKey = tuple[str, str, str]


def merge_histograms(distributions: Sequence[Distribution]) -> tuple[list[float], list[int]]:
    """Bin-wise sum of histograms that share their edges (differing edges are a harness bug)."""
    if not distributions:
        raise ValueError("merge_histograms needs at least one distribution")
    edges = list(distributions[0].histogram[0])
    counts = [0] * (len(edges) - 1)
    for distribution in distributions:
        other_edges, other_counts = distribution.histogram
        if list(other_edges) != edges:
            raise ValueError(f"histogram edges differ: {list(other_edges)} vs {edges}")
        counts = [total + count for total, count in zip(counts, other_counts, strict=True)]
    return edges, counts


def max_quantiles(distributions: Sequence[Distribution]) -> dict[str, float]:
    """For each quantile name, the largest value over ``distributions`` (the worst case's)."""
    if not distributions:
        raise ValueError("max_quantiles needs at least one distribution")
    return {name: max(d.quantiles[name] for d in distributions) for name in distributions[0].quantiles}


def group_comparisons(cases: Iterable[CaseResult]) -> dict[GroupKey, list[tuple[CaseResult, OutputComparison]]]:
    """Compared outputs keyed by (dtype, output, feature), in a stable sorted order."""
    groups: dict[GroupKey, list[tuple[CaseResult, OutputComparison]]] = {}
    for case in cases:
        for output, comparison in case.comparisons.items():
            groups.setdefault((case.spec.dtype, output, case.spec.feature()), []).append((case, comparison))
    return {key: groups[key] for key in sorted(groups)}


def _encode_quantiles(quantiles: dict[str, float]) -> dict[str, float | str]:
    return {name: encode_float(value) for name, value in quantiles.items()}


def summarize_group(
    kernel: str, device: str, key: GroupKey, members: Sequence[tuple[CaseResult, OutputComparison]]
) -> dict[str, Any]:
    """The JSON record of one (dtype, output, feature) group (see the module docstring)."""
    dtype, output, feature = key
    comparisons = [comparison for _, comparison in members]
    ratios = [c.flash_ratio for c in comparisons if c.flash_ratio is not None]
    metrics = {}
    for metric in METRICS:
        distributions = [getattr(c, metric) for c in comparisons]
        edges, counts = merge_histograms(distributions)
        metrics[metric] = {
            "quantiles": _encode_quantiles(max_quantiles(distributions)),
            "histogram": {"edges": [encode_float(edge) for edge in edges], "counts": counts},
        }
    failed = sum(not c.passed for c in comparisons)
    return {
        "kernel": kernel,
        "device": device,
        "dtype": dtype,
        "output": output,
        "feature": feature,
        "verdict": "failed" if failed else "passed",
        "cases": len(comparisons),
        "passed": len(comparisons) - failed,
        "failed": failed,
        "elements": sum(c.numel for c in comparisons),
        "mismatches": sum(c.mismatches for c in comparisons),
        "nonfinite": sum(c.nonfinite for c in comparisons),
        "threshold": max(c.threshold for c in comparisons),
        "flash_ratio_max": encode_float(max(ratios)) if ratios else None,
        "metrics": metrics,
    }


def unsupported_summary(cases: Iterable[CaseResult]) -> list[dict[str, Any]]:
    """Unsupported cases grouped by their reason (the capability the kernel lacks), and outputs the kernel
    does not provide (reason ``"<output>: <why>"``) with the cases that ran without them."""
    reasons: dict[str, list[str]] = {}
    for case in cases:
        name = case.spec.name or case.spec.feature()
        if case.status == "unsupported":
            reasons.setdefault(case.reason or "no reason given", []).append(name)
        for output, why in case.skipped_outputs.items():
            reasons.setdefault(f"{output}: {why}", []).append(name)
    return [{"reason": reason, "cases": names} for reason, names in sorted(reasons.items())]


def failure_records(cases: Iterable[CaseResult]) -> list[dict[str, Any]]:
    """Every failed or errored case with its message (:func:`describe_failure`) and reproduction line."""
    records = []
    for case in cases:
        if not case.counts_as_failure:
            continue
        outputs = case.failed_outputs()
        message = "\n".join(describe_failure(case, output) for output in outputs) if outputs else describe_failure(case)
        records.append(
            {
                "case": case.spec.name,
                "status": case.status,
                "outputs": outputs,
                "message": message,
                "reproduction": case.reproduction(),
                "spec": case.spec.to_dict(),
            }
        )
    return records


def verdict(run: RunResult) -> str:
    """``passed`` (something ran, nothing failed), ``failed``, or ``nothing-ran`` (all unsupported)."""
    counts = run.counts()
    if counts["failed"] or counts["error"]:
        return "failed"
    return "passed" if counts["passed"] else "nothing-ran"


def build_tolerance_report(run: RunResult, *, environment: dict[str, Any]) -> dict[str, Any]:
    """The tolerance report of ``run`` as a JSON-ready dict (schema above)."""
    groups = group_comparisons(run.cases)
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "kernel": run.kernel,
        "device": run.device,
        "config": run.config,
        "environment": environment,
        "thresholds": run.thresholds,
        "error_model": "docs/error-model.md",
        "summary": run.counts(),
        "verdict": verdict(run),
        "groups": [summarize_group(run.kernel, run.device, key, members) for key, members in groups.items()],
        "unsupported": unsupported_summary(run.cases),
        "failures": failure_records(run.cases),
        "cases": [case.to_dict() for case in run.cases],
    }


def write_tolerance_report(
    path: str | pathlib.Path, run: RunResult, *, environment: dict[str, Any], overwrite: bool
) -> pathlib.Path:
    """Write ``tolerance.json`` atomically; an existing file is kept unless ``overwrite``."""
    report = build_tolerance_report(run, environment=environment)
    return write_text_atomic(
        path, json.dumps(report, indent=1, allow_nan=False, default=str) + "\n", overwrite=overwrite, flag="--report"
    )


def load_tolerance_report(path: str | pathlib.Path) -> dict[str, Any]:
    """Read a tolerance report, refusing other schemas with a one-line :class:`ReportError`."""
    path = pathlib.Path(path)
    try:
        record = read_json(path, f"--tolerance={path}")
    except InputJsonError as exc:
        raise ReportError(str(exc)) from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA or record.get("schema_version") != SCHEMA_VERSION:
        found = record.get("schema_version") if isinstance(record, dict) else None
        raise ReportError(
            f"--tolerance={path}: schema_version={found!r} is not a {SCHEMA} version {SCHEMA_VERSION} report: "
            "write it again with this release's `fa2-verify run`"
        )
    return record


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi``, or ``None`` without one."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        completed = subprocess.run(
            [executable, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    versions = sorted({line.strip() for line in completed.stdout.splitlines() if line.strip()})
    return ",".join(versions) or None


def kernel_version(kernel: LoadedKernel) -> str:
    """The target's ``version`` attribute, else its distribution's version, else fa2-verify's (bundled kernels)."""
    declared = kernel.call_hook("version", lambda: getattr(kernel.target, "version", None))
    if isinstance(declared, str) and declared:
        return declared
    module: Any = getattr(kernel.target, "__module__", None) or getattr(kernel.target, "__name__", "")
    top = module.split(".")[0]
    if top != "kernels":
        for distribution in importlib.metadata.packages_distributions().get(top, []):
            version = _package_version(distribution)
            if version:
                return f"{distribution} {version}"
    return f"fa2-verify {__version__}"


def collect_environment(kernel: LoadedKernel, device: str) -> dict[str, Any]:
    """What a run depends on: :func:`verify.results.environment`, driver, triton, kernel version and config."""
    from fa2_verify.verify.results import environment

    record = environment(device)
    record.update(
        {
            "nvidia_driver": _nvidia_driver(),
            "triton": _package_version("triton"),
            "kernel": kernel.name,
            "kernel_version": kernel_version(kernel),
            "kernel_config": kernel.config(),
        }
    )
    return record
