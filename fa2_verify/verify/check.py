"""Run one case through a kernel and compare every output with the golden.

The steps (forward as in Dao 2023, Algorithm 1; backward as in Algorithm 2):

1. Skip, with status ``unsupported`` and the reason, a case the kernel cannot
   run here or does not declare in its capabilities, or one for which it
   raises :class:`~core.errors.UnsupportedCase`.
2. Call ``forward`` and then ``backward`` (with ``case.dout`` and the kernel's
   own ``out`` and ``lse``), each under :func:`verify.poison.poisoned`, so an
   element the kernel never writes reads NaN and fails.
3. Check the contract: output count, shapes, dtypes and device, and that the
   inputs were not modified.  An exception from the kernel or a broken
   contract is status ``error``: a failure of the kernel, with the reason.
4. Compute the golden (forward and backward in one ``golden.compute`` call),
   the first-order bounds (:mod:`verify.error_model`) and, where it fits
   (:func:`verify.lowprec.fits`), the naive low-precision attention for the
   flash-attn ratio (:mod:`verify.lowprec`), and compare each output
   (:func:`verify.metrics.compare`), all on the case's device.

The wall time of the three phases (kernel, golden, comparison) is recorded
in :attr:`results.CaseResult.seconds`.

Anything that goes wrong in steps 4 or in fa2-verify itself is raised, never
recorded as a kernel failure.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

import torch

from fa2_verify import golden as golden_module
from fa2_verify.verify import error_model, lowprec, metrics
from fa2_verify.core.case import Case, CaseSpec, make_case
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.verify.kernel_call import KernelFailure, run_case
from fa2_verify.verify.registry import LoadedKernel
from fa2_verify.verify.results import CaseResult, RunResult, environment

_INTEGER_VIEWS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of ``tensor``'s bit pattern, so NaN inputs compare equal to themselves.

    On the host, so that a GPU case at scale does not hold a second copy of
    its inputs in device memory while the kernel runs.
    """
    return tensor.detach().to("cpu", copy=True).view(_INTEGER_VIEWS[tensor.element_size()])


def _run_kernel(kernel: LoadedKernel, case: Case) -> dict[str, torch.Tensor]:
    """The kernel's outputs (:func:`verify.kernel_call.run_case`); a kernel that writes into its inputs fails."""
    before = {name: _bits(getattr(case, name)) for name in ("q", "k", "v", "dout")}
    outputs = run_case(kernel, case)
    for name, bits in before.items():
        if not torch.equal(_bits(getattr(case, name)), bits):
            raise KernelFailure(f"{kernel.name} modified its input {name} in place")
    return outputs


def golden_for(case: Case, golden_options: Any = None) -> Any:
    """``golden.compute`` of ``case``: the forward, and the backward when the spec has one."""
    spec = case.spec
    options = {} if golden_options is None else {"options": golden_options}
    return golden_module.compute(
        case.q,
        case.k,
        case.v,
        case.dout if spec.backward else None,
        softmax_scale=spec.scale,
        causal=spec.causal,
        window_size=spec.window_size,
        **options,
    )


def check_case(kernel: LoadedKernel, case: Case, *, golden_options: Any = None) -> CaseResult:
    """Run ``case`` through ``kernel`` and compare with the golden (see the module docstring)."""
    spec = case.spec
    device = str(case.q.device)

    def result(status: str, reason: str | None = None, **extra: Any) -> CaseResult:
        return CaseResult(spec=spec, kernel=kernel.name, device=device, status=status, reason=reason, **extra)

    reason = kernel.unavailable_reason(device) or spec.unsupported_reason(kernel.capabilities, device)
    if reason is not None:
        return result("unsupported", reason)
    started = time.perf_counter()
    try:
        actual = _run_kernel(kernel, case)
    except UnsupportedCase as exc:
        return result("unsupported", str(exc))
    except KernelFailure as exc:
        return result("error", str(exc), seconds={"kernel": time.perf_counter() - started})
    seconds = {"kernel": time.perf_counter() - started}

    started = time.perf_counter()
    golden = golden_for(case, golden_options)
    seconds["golden"] = time.perf_counter() - started
    started = time.perf_counter()
    bounds = error_model.first_order_bounds(case, golden)
    naive = lowprec.naive_attention(case) if lowprec.fits(spec) else {}
    comparisons = {
        name: metrics.compare(
            name,
            actual[name],
            getattr(golden, name),
            bounds[name],
            threshold=error_model.THRESHOLDS[name],
            lowprec=naive.get(name),
        )
        for name in actual
    }
    seconds["comparison"] = time.perf_counter() - started
    status = "passed" if all(comparison.passed for comparison in comparisons.values()) else "failed"
    golden_record = {"method": golden.method, "certified_bound": dict(golden.certified_bound)}
    return result(status, comparisons=comparisons, golden=golden_record, seconds=seconds)


def run_cases(
    kernel: LoadedKernel, specs: Iterable[CaseSpec], device: str, *, golden_options: Any = None
) -> RunResult:
    """:func:`check_case` over ``specs`` on ``device``, with the run's config, environment and thresholds."""
    cases = [check_case(kernel, make_case(spec, device), golden_options=golden_options) for spec in specs]
    return RunResult(
        kernel=kernel.name,
        device=device,
        cases=cases,
        config=kernel.config(),
        environment=environment(device),
        thresholds=dict(error_model.THRESHOLDS),
    )
