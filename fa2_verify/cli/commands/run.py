"""``fa2-verify run``: a case set against one kernel, one table, one verdict.

Runs ``--cases fixed`` (the default, :data:`app.cases.fixed.FIXED_CASES`)
or ``--cases scale`` (:data:`app.cases.scale.SCALE_CASES` of the device
type: production lengths on a GPU, the same set scaled down on a CPU), or only
the cases of that set named by ``--case NAME`` (repeatable; the names the
table prints), forward and backward, each case's head dim and sequence
lengths fitted to the kernel's shape constraints and the features it lacks
taken away (:func:`app.cases.fitting.fit_case`; a line per case so changed,
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

import pathlib

import torch

from fa2_verify.app.cases.fitting import fitted_pairs, fitting
from fa2_verify.app.cases.sets import CASE_SETS, case_label, case_set, select_cases
from fa2_verify.app.runs import run_set
from fa2_verify.app.targets import resolve_target
from fa2_verify.cli.arguments import add_sanitize_argument, add_target_arguments
from fa2_verify.cli.tables import failure_descriptions, format_table
from fa2_verify.core.errors import UsageError
from fa2_verify.core.outputs import check_outputs, write_text_atomic
from fa2_verify.verify.interpreter_bounds import require_interpreter
from fa2_verify.records.report_json import build_tolerance_report, collect_environment, write_tolerance_report
from fa2_verify.records.report_markdown import render_tolerance
from fa2_verify.verify.results import CaseResult, RunResult

REPORT_NAME = "tolerance.json"


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


_TIMING_COLUMNS = (("case", "<34"), ("kernel s", ">9"), ("golden s", ">9"), ("compare s", ">9"), ("total s", ">9"))


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
    run = run_set(kernel, specs, args.device, max_golden_seconds=args.max_golden_seconds,
                  bounds_check=args.bounds_check, sanitize_timeout=args.call_timeout if args.sanitize else None)
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
