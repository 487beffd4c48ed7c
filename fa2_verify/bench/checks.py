"""The benchmark's ``check`` section: the bundled ``triton`` kernel on odd feature cases, through :mod:`verify.check`.

The cases (:data:`app.cases.bench_checks.CHECK_CASES`: every feature on odd
shapes) are checked by the product's one path: outputs poisoned, the
contract checked, every output compared with the golden under the error
model (:func:`verify.check.check_case`, :func:`verify.check.check_varlen`).
Both backward modes are checked, and the deterministic one is run twice and
must repeat dq, dk and dv bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fa2_verify.app.cases.bench_checks import CHECK_CASES, CheckCase
from fa2_verify.app.runs import golden_options
from fa2_verify.app.targets import load_target
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.layouts import in_layout
from fa2_verify.core.varlen import VarlenSpec, pack
from fa2_verify.verify.check import check_case, check_varlen
from fa2_verify.verify.kernel_call import run_case, run_varlen
from fa2_verify.verify.registry import LoadedKernel
from fa2_verify.verify.results import CaseResult

#: Where the cases run (the checks also run on the CPU under the Triton interpreter).
DEVICE = "cuda"


def kernel() -> LoadedKernel:
    return load_target("triton")


def _summary(results: list[CaseResult]) -> dict[str, Any]:
    """Passed or not, with each output's largest normalized error (over sequences, for varlen)."""
    worst: dict[str, float] = {}
    for result in results:
        for name, comparison in result.comparisons.items():
            worst[name] = max(worst.get(name, 0.0), comparison.normalized.quantiles["max"])
    reasons = sorted({result.reason for result in results if result.reason})
    return {"passed": all(result.passed for result in results), "normalized_max": worst, "reasons": reasons}


def _checked(target: LoadedKernel, case: CheckCase, spec: CaseSpec, device: str) -> list[CaseResult]:
    if isinstance(spec, VarlenSpec):
        return check_varlen(target, pack(spec, device), golden_options=golden_options())
    built = make_case(spec, device)
    return [check_case(target, in_layout(built, case.layout), golden_options=golden_options())]


def _outputs(target: LoadedKernel, case: CheckCase, spec: CaseSpec, device: str) -> dict[str, torch.Tensor]:
    if isinstance(spec, VarlenSpec):
        return run_varlen(target, pack(spec, device))
    return run_case(target, in_layout(make_case(spec, device), case.layout))


def warm(case: CheckCase, *, device: str = DEVICE) -> None:
    """Run the kernel on ``case`` in both backward modes, unchecked: compiles the variants :func:`check` needs."""
    for deterministic in (False, True):
        _outputs(kernel(), case, dataclasses.replace(case.spec, deterministic=deterministic), device)


def check(case: CheckCase, *, device: str = DEVICE) -> dict[str, Any]:
    """Both backward modes of ``case`` through the product's check; the deterministic one repeated bit for bit."""
    target = kernel()
    deterministic = dataclasses.replace(case.spec, deterministic=True)
    record: dict[str, Any] = {
        "name": case.name,
        "case": case.spec.to_dict(),
        "layout": case.layout,
        "atomic": _summary(_checked(target, case, case.spec, device)),
        "deterministic": _summary(_checked(target, case, deterministic, device)),
    }
    first, again = (_outputs(target, case, deterministic, device) for _ in range(2))
    record["bitwise_repeat"] = all(torch.equal(first[name], again[name]) for name in ("dq", "dk", "dv"))
    record["passed"] = record["atomic"]["passed"] and record["deterministic"]["passed"] and record["bitwise_repeat"]
    return record


class _CausalAlways:
    """The triton kernel run with ``causal=True`` whatever it is asked: the check's negative control."""

    def __init__(self, target: LoadedKernel):
        self.target = target.target
        self.capabilities = target.capabilities

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1)):
        return self.target.forward(q, k, v, softmax_scale=softmax_scale, causal=True, window_size=window_size)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(-1, -1), deterministic=False):
        return self.target.backward(
            dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=True, window_size=window_size,
            deterministic=deterministic,
        )  # fmt: skip


def negative_control(*, device: str = DEVICE, spec: CaseSpec | None = None) -> dict[str, Any]:
    """The check must fail a wrong answer: a causal output checked as the non-causal ``spec`` (default: the first case)."""
    spec = dataclasses.replace(spec or CHECK_CASES[0].spec, causal=False, window_size=(-1, -1), name="negative-control")
    broken = LoadedKernel("negative-control:causal-always", _CausalAlways(kernel()))
    summary = _summary([check_case(broken, make_case(spec, device))])
    return {"name": "negative-control (causal kernel checked as non-causal)", **summary, "failed_as_it_must": not summary["passed"]}
