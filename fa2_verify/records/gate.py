"""The gate: compare a kernel's run on the gate corpus with its stored baseline.

It fails (docs/design.md, "Gate"; docs/reports-and-gate.md) when

* a quantile of the normalized error rises beyond its margin: for a group
  (dtype, output, feature) and a quantile (p50 ... max) with baseline value
  ``b``, the new value ``a`` regresses when
  ``a - b > max(relative * b, floor) + jitter``, with ``relative`` 0.25 by
  default (overridable per output), ``floor`` 0.01 normalized units, and
  ``jitter`` the spread the baseline saw over its repeats (zero for a
  deterministic kernel).  ULP quantiles go through the same test with a
  0.5 ULP floor but are only reported (:data:`GATING_METRIC`);
* a case newly fails: an output that passed now mismatches, or the kernel
  now raises (status ``error``);
* a capability disappears: a flag, dtype or head dim the baseline's
  capabilities declared is gone, or a case that ran is now unsupported.

The corpus is deterministic and its golden cached, so two runs of an
unchanged kernel give identical quantiles: the margin guards against kernel
changes, not noise.  It fails closed: a missing, corrupt or mismatched baseline
(kernel, device, corpus version or digest, schema version, dtype set), or one
that does not cover every case and every (dtype, output, feature) group the
run compares, raises :class:`~core.errors.BaselineError` before anything runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from fa2_verify.records.baseline import BASELINE_METRICS, Baseline, require_consistent_verdicts, require_coverage
from fa2_verify.verify.results import device_name
from fa2_verify.verify.corpus import Corpus
from fa2_verify.core.errors import BaselineError, UsageError
from fa2_verify.verify.error_model import THRESHOLDS
from fa2_verify.verify.metrics import OUTPUT_AXES, QUANTILES

#: The metric whose rise fails the gate.  The ULP distance is compared too, but
#: only reported: near-zero elements give it huge values that move with any
#: change of summation order, while the normalized error scales each element
#: by its own rounding bound (docs/error-model.md).
GATING_METRIC = "normalized"

#: Default relative margin on every quantile (a 25% rise is tolerated, a 2x rise is not).
RELATIVE_MARGIN = 0.25

#: Default absolute floor per metric, below which a rise is never a regression.
FLOORS: Mapping[str, float] = {"normalized": 0.01, "ulp": 0.5}

_FLAGS = ("causal", "window", "gqa", "backward", "deterministic_backward", "varlen", "lse", "custom_softmax_scale",
          "unaligned_inputs")

#: Flags whose ``true`` declares less: a kernel that becomes causal-only has lost its non-causal path.
_RESTRICTING_FLAGS = ("causal_only",)

#: A flag's value in a baseline recorded before the flag existed (every kernel then provided an LSE, took a
#: custom softmax scale and its non-causal path, and was handed aligned inputs); the alignment was bottom-right.
_FLAG_DEFAULTS = {"lse": True, "custom_softmax_scale": True, "unaligned_inputs": False, "causal_only": False,
                  "causal_alignment": "bottom_right"}


@dataclasses.dataclass(frozen=True)
class Margins:
    """How far a quantile may rise: ``max(relative * b, floors[metric]) + jitter``."""

    relative: float = RELATIVE_MARGIN
    floors: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(FLOORS))
    outputs: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.relative >= 0 and math.isfinite(self.relative)):
            raise UsageError(f"--relative-margin={self.relative} is not valid: use a finite number >= 0, e.g. 0.25")
        for metric, floor in self.floors.items():
            if metric not in BASELINE_METRICS:
                raise UsageError(f"--floor {metric}={floor}: unknown metric, use one of {', '.join(BASELINE_METRICS)}")
            if not (floor >= 0 and math.isfinite(floor)):
                raise UsageError(f"--floor {metric}={floor} is not valid: use a finite number >= 0")
            if metric == GATING_METRIC and floor >= min(THRESHOLDS.values()):
                raise UsageError(
                    f"--floor {metric}={floor} is not valid: a floor at the pass threshold "
                    f"{min(THRESHOLDS.values()):g} would let a quantile rise through the whole passing range "
                    "unseen; use a number below it, e.g. 0.02"
                )
        for metric in BASELINE_METRICS:
            if metric not in self.floors:
                raise UsageError(f"margins lack a floor for {metric}: give --floor {metric}=VALUE")
        for output, relative in self.outputs.items():
            if output not in OUTPUT_AXES:
                raise UsageError(
                    f"--output-margin {output}={relative}: unknown output, use one of {', '.join(OUTPUT_AXES)}"
                )
            if not (relative >= 0 and math.isfinite(relative)):
                raise UsageError(f"--output-margin {output}={relative} is not valid: use a finite number >= 0")

    def allowed(self, metric: str, output: str, baseline: float, jitter: float) -> float:
        """The largest rise of a quantile with value ``baseline`` that is not a regression."""
        relative = self.outputs.get(output, self.relative)
        return max(relative * baseline, self.floors[metric]) + jitter


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing the gate noticed: a regression, or a note (an improvement or a gained capability)."""

    kind: str
    where: str
    detail: str

    def explain(self) -> str:
        return f"{self.kind}: {self.where}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class GateResult:
    """The verdict: regressions fail the gate, notes do not."""

    baseline: Baseline
    current: Baseline
    regressions: tuple[Finding, ...]
    notes: tuple[Finding, ...]

    @property
    def passed(self) -> bool:
        return not self.regressions

    @property
    def cases(self) -> int:
        return len(self.current.cases)


def check_compatible(
    baseline: Baseline, *, kernel: str, device: str, corpus: Corpus, dtypes: tuple[str, ...], source: str
) -> None:
    """Raise :class:`BaselineError` naming every way ``baseline`` does not match this gate run.

    First the dtypes asked for (a dtype the corpus lacks is a one-line
    :class:`UsageError` naming it, not a baseline mismatch), then the identity
    (kernel, device, corpus, dtypes), then the coverage
    (:func:`records.baseline.require_coverage`): a verdict for every case and a
    group for every output those cases compared, and last that no group's
    quantiles contradict its cases' verdicts
    (:func:`records.baseline.require_consistent_verdicts`).
    """
    selected = corpus.select(dtypes)
    expected = {
        "kernel": (baseline.kernel, kernel),
        "device": (baseline.device, device),
        "device name": (baseline.device_name, device_name(device)),
        "corpus version": (baseline.corpus_version, corpus.version),
        "corpus digest": (baseline.corpus_digest, corpus.digest()),
        "dtypes": (",".join(sorted(baseline.dtypes)), ",".join(sorted(dtypes))),
    }
    mismatches = [f"{name} {was!r} != {now!r}" for name, (was, now) in expected.items() if was != now]
    fix = f"record a baseline for it with `fa2-verify baseline --kernel {kernel} --device {device} --out FILE`"
    if mismatches:
        raise BaselineError(f"--baseline={source} does not match this run ({'; '.join(mismatches)}): {fix}")
    try:
        require_coverage(baseline, selected)
    except ValueError as exc:
        raise BaselineError(f"--baseline={source} does not cover this run ({exc}): {fix}") from None
    try:
        require_consistent_verdicts(baseline, selected)
    except ValueError as exc:
        raise BaselineError(f"--baseline={source} contradicts itself ({exc}): {fix}") from None


def _percent(before: float, after: float) -> str:
    if math.isinf(after):
        return "now infinite"
    if before == 0:
        return "from zero"
    return f"{100 * (after - before) / before:+.0f}%"


def _capabilities(before: dict, after: dict) -> tuple[list[Finding], list[Finding]]:
    lost, gained = [], []

    def declared(record: dict, flag: str):
        return record.get(flag, _FLAG_DEFAULTS.get(flag))

    for flag in (*_FLAGS, *_RESTRICTING_FLAGS):
        restricting = flag in _RESTRICTING_FLAGS
        # whether the kernel had, and has, what the flag is about (a restricting flag declares its absence)
        had, has = (bool(declared(record, flag)) != restricting for record in (before, after))
        if had and not has:
            detail = "newly declared: a path was dropped" if restricting else "was declared, is no longer"
            lost.append(Finding("capability-lost", f"capabilities.{flag}", detail))
        elif has and not had:
            gained.append(Finding("capability-gained", f"capabilities.{flag}",
                                  "no longer declared" if restricting else "newly declared"))
    was, now = declared(before, "causal_alignment"), declared(after, "causal_alignment")
    if was != now:
        # the baseline's masked cases were checked against the other mask: its numbers no longer compare
        lost.append(Finding("capability-lost", "capabilities.causal_alignment", f"was {was}, is {now}"))
    devices = sorted(set(before["dtypes"]) | set(after["dtypes"]))
    for device in devices:
        was, now = set(before["dtypes"].get(device, ())), set(after["dtypes"].get(device, ()))
        if was - now:
            lost.append(
                Finding("capability-lost", f"capabilities.dtypes[{device}]", f"no longer declares {sorted(was - now)}")
            )
        if now - was:
            gained.append(
                Finding("capability-gained", f"capabilities.dtypes[{device}]", f"newly declares {sorted(now - was)}")
            )
    was_dims, now_dims = set(before.get("head_dims", ())), set(after.get("head_dims", ()))
    if was_dims - now_dims:
        lost.append(
            Finding("capability-lost", "capabilities.head_dims", f"no longer declares {sorted(was_dims - now_dims)}")
        )
    return lost, gained


def _cases(baseline: Baseline, current: Baseline) -> tuple[list[Finding], list[Finding]]:
    regressions, notes = [], []
    for name, before in baseline.cases.items():
        now = current.cases[name]
        where = f"case {name}"
        if before.status != "unsupported" and now.status == "unsupported":
            regressions.append(
                Finding(
                    "capability-lost", where, f"ran ({before.status}) in the baseline, now unsupported: {now.reason}"
                )
            )
        elif now.status == "error" and before.status != "error":
            regressions.append(Finding("new-error", where, f"was {before.status}, now the kernel errors: {now.reason}"))
        newly_failing = [output for output in now.failed_outputs if before.outputs.get(output, True)]
        if newly_failing:
            regressions.append(
                Finding(
                    "new-failure",
                    where,
                    f"{', '.join(newly_failing)} now mismatch(es) the golden (was {before.status})",
                )
            )
        if before.status == "failed" and now.status == "passed":
            notes.append(Finding("fixed", where, "failed in the baseline, passes now"))
        if before.status == "unsupported" and now.status != "unsupported":
            notes.append(Finding("capability-gained", where, f"unsupported in the baseline, now {now.status}"))
    return regressions, notes


def _groups(baseline: Baseline, current: Baseline, margins: Margins) -> tuple[list[Finding], list[Finding]]:
    regressions, notes = [], []
    for key, before in baseline.groups.items():
        now = current.groups.get(key)
        if now is None:
            notes.append(
                Finding("group-gone", before.where, "no case of this group was compared (see the case findings)")
            )
            continue
        for metric in BASELINE_METRICS:
            rises, falls = [], []
            for quantile in QUANTILES:
                was, is_ = before.quantiles[metric][quantile], now.quantiles[metric][quantile]
                allowed = margins.allowed(metric, before.output, was, before.jitter[metric][quantile])
                if is_ - was > allowed:
                    rises.append(f"{quantile} {was:.4g} -> {is_:.4g} ({_percent(was, is_)}, allowed +{allowed:.3g})")
                elif was - is_ > allowed:
                    falls.append(f"{quantile} {was:.4g} -> {is_:.4g} ({_percent(was, is_)})")
            if rises and metric == GATING_METRIC:
                regressions.append(Finding("quantile-rise", f"{before.where} {metric}", "; ".join(rises)))
            elif rises:
                notes.append(
                    Finding("quantile-rise", f"{before.where} {metric}", "; ".join(rises) + " (reported, not gating)")
                )
            if falls:
                notes.append(
                    Finding(
                        "improved",
                        f"{before.where} {metric}",
                        "; ".join(falls) + " (consider recording a new baseline)",
                    )
                )
    for key, now in current.groups.items():
        if key not in baseline.groups:
            notes.append(Finding("new-group", now.where, "compared now, not in the baseline"))
    return regressions, notes


def compare(baseline: Baseline, current: Baseline, margins: Margins | None = None) -> GateResult:
    """The gate verdict of ``current`` (a run summarized as a baseline) against ``baseline``."""
    margins = margins or Margins()
    if set(current.cases) != set(baseline.cases):
        raise BaselineError("the baseline and this run cover different cases: record the baseline again")
    lost, gained = _capabilities(baseline.capabilities, current.capabilities)
    case_regressions, case_notes = _cases(baseline, current)
    group_regressions, group_notes = _groups(baseline, current, margins)
    return GateResult(
        baseline=baseline,
        current=current,
        regressions=tuple(lost + case_regressions + group_regressions),
        notes=tuple(gained + case_notes + group_notes),
    )


def format_result(result: GateResult, *, source: str) -> str:
    """The gate's text report: one verdict line, then every regression and note."""
    baseline = result.baseline
    verdict = "PASSED" if result.passed else f"FAILED with {len(result.regressions)} regression(s)"
    lines = [
        f"gate: {baseline.kernel} on {baseline.device_name} against {source} "
        f"(corpus version {baseline.corpus_version}, {result.cases} cases): {verdict}"
    ]
    lines += [f"  REGRESSION {finding.explain()}" for finding in result.regressions]
    lines += [f"  note {finding.explain()}" for finding in result.notes]
    return "\n".join(lines)
