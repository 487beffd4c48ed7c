"""``fa2-verify run``: a case set against one kernel, one table, one verdict.

Runs ``--cases fixed`` (the default, :data:`verify.fixed_cases.FIXED_CASES`)
or ``--cases scale`` (:data:`verify.scale_cases.SCALE_CASES` of the device
type: production lengths on a GPU, the same set scaled down on a CPU), or only
the cases of that set named by ``--case NAME`` (repeatable; the names the
table prints), forward and backward, each case's head dim and sequence
lengths fitted to the kernel's shape constraints and the features it lacks
taken away (:func:`verify.fixed_cases.fit_case`; a line per case so changed,
under ``fitted to the kernel:``, says what changed), through the kernel on ``--device``, compares every output with the golden
(:func:`verify.check.check_case`), prints one table (case, output, dtype,
p50/p99/max normalized error, max ULP, flash-attn ratio, verdict), a failure
description for each failing output, the seconds each case spent in the
kernel, the golden and the comparison, the case set it ran, and writes
``DIR/tolerance.json`` (:mod:`records.report_json`) when ``--report DIR`` is
given.  Before each case it writes ``fa2-verify: running case I of N: NAME``
to stderr, so a kernel that kills the process (a segfault, an abort) leaves
the case it was on as the last line, to re-run alone with ``--case NAME``.
With ``--bounds-check`` (and ``TRITON_INTERPRET=1``) every Triton kernel the
interpreter runs is bounds-checked (:mod:`verify.interpreter_bounds`): an
access outside its tensor arguments makes the case an error.

Exit status: 0 when every supported case passed, 1 when a case failed or the
kernel raised (anything, ``SystemExit`` included), 2 (one line on stderr) for
bad arguments, an unknown kernel or one whose hooks raise, a missing device,
a ``--case`` that names no case of the set (the message lists the names), an
output path that cannot be written (checked before any case runs: an
existing report without ``--overwrite``, a directory, a parent that is not a
writable directory), when no case of the set is supported (nothing
verified), when a case named by ``--case`` is unsupported (it was asked
for and not verified; without ``--case`` an unsupported case is a row of
the table, never a pass), or when a case is too large for the memory free or
its estimated golden and comparison time exceeds ``--max-golden-seconds``
(:func:`verify.memory.require_fits`, checked before any case runs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import sys

import torch

from fa2_verify.core.outputs import check_outputs, write_text_atomic
from fa2_verify.verify.check import run_cases
from fa2_verify.core.errors import DeviceUnavailable, UsageError
from fa2_verify.verify.fixed_cases import FIXED_CASES, fitted_pairs, fitting
from fa2_verify.verify.golden_time import DEFAULT_MAX_SECONDS, positive_seconds
from fa2_verify.verify.interpreter_bounds import bounds_checked, require_interpreter
from fa2_verify.verify.sanitizer import sanitized
from fa2_verify.verify.scale_cases import SCALE_CASES
from fa2_verify.verify.watchdog import DEFAULT_CALL_TIMEOUT, set_call_timeout
from fa2_verify.verify.metrics import describe_failure
from fa2_verify.verify.registry import LoadedKernel, load_kernel, require_device
from fa2_verify.records.report_json import build_tolerance_report, collect_environment, write_tolerance_report
from fa2_verify.records.report_markdown import render_tolerance
from fa2_verify.verify.results import CaseResult, RunResult
from fa2_verify.core.case import CaseSpec

REPORT_NAME = "tolerance.json"

#: The case sets ``--cases`` chooses from.
CASE_SETS = ("fixed", "scale")

_COLUMNS = (
    ("case", "<30"), ("output", "<6"), ("dtype", "<8"), ("p50", ">9"), ("p99", ">9"), ("max", ">9"),
    ("max ULP", ">9"), ("fa ratio", ">9"), ("verdict", "<"),
)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("run", help="verify a kernel on a case set (fixed or scale) against the golden")
    add_target_arguments(parser)
    parser.add_argument(
        "--cases", choices=CASE_SETS, default="fixed",
        help="fixed: small shapes, every feature (default); scale: production lengths on cuda, scaled down on cpu",
    )
    parser.add_argument(
        "--case", action="append", dest="case_names", metavar="NAME",
        help="run only this case of the set, by the name the table prints (repeatable)",
    )
    parser.add_argument("--report", type=pathlib.Path, metavar="DIR", help=f"write DIR/{REPORT_NAME}")
    parser.add_argument("--markdown", type=pathlib.Path, metavar="FILE",
                        help="write a Markdown summary, e.g. for a CI job summary ($GITHUB_STEP_SUMMARY)")
    parser.add_argument("--overwrite", action="store_true", help=f"replace an existing DIR/{REPORT_NAME} or --markdown")
    parser.add_argument(
        "--bounds-check", action="store_true",
        help="with TRITON_INTERPRET=1: a Triton kernel that touches memory outside its tensor arguments fails the case",
    )
    add_sanitize_argument(parser)
    parser.set_defaults(handler=handle)


def add_sanitize_argument(parser) -> None:
    """``--sanitize`` (``run``, ``repro``): :mod:`verify.sanitizer`."""
    parser.add_argument(
        "--sanitize", action="store_true",
        help="run a case that faults the device again under compute-sanitizer memcheck and name its first error",
    )


_TIMING_COLUMNS = (("case", "<34"), ("kernel s", ">9"), ("golden s", ">9"), ("compare s", ">9"), ("total s", ">9"))


def case_set(name: str, device: str) -> tuple[CaseSpec, ...]:
    """The specs of ``--cases name`` on ``device``: the fixed set, or the scale set of its device type."""
    if name == "fixed":
        return FIXED_CASES
    return SCALE_CASES[torch.device(device).type]


def case_label(spec: CaseSpec) -> str:
    """The name a case goes by in the tables and in ``--case``: its own, else its feature label."""
    return spec.name or spec.feature()


def select_cases(specs: tuple[CaseSpec, ...], names: list[str] | None, set_name: str) -> tuple[CaseSpec, ...]:
    """The cases of ``specs`` named in ``names`` (``--case``), in the set's order; all of them without names."""
    if not names:
        return specs
    labels = [case_label(spec) for spec in specs]
    unknown = next((name for name in names if name not in labels), None)
    if unknown is not None:
        raise UsageError(f"--case={unknown} is not a case of the {set_name} set: use one of {', '.join(labels)}")
    return tuple(spec for spec, label in zip(specs, labels) if label in names)


def announce(index: int, total: int, spec: CaseSpec) -> None:
    """``fa2-verify: running case I of N: NAME`` on stderr, flushed before the case runs."""
    print(f"fa2-verify: running case {index + 1} of {total}: {case_label(spec)}", file=sys.stderr, flush=True)


def format_timing(cases: list[CaseResult]) -> str:
    """Wall seconds per case spent in the kernel, the golden and the comparison (:attr:`CaseResult.seconds`)."""
    rows = [tuple(name for name, _ in _TIMING_COLUMNS)]
    for case in cases:
        phases = [case.seconds.get(phase) for phase in ("kernel", "golden", "comparison")]
        total = sum(value for value in phases if value is not None) if case.seconds else None
        rows.append((case_label(case.spec), *(_seconds(value) for value in (*phases, total))))
    return "\n".join(
        " ".join(f"{cell:{align}}" for cell, (_, align) in zip(row, _TIMING_COLUMNS)).rstrip() for row in rows
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def add_target_arguments(parser) -> None:
    """``--kernel``, ``--device``, ``--max-golden-seconds`` and ``--call-timeout``, shared by every command
    that runs cases (``run``, ``repro``, ``baseline``, ``gate``)."""
    parser.add_argument("--kernel", required=True, metavar="NAME", help="bundled short name or module:attr")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument(
        "--max-golden-seconds", type=positive_seconds, default=DEFAULT_MAX_SECONDS, metavar="S",
        help="refuse, before any case runs, a case whose golden and comparison are estimated to take longer "
        f"(default {DEFAULT_MAX_SECONDS:g})",
    )
    parser.add_argument(
        "--call-timeout", type=positive_seconds, default=DEFAULT_CALL_TIMEOUT, metavar="SECONDS",
        help="end the command (status 1, naming the call and its case) when one kernel call runs longer, "
        f"as a hung GPU kernel does (default {DEFAULT_CALL_TIMEOUT:g})",
    )



def resolve_target(kernel_name: str, device: str, *, call_timeout: float = DEFAULT_CALL_TIMEOUT) -> LoadedKernel:
    """Load the kernel and check that it and ``device`` can run here (else a one-line error); each of its
    calls may then run ``call_timeout`` seconds (:mod:`verify.watchdog`).

    Its hooks are called here, before any case runs, so one that raises is a
    one-line :class:`~core.errors.KernelLoadError` at once.
    """
    set_call_timeout(call_timeout)
    kernel = load_kernel(kernel_name)
    kernel.config()
    try:
        torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device={device!r} is not a device: use cpu or cuda") from None
    require_device(device)
    reason = kernel.unavailable_reason(device)
    if reason is not None:
        raise DeviceUnavailable(f"--kernel={kernel_name} cannot run on --device={device}: {reason}")
    return kernel


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def format_table(cases: list[CaseResult]) -> str:
    """One row per (case, output), an output the kernel does not provide included (with the reason);
    one row for an unsupported or errored case, with its reason."""
    rows = [tuple(name for name, _ in _COLUMNS)]
    for case in cases:
        name = case_label(case.spec)
        if not case.comparisons:
            rows.append((name, "-", case.spec.dtype, "-", "-", "-", "-", "-", f"{case.status}: {case.reason}"))
            continue
        for output, comparison in case.comparisons.items():
            quantiles = comparison.normalized.quantiles
            rows.append((
                name,
                output,
                comparison.dtype,
                _number(quantiles["p50"]),
                _number(quantiles["p99"]),
                _number(quantiles["max"]),
                _number(comparison.ulp.quantiles["max"]),
                _number(comparison.flash_ratio),
                "passed" if comparison.passed else f"FAILED ({comparison.mismatches}/{comparison.numel})",
            ))
        for output, reason in case.skipped_outputs.items():
            rows.append((name, output, case.spec.dtype, "-", "-", "-", "-", "-", f"unsupported: {reason}"))
    return "\n".join(
        " ".join(f"{cell:{align}}" for cell, (_, align) in zip(row, _COLUMNS)).rstrip() for row in rows
    )


def failure_descriptions(cases: list[CaseResult]) -> list[str]:
    """:func:`verify.metrics.describe_failure` for every failing output and every errored case."""
    descriptions = []
    for case in cases:
        if case.status == "error":
            descriptions.append(describe_failure(case))
        descriptions.extend(describe_failure(case, output) for output in case.failed_outputs())
    return descriptions


def summary(run: RunResult) -> str:
    counts = run.counts()
    line = (
        f"{run.kernel} on {run.device}: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['error']} errors, {counts['unsupported']} unsupported (of {len(run.cases)} results)"
    )
    failing = sorted({output for case in run.cases for output in case.failed_outputs()})
    if failing:
        line += f"; failing outputs: {', '.join(failing)}"
    return line


def handle(args) -> int:
    report = args.report / REPORT_NAME if args.report is not None else None
    check_outputs({"--report": report, "--markdown": args.markdown}, overwrite=args.overwrite)
    if args.bounds_check:
        require_interpreter("--bounds-check")
    kernel = resolve_target(args.kernel, args.device, call_timeout=args.call_timeout)
    whole_set = case_set(args.cases, args.device)
    pairs = fitted_pairs(kernel.capabilities, select_cases(whole_set, args.case_names, args.cases), args.device)
    specs = tuple(fitted for _, fitted in pairs)
    with bounds_checked() if args.bounds_check else contextlib.nullcontext():
        run = run_cases(kernel, specs, args.device, starting=lambda index, spec: announce(index, len(specs), spec),
                        max_golden_seconds=args.max_golden_seconds)
    if args.sanitize:
        run = dataclasses.replace(run, cases=sanitized(run.cases, args.kernel, args.device, timeout=args.call_timeout))
    print(format_table(run.cases))
    changes = [f"  {case_label(fitted)}: {fitting(original, fitted)}" for original, fitted in pairs if original != fitted]
    if changes:
        print("fitted to the kernel:", *changes, sep="\n")
    for description in failure_descriptions(run.cases):
        print()
        print(description)
    print()
    print(format_timing(run.cases))
    print()
    chosen_by = f", chosen by --case from {len(whole_set)}" if args.case_names else ""
    print(f"case set: {args.cases} ({torch.device(args.device).type}, {len(specs)} cases{chosen_by})")
    print(summary(run))
    environment = collect_environment(kernel, args.device)
    if report is not None:
        print(f"wrote {write_tolerance_report(report, run, environment=environment, overwrite=args.overwrite)}")
    if args.markdown is not None:
        markdown = render_tolerance(build_tolerance_report(run, environment=environment))
        print(f"wrote {write_text_atomic(args.markdown, markdown, overwrite=args.overwrite, flag='--markdown')}")
    counts = run.counts()
    if counts["failed"] or counts["error"]:
        return 1
    if counts["passed"] == 0:
        raise UsageError(
            f"--kernel={args.kernel} supports none of the {len(run.cases)} {args.cases} cases on --device={args.device}: "
            "nothing was verified"
        )
    unsupported = next((case for case in run.cases if case.status == "unsupported"), None)
    if args.case_names and unsupported is not None:
        raise UsageError(
            f"--case={case_label(unsupported.spec)}: --kernel={args.kernel} does not support it on "
            f"--device={args.device} ({unsupported.reason}): a case named by --case was not verified"
        )
    return 0
