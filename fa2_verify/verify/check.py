"""Run one case through a kernel and compare every output with the golden.

The steps (forward as in Dao 2023, Algorithm 1; backward as in Algorithm 2):

1. Skip, with status ``unsupported`` and the reason, a case the kernel cannot
   run here or does not declare in its capabilities, or one for which it
   raises :class:`~core.errors.UnsupportedCase`.
2. Call ``forward`` and then ``backward`` (with ``case.dout`` and copies of
   the kernel's own ``out`` and ``lse``) through
   :func:`verify.kernel_call.run_case`, each under
   :func:`verify.poison.poisoned`, so an element the kernel never writes reads
   NaN and fails.
3. Check the contract after each call: output count, shapes, dtypes and
   device, and that no input (``out`` and ``lse`` included) was modified.
   Anything the kernel raises, ``SystemExit`` included, or a broken contract
   is status ``error``: a failure of the kernel, with the reason.
4. Compute the golden (forward and backward in one ``golden.compute`` call),
   the first-order bounds (:mod:`verify.error_model`) and, where it fits
   (:func:`verify.lowprec.fits`), the naive low-precision attention for the
   flash-attn ratio (:mod:`verify.lowprec`), and compare each output
   (:func:`verify.metrics.compare`), all on the case's device.  An output the
   kernel declares it does not provide (``Capabilities(lse=False)``) is
   recorded in ``skipped_outputs`` with the reason, never compared.

The wall time of the three phases (kernel, golden, comparison) is recorded
in :attr:`results.CaseResult.seconds`.

Anything that goes wrong in steps 4 or in fa2-verify itself is raised, never
recorded as a kernel failure.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable

import torch

from fa2_verify import golden as golden_module
from fa2_verify.verify import continuation, error_model, lowprec, memory, metrics, model_kernel, noise_verdicts
from fa2_verify.core.case import Case, CaseSpec, make_case
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.core.varlen import Packed, VarlenSpec, pack
from fa2_verify.verify.kernel_call import KernelFailure, run_case, run_varlen
from fa2_verify.verify.registry import LoadedKernel
from fa2_verify.verify.results import CaseResult, RunResult, environment


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
        alignment=spec.causal_alignment,
        **options,
    )


def partial_sums_of(kernel: LoadedKernel, case: Case) -> error_model.PartialSums:
    """The partial sums ``kernel`` declares in ``config()`` for ``case``'s device and seqlen_q (eqs. 2b, 7b to 9b)."""
    return error_model.PartialSums.of(kernel.config(), case.q.device, case.spec.seqlen_q)


def bounds_for(kernel: LoadedKernel, case: Case, golden: Any) -> dict[str, torch.Tensor]:
    """The error model's per-element bounds for ``kernel`` on ``case`` (docs/error-model.md), with the partial
    sums the kernel declares (:func:`partial_sums_of`)."""
    return error_model.first_order_bounds(case, golden, partial_sums_of(kernel, case))


@dataclasses.dataclass
class OutputJudge:
    """What every output of one case is judged against: the golden, the error model's bounds (with the partial
    sums the kernel declares), the naive low-precision attention for the flash-attn ratio, and for a 16-bit case
    the model kernel (:mod:`verify.model_kernel`) whose backward starts from ``forward`` (the kernel's ``out``
    and ``lse``), with the outputs it judges (:func:`verify.noise_verdicts.judged_outputs`).  Built once, it judges any outputs of the case (:meth:`compare`)."""

    kernel: LoadedKernel
    case: Case
    golden: Any
    forward: dict[str, torch.Tensor]

    def __post_init__(self) -> None:
        partials = partial_sums_of(self.kernel, self.case)
        self.judged = noise_verdicts.judged_outputs(self.case.spec, partials)
        flush_shares = bool(self.judged) and noise_verdicts.flush_matters(self.case.spec.torch_dtype)
        self.bounds, self.flush_shares = error_model.bounds_and_flush_shares(self.case, self.golden, partials,
                                                                             flush_shares=flush_shares)
        self.naive = lowprec.naive_attention(self.case)
        self.model = model_kernel.model_attention(self.case, self.forward) if self.judged else {}

    def compare(self, actual: dict[str, torch.Tensor]) -> dict[str, metrics.OutputComparison]:
        """Each of ``actual`` under every verdict: the worst-case one (:func:`metrics.compare`, the
        flash-attn ratio beside it), and where they apply the statistical, local and bias ones
        (:func:`verify.noise_verdicts.judge`).  An output passes when every verdict does."""
        comparisons = {}
        for name, tensor in actual.items():
            expected = getattr(self.golden, name)
            comparison = metrics.compare(name, tensor, expected, self.bounds[name],
                                         threshold=error_model.THRESHOLDS[name], lowprec=self.naive.get(name))
            if name in self.judged:
                records = noise_verdicts.judge(self.case.spec, name, tensor, expected, self.bounds[name], self.model,
                                               self.flush_shares.get(name))
                comparison = dataclasses.replace(comparison, statistical=records["statistical"],
                                                 local=records["local"], bias=records["bias"])
                comparison = dataclasses.replace(comparison, passed=not comparison.failed_verdicts)
            comparisons[name] = comparison
        return comparisons


def compare_outputs(kernel: LoadedKernel, case: Case, actual: dict[str, torch.Tensor],
                    golden: Any) -> dict[str, metrics.OutputComparison]:
    """Each of ``actual`` (the kernel's outputs of ``case``) against ``golden`` (:class:`OutputJudge`)."""
    return OutputJudge(kernel, case, golden, actual).compare(actual)


def _compared(
    kernel: LoadedKernel, case: Case, actual: dict[str, torch.Tensor], golden_options: Any, seconds: dict[str, float]
) -> CaseResult:
    """Step 4 of the module docstring: ``actual`` (the kernel's outputs of ``case``) against the golden.

    ``seconds`` holds the kernel's time; the golden's and the comparison's are added to it.
    """
    spec = case.spec
    started = time.perf_counter()
    golden = golden_for(case, golden_options)
    seconds["golden"] = time.perf_counter() - started
    started = time.perf_counter()
    comparisons = compare_outputs(kernel, case, actual, golden)
    seconds["comparison"] = time.perf_counter() - started
    status = "passed" if all(comparison.passed for comparison in comparisons.values()) else "failed"
    golden_record = {"method": golden.method, "certified_bound": dict(golden.certified_bound)}
    return CaseResult(
        spec=case.spec,
        kernel=kernel.name,
        device=str(case.q.device),
        status=status,
        comparisons=comparisons,
        golden=golden_record,
        seconds=seconds,
        skipped_outputs=kernel.capabilities.missing_outputs(),
    )


def _run_or_decline(
    kernel: LoadedKernel, spec: CaseSpec, device: str, run: Callable[[], dict[str, torch.Tensor]], seconds: dict
) -> tuple[dict[str, torch.Tensor] | None, str, str]:
    """Steps 1 to 3 of the module docstring: ``(outputs, "", "")``, or ``(None, status, reason)``.

    The kernel's wall time (calls and contract checks) goes into ``seconds["kernel"]``.
    """
    reason = kernel.unavailable_reason(device) or spec.unsupported_reason(kernel.capabilities, device)
    if reason is not None:
        return None, "unsupported", reason
    started = time.perf_counter()
    try:
        return run(), "", ""
    except UnsupportedCase as exc:
        return None, "unsupported", str(exc)
    except KernelFailure as exc:
        return None, "error", str(exc)
    finally:
        seconds["kernel"] = time.perf_counter() - started


def check_case(kernel: LoadedKernel, case: Case, *, golden_options: Any = None) -> CaseResult:
    """Run ``case`` through ``kernel`` and compare with the golden (see the module docstring)."""
    device = str(case.q.device)
    seconds: dict[str, float] = {}
    actual, status, reason = _run_or_decline(kernel, case.spec, device, lambda: run_case(kernel, case), seconds)
    if actual is None:
        return CaseResult(spec=case.spec, kernel=kernel.name, device=device, status=status, reason=reason,
                          seconds=seconds)
    return _compared(kernel, case, actual, golden_options, seconds)


def check_varlen(kernel: LoadedKernel, packed: Packed, *, golden_options: Any = None) -> list[CaseResult]:
    """A packed batch through the varlen entry points; each sequence compared with its own golden.

    One result per sequence (spec :meth:`core.varlen.VarlenSpec.sequence`), in
    order.  An unsupported batch, or a kernel that raised or broke the contract,
    gives every sequence that status and reason (steps 1 to 3 of the module
    docstring); otherwise each sequence's rows of the packed outputs are
    compared as :func:`check_case` compares a case (step 4).  The kernel's
    seconds (one call for the whole batch) are the first sequence's: summed
    over the sequences, each phase counts once.
    """
    device = str(packed.q.device)
    seconds: dict[str, float] = {}
    actual, status, reason = _run_or_decline(kernel, packed.spec, device, lambda: run_varlen(kernel, packed), seconds)
    if actual is None:
        return [
            CaseResult(spec=case.spec, kernel=kernel.name, device=device, status=status, reason=reason)
            for case in packed.cases
        ]
    results = []
    for index, case in enumerate(packed.cases):
        rows_q, rows_k = packed.rows(index)
        packed_rows: dict[str, slice | tuple[slice, slice]] = {
            "out": rows_q, "lse": (slice(None), rows_q), "dq": rows_q, "dk": rows_k, "dv": rows_k
        }
        sequence = {name: tensor[packed_rows[name]].unsqueeze(0) for name, tensor in actual.items()}
        phases = dict(seconds) if index == 0 else {}
        results.append(dataclasses.replace(_compared(kernel, case, sequence, golden_options, phases), packed=packed.spec))
    return results


def check_spec(kernel: LoadedKernel, spec: CaseSpec, device: str, *, golden_options: Any = None) -> list[CaseResult]:
    """The results of one case spec: one for a case, and for a packed batch (:class:`core.varlen.VarlenSpec`)
    one per sequence (named ``<batch name>/<index>``), or one for the whole batch when it did not run (it is
    unsupported, or the kernel raised: every sequence would carry the same reason)."""
    if not isinstance(spec, VarlenSpec):
        return [check_case(kernel, make_case(spec, device), golden_options=golden_options)]
    results = check_varlen(kernel, pack(spec, device), golden_options=golden_options)
    if results and results[0].packed is None:  # declined before any sequence was compared
        return [dataclasses.replace(results[0], spec=spec)]
    label = spec.name or spec.feature()
    return [dataclasses.replace(result, spec=dataclasses.replace(result.spec, name=f"{label}/{index}"))
            for index, result in enumerate(results)]


def run_cases(
    kernel: LoadedKernel,
    specs: Iterable[CaseSpec],
    device: str,
    *,
    golden_options: Any = None,
    starting: Callable[[int, CaseSpec], None] | None = None,
    max_golden_seconds: float | None = None,
) -> RunResult:
    """:func:`check_spec` over ``specs`` on ``device``, with the run's config, environment and thresholds.

    Every spec is first checked to fit in memory and in ``max_golden_seconds`` of golden and
    comparison (:func:`verify.memory.require_fits`), so a case too large is refused before any
    case runs.  ``starting(index, spec)``, if given, is called before each case is built: a
    process that dies in the kernel has then said which case it was on.  Each case goes through
    :func:`verify.continuation.case_results`: in a command, a case that faults the device ends the
    loop with :class:`~verify.continuation.DeviceFaulted`, and a fresh process runs the rest
    (taking the cases done from the journal, without running or announcing them again).
    """
    specs = tuple(specs)
    for spec in specs:
        memory.require_fits(spec, device, golden_options, max_golden_seconds)
    cases = []
    for index, spec in enumerate(specs):

        def checked(index: int = index, spec: CaseSpec = spec) -> list[CaseResult]:
            if starting is not None:
                starting(index, spec)
            return check_spec(kernel, spec, device, golden_options=golden_options)

        cases.extend(continuation.case_results(spec, spec.name or spec.feature(), checked))
    return RunResult(
        kernel=kernel.name,
        device=device,
        cases=cases,
        config=kernel.config(),
        environment=environment(device),
        thresholds=dict(error_model.THRESHOLDS),
    )
