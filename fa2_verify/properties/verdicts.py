"""What every property check shares: running the kernel, the golden and its bounds, scores and failures.

A check takes the :class:`~properties.session.Suite` and a drawn case and
returns when the invariant holds, else raises
:class:`~properties.declaration.PropertyFailure`.  On the way it reports each
output's score (the largest normalized error or difference) to
``hypothesis.target``, so the search climbs toward the worst inputs, and to
:meth:`Suite.observe`, so the run reports the worst case found; it attaches
the one-line reproduction with ``hypothesis.note``.  A kernel that declines a
case at run time (:class:`~core.errors.UnsupportedCase`) has the example
discarded and counted as unsupported.  Failure messages go through
:func:`verify.metrics.describe_failure` (docs/properties.md, "Failure messages").
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import torch
from hypothesis import note, reject, target

from fa2_verify.properties import relations
from fa2_verify.properties.declaration import DeviceLost, DeviceOutOfMemory, KernelError, MaskFailure, PropertyFailure
from fa2_verify.properties.kernel_errors import failure_class, ranges
from fa2_verify.properties.runs import Outputs, run
from fa2_verify.properties.session import Suite
from fa2_verify.verify import device_fault as faults
from fa2_verify.verify import error_model
from fa2_verify.core.case import Case, CaseSpec
from fa2_verify.verify.check import bounds_for, golden_for
from fa2_verify.core.errors import CaseTooLarge, UnsupportedCase
from fa2_verify.verify.kernel_call import KernelFailure, raised_error
from fa2_verify.verify.memory import require_fits
from fa2_verify.verify.metrics import OutputComparison, describe_failure, masked_element
from fa2_verify.verify.results import CaseResult


def score(suite: Suite, label: str, spec: CaseSpec, value: float) -> None:
    """Report one example's score under ``label`` to the run and to ``hypothesis.target``."""
    suite.observe(label, value, spec)
    if math.isfinite(value):
        target(value, label=label)


def introduce(suite: Suite, spec: CaseSpec) -> None:
    """Attach the case's one-line reproduction to the example (printed if it fails), and announce the case
    as the one this process runs (:meth:`Suite.running`: named even if the kernel kills the process).

    A case larger than the memory free, or whose golden and comparison would take longer than
    ``--fa2-max-golden-seconds`` (:func:`verify.memory.require_fits`), is declined before anything
    is allocated, counted as unsupported with the estimate.
    On a CUDA device that has faulted before, the example ends at once
    (:func:`require_working_device`).
    """
    require_working_device(suite)
    require_unblocked(suite, spec)
    suite.running(spec)
    note(f"reproduce: {suite.running_case}")
    try:
        require_fits(spec, suite.device, suite.golden_options, suite.max_golden_seconds)
    except CaseTooLarge as exc:
        declined(suite, str(exc))


def require_unblocked(suite: Suite, spec: CaseSpec) -> None:
    """Discard, before the kernel runs, an example whose shape class ``(head_dim, dtype)`` met a kernel error
    that another test of the run reports (:mod:`properties.kernel_errors`): its examples go elsewhere."""
    if suite.kernel_errors is not None and suite.kernel_errors.blocked(spec) is not None:
        reject()


def declined(suite: Suite, reason: str) -> NoReturn:
    """Discard an example the kernel declined at run time, counting it as unsupported."""
    suite.decline(reason)
    reject()


def device_fault(device: str) -> str | None:
    """The fault a kernel call of this process met (:func:`verify.device_fault.recorded`), else the error a
    CUDA ``device`` raises once a kernel has faulted on it (the context is then lost: every later call
    raises it), or ``None`` while it works; off CUDA, the recorded fault only."""
    recorded = faults.recorded()
    if recorded is not None or torch.device(device).type != "cuda":
        return recorded
    try:
        torch.cuda.synchronize(device)
    except Exception as error:  # noqa: BLE001 - whatever the error, the context can run nothing more
        return str(error).splitlines()[0]
    return None


def require_working_device(suite: Suite) -> None:
    """:class:`DeviceLost` before an example runs on a CUDA device that has faulted (:func:`device_fault`):
    the example cannot run, and it is not the cause."""
    fault = device_fault(suite.device)
    if fault is not None:
        raise DeviceLost(
            f"{suite.device} had faulted before this example ({fault}); the cause is an earlier case of this "
            "process, or of any process sharing the GPU under CUDA MPS, not this one"
        )


def out_of_memory(error: str) -> bool:
    """Whether ``error`` (an exception's text) is a GPU's out-of-memory error, whichever layer raised it:
    PyTorch's caching allocator ("CUDA out of memory. Tried to allocate ..."), the CUDA runtime ("CUDA
    error: out of memory") or a launch through the driver API, as Triton and Inductor launch ("CUDA
    driver error: out of memory", when the driver cannot reserve a kernel's local memory)."""
    return "out of memory" in error


def _gpu_full(suite: Suite, error: str) -> bool:
    """Whether ``error`` is an out-of-memory error (:func:`out_of_memory`) of the suite's CUDA device."""
    return torch.device(suite.device).type == "cuda" and out_of_memory(error)


def _fail_if_out_of_memory(suite: Suite, error: str, ran: str) -> None:
    """:class:`DeviceOutOfMemory` when ``error`` is a CUDA device's out-of-memory error (:func:`out_of_memory`)
    met by the example; ``ran`` names its case.  Nothing otherwise."""
    if not _gpu_full(suite, error):
        return
    free, total = torch.cuda.mem_get_info(suite.device)
    held = torch.cuda.memory_reserved(suite.device)
    raise DeviceOutOfMemory(
        f"{suite.kernel.name} on {suite.device}: the GPU ran out of memory in this case ({error.splitlines()[0]}; "
        f"now {free / 2**30:.1f} of {total / 2**30:.1f} GiB free, {held / 2**30:.1f} GiB held by this process's "
        "allocator); on a GPU shared by several processes this is the run's, not a verdict on the case, so it is "
        f"not shrunk; run it again with the GPU to itself: {ran}"
    )


def harness_out_of_memory(suite: Suite, error: Exception) -> None:
    """:class:`DeviceOutOfMemory` when ``error``, raised by the harness's own work on the GPU (the golden,
    the poisoned allocations, a comparison) rather than by a kernel call, is an out-of-memory error
    (:func:`out_of_memory`), naming the case the example ran (:meth:`Suite.running`); else nothing."""
    _fail_if_out_of_memory(suite, f"{type(error).__name__} outside the kernel's calls: {error}",
                           suite.running_case or "no case was announced yet")  # fmt: skip


def failed_run(suite: Suite, spec: CaseSpec, label: str, reason: str, case: str | None = None) -> NoReturn:
    """Fail the example of a kernel that raised or broke the contract; :class:`DeviceLost` when the call
    ended the CUDA context, :class:`DeviceOutOfMemory` when it found the GPU full (:func:`out_of_memory`),
    so that the case is reported as it is rather than replayed and shrunk.  An exception the kernel raised
    is its distinct error's :class:`KernelError` (:func:`kernel_error`) in the test that reports it, and
    discards the example in any other test (:mod:`properties.kernel_errors`).

    ``case`` names what ran (default: ``spec``'s one-line reproduction; a varlen check passes its batch).
    """
    ran = case if case is not None else spec.reproduction(suite.kernel.name, suite.device)
    fault = device_fault(suite.device)
    error = raised_error(reason, suite.kernel.name) if fault is None and not _gpu_full(suite, reason) else None
    if error is not None and not suite.reports_kernel_error(error, spec, reason[reason.find(suite.kernel.name):], ran):
        reject()  # another test of the run reports this error (properties.kernel_errors)
    suite.observe(label, math.inf, spec)
    if fault is not None:
        raise DeviceLost(
            f"{suite.kernel.name} on {suite.device}: the CUDA context faulted in this case ({fault}), so nothing "
            "after it in this process can run; the case is not shrunk (under CUDA MPS the fault may come from "
            f"another process sharing the GPU); run it again in a new process: {ran}"
        )
    _fail_if_out_of_memory(suite, reason, ran)
    result = CaseResult(spec=spec, kernel=suite.kernel.name, device=suite.device, status="error", reason=reason)
    if error is not None:
        raise kernel_error(suite, spec, error, describe_failure(result))
    raise PropertyFailure(describe_failure(result))


def kernel_error(suite: Suite, spec: CaseSpec, error: tuple[str, str], description: str) -> KernelError:
    """The failure of a kernel whose ``error = (entry, exception type)`` was raised on ``spec``, a case inside
    its declared capabilities: the distinct error's own class (:func:`kernel_errors.failure_class`), worded as
    the mismatch it is, then ``description``."""
    declared = ranges(suite.kernel.capabilities.head_dims_on(suite.device))
    return failure_class(error)(
        f"{suite.kernel.name} declares head_dim {declared} and {spec.dtype} on {suite.device}, but its {error[0]} "
        f"raised {error[1]} at head_dim {spec.head_dim}: a mismatch between its capabilities and what it runs, "
        "reported once per run (each distinct error by the first property that meets it; the others leave its "
        "(head_dim, dtype) alone)\n" + description
    )


def mismatch(result: CaseResult, output: str, context: str = "") -> PropertyFailure:
    """The failure of ``result``'s ``output``, ``context`` (a line saying what was compared) before its
    description: a :class:`MaskFailure` when the worst element lies where the mask hides every key."""
    worst = result.comparisons[output].worst
    masked = worst is not None and masked_element(result.spec, output, worst["index"]) is not None
    return (MaskFailure if masked else PropertyFailure)(context + describe_failure(result, output))


def golden_of(suite: Suite, case: Case) -> Any:
    """``golden.compute`` for ``case`` (forward and, if the case has one, backward)."""
    return golden_for(case, suite.golden_options)


def bounds_of(suite: Suite, case: Case) -> dict[str, torch.Tensor]:
    """First-order bounds for ``case`` (docs/error-model.md), from the golden."""
    return bounds_for(suite.kernel, case, golden_of(suite, case))


def call_kernel(suite: Suite, spec: CaseSpec, label: str, *cases: Case, backward: bool | None = None) -> list[Outputs]:
    """The kernel's outputs on each case; a kernel that raised or broke the contract fails the example."""
    try:
        return [run(suite.kernel, case, backward=backward) for case in cases]
    except UnsupportedCase as exc:
        declined(suite, str(exc))
    except KernelFailure as failure:
        failed_run(suite, spec, label, str(failure))


def compare(output: str, first: torch.Tensor, second: torch.Tensor, tolerance: torch.Tensor) -> OutputComparison:
    """:func:`properties.relations.compare_runs` under the output's threshold."""
    return relations.compare_runs(output, first, second, tolerance, threshold=error_model.THRESHOLDS[output])


def conclude(suite: Suite, spec: CaseSpec, statement: str, comparisons: list[OutputComparison]) -> None:
    """Score each output by its largest normalized difference, then fail on the first broken comparison."""
    scores: dict[str, float] = {}
    for comparison in comparisons:
        scores[comparison.output] = max(scores.get(comparison.output, 0.0), comparison.normalized.quantiles["max"])
    for output, value in scores.items():
        score(suite, output, spec, value)
    broken = next((comparison for comparison in comparisons if not comparison.passed), None)
    if broken is None:
        return
    result = CaseResult(
        spec=spec, kernel=suite.kernel.name, device=suite.device, status="failed", comparisons={broken.output: broken}
    )
    raise mismatch(result, broken.output,
                   f"relation {statement} does not hold for {broken.output} ('expected' is the related run):\n")
