"""Races that show once in many runs: one case called many times, each output held to its promise.

The determinism properties (:mod:`properties.test_determinism`) repeat a call
1 to 3 times; a race in a kernel's schedule may show once in hundreds.
:func:`race_case` calls the kernel ``1 + repeats`` times on the same inputs
(forward and backward, through :func:`properties.runs.run`: poisoned outputs,
inputs checked unchanged) and holds each output to what it promises
(:func:`promises`, the rules of docs/error-model.md, "Determinism of atomic
dQ"): bitwise identical results (:func:`properties.determinism.bitwise`), or,
for dQ in the default backward, every call within the atomic-dQ spread bound
of the first (:func:`properties.determinism.dq_spread_bound`).  Per output it
counts the distinct results (by content digest), the calls that differ from
the first, the first differing element of the first call that differs, and the
largest spread, against the bound where there is one.  Only the first call's
outputs, the elementwise largest ``|x_r - x_0|`` and the largest ``|x_r|``
are kept, so a thousand calls cost no more memory than two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any

import torch

from fa2_verify.core.case import Case, CaseSpec, make_case
from fa2_verify.core.contract import Capabilities
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.properties import relations
from fa2_verify.properties.determinism import bitwise, dq_spread_bound
from fa2_verify.properties.runs import run
from fa2_verify.verify.check import golden_for
from fa2_verify.verify.kernel_call import KernelFailure, bit_view
from fa2_verify.verify.kernel_config import declared_block_k
from fa2_verify.verify.metrics import encode_float, tensor_path
from fa2_verify.verify.registry import LoadedKernel

#: The promises an output can make over repeated calls on the same inputs.
BITWISE = "bitwise"
ATOMIC_DQ_BOUND = "atomic-dq bound"
NONE = "none"

def promises(capabilities: Capabilities, spec: CaseSpec) -> dict[str, str]:
    """What each output the kernel provides promises over calls on ``spec``'s inputs (docs/error-model.md).

    The forward is bitwise (one writer per output tile); with
    ``deterministic=True`` so are dq, dk and dv; in the default backward dq is
    held to the atomic-dQ bound, and dk, dv are bitwise unless the case is GQA
    and the kernel declares ``gqa_dkv_reproducible=False`` (then nothing is
    promised and only their distinct results are counted).
    """
    promised = {"out": BITWISE, "lse": BITWISE}
    if spec.backward and spec.deterministic:
        promised |= {"dq": BITWISE, "dk": BITWISE, "dv": BITWISE}
    elif spec.backward:
        group = BITWISE if spec.heads_q == spec.heads_kv or capabilities.gqa_dkv_reproducible else NONE
        promised |= {"dq": ATOMIC_DQ_BOUND, "dk": group, "dv": group}
    missing = capabilities.missing_outputs()
    return {name: promise for name, promise in promised.items() if name not in missing}


def _digest(value: torch.Tensor) -> str:
    return hashlib.blake2b(value.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


@dataclasses.dataclass(frozen=True)
class OutputRace:
    """One output over the calls of a case: its promise, what the calls gave, and whether the promise held."""

    output: str
    promise: str
    calls: int
    distinct: int
    differing_calls: int
    first_difference: dict[str, Any] | None
    max_spread: float
    spread_over_bound: float | None
    worst: str | None
    passed: bool

    def describe(self) -> str:
        """One line: the promise, how many distinct results, the first differing element and the spread."""
        line = f"{self.output}: {self.distinct} distinct result(s) in {self.calls} calls"
        if self.first_difference is not None:
            first = self.first_difference
            line += (f", {self.differing_calls} differ from the first; first difference at call {first['call']}: "
                     f"{first['path']} = {first['first']!r} then {first['again']!r}")
        if self.spread_over_bound is not None:
            line += (f"; largest spread {self.max_spread:.3g}, {self.spread_over_bound:.3g} of the atomic-dQ bound"
                     f" (worst {self.worst})")
        verdict = "held" if self.passed else "BROKEN"
        return f"{line}; promise {self.promise}: {verdict}"

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["max_spread"] = encode_float(self.max_spread)
        if self.spread_over_bound is not None:
            record["spread_over_bound"] = encode_float(self.spread_over_bound)
        return record


class _Tally:
    """One output's calls as they come: the first result, digests of the distinct ones, the first call that
    differs and where, the elementwise largest ``|x_r - x_0|`` and largest finite ``|x_r|``."""

    def __init__(self, output: str, promise: str, first: torch.Tensor) -> None:
        self.output, self.promise, self.first = output, promise, first
        self.calls, self.differing = 1, 0
        self.digests = {_digest(first)}
        self.first_difference: dict[str, Any] | None = None
        self.spread = torch.zeros(first.shape, dtype=torch.float64, device=first.device)
        self.largest = self._finite_abs(first)

    @staticmethod
    def _finite_abs(value: torch.Tensor) -> torch.Tensor:
        magnitude = value.detach().to(torch.float64).abs()
        return torch.where(torch.isfinite(magnitude), magnitude, torch.zeros_like(magnitude))

    def add(self, value: torch.Tensor) -> None:
        call = self.calls
        self.calls += 1
        self.largest = torch.maximum(self.largest, self._finite_abs(value))
        differs = bit_view(value) != bit_view(self.first)
        if not bool(differs.any()):
            return
        self.differing += 1
        self.digests.add(_digest(value))
        self.spread = torch.maximum(self.spread, (value.detach().to(torch.float64) - self.first.to(torch.float64)).abs())
        if self.first_difference is None:
            at = int(differs.reshape(-1).to(torch.uint8).argmax())
            index = [int(i) for i in torch.unravel_index(torch.tensor(at), value.shape)]
            self.first_difference = {
                "call": call, "index": index, "path": tensor_path(self.output, index),
                "first": encode_float(float(self.first.reshape(-1)[at])),
                "again": encode_float(float(value.reshape(-1)[at])),
            }
            self.first_comparison = bitwise(self.output, self.first, value)

    def result(self, bound: torch.Tensor | None) -> OutputRace:
        """The output's :class:`OutputRace`; ``bound`` the atomic-dQ bound when that is its promise and some
        call differed from the first."""
        spread_over_bound = 0.0 if self.promise == ATOMIC_DQ_BOUND else None
        worst = None
        passed = self.promise == NONE or self.differing == 0
        if bound is not None:
            # |x_r - x_0| <= bound for every call r  <=>  max_r |x_r - x_0| <= bound: compare the spread with 0
            comparison = relations.compare_runs(self.output, torch.zeros_like(self.spread), self.spread, bound,
                                                threshold=1.0)
            spread_over_bound = comparison.normalized.quantiles["max"]
            worst = comparison.worst["path"] if comparison.worst is not None else None
            passed = comparison.passed
        elif self.first_difference is not None:
            worst = self.first_comparison.worst["path"] if self.first_comparison.worst is not None else None
        return OutputRace(
            output=self.output, promise=self.promise, calls=self.calls, distinct=len(self.digests),
            differing_calls=self.differing, first_difference=self.first_difference,
            max_spread=float(self.spread.max()) if self.spread.numel() else 0.0,
            spread_over_bound=spread_over_bound, worst=worst, passed=passed,
        )


@dataclasses.dataclass(frozen=True)
class CaseRace:
    """One case's race: ``status`` passed, failed (a promise broken), error (the kernel raised or broke the
    contract; ``reason`` says how) or unsupported."""

    spec: CaseSpec
    status: str
    outputs: tuple[OutputRace, ...] = ()
    reason: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.spec.to_dict(), "status": self.status, "reason": self.reason,
            "seconds": self.seconds, "outputs": [output.to_dict() for output in self.outputs],
        }


def _bound(kernel: LoadedKernel, case: Case, golden_options: Any, largest: torch.Tensor) -> torch.Tensor:
    """The atomic-dQ bound of ``case``, its ulp term taken at the largest ``|dq|`` of every call."""
    golden = golden_for(case, golden_options)
    return dq_spread_bound(case, golden, [largest], block_k=declared_block_k(kernel.config()))


def race_case(kernel: LoadedKernel, spec: CaseSpec, device: str, repeats: int, golden_options: Any = None) -> CaseRace:
    """``1 + repeats`` calls of the kernel on ``spec``'s inputs, each output held to its :func:`promises`."""
    started = time.perf_counter()
    reason = kernel.unavailable_reason(device) or spec.unsupported_reason(kernel.capabilities, device)
    if reason is not None:
        return CaseRace(spec, "unsupported", reason=reason)
    promised = promises(kernel.capabilities, spec)
    case = make_case(spec, device)
    try:
        first = run(kernel, case)
        tallies = [_Tally(name, promise, first[name]) for name, promise in promised.items()]
        for _ in range(repeats):
            outputs = run(kernel, case)
            for tally in tallies:
                tally.add(outputs[tally.output])
    except UnsupportedCase as exc:
        return CaseRace(spec, "unsupported", reason=str(exc))
    except KernelFailure as failure:
        return CaseRace(spec, "error", reason=str(failure), seconds=time.perf_counter() - started)
    results = []
    for tally in tallies:
        bound = None
        if tally.promise == ATOMIC_DQ_BOUND and tally.differing:  # no spread: within any bound, no golden needed
            bound = _bound(kernel, case, golden_options, tally.largest)
        results.append(tally.result(bound))
    status = "passed" if all(result.passed for result in results) else "failed"
    return CaseRace(spec, status, tuple(results), seconds=time.perf_counter() - started)
