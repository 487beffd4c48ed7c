"""``fa2-verify repro``: run exactly one case and show its comparison in full.

``--case`` takes the JSON spec that every failure message prints in its
reproduction line (:meth:`core.case.CaseSpec.reproduction`); a spec with
``seqlens`` is a packed batch, run through the varlen entry points with each
sequence compared (:func:`app.runs.check_one`).  Prints the case's
table row(s), every metric's quantiles per output, and the failure
description of each failing output.  Exit status: 0 passed, 1 failed or the
kernel raised, 2 (one line on stderr) for bad arguments, an unsupported case, or a
case larger than the memory free or whose golden and comparison would take
longer than ``--max-golden-seconds`` (:func:`verify.memory.require_fits`,
checked before anything is allocated).
"""

from __future__ import annotations

from fa2_verify.app.runs import check_one
from fa2_verify.app.targets import resolve_target
from fa2_verify.cli.arguments import add_sanitize_argument, add_target_arguments, parse_case
from fa2_verify.cli.tables import failure_descriptions, format_table
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.verify.results import CaseResult


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("repro", help="run one case (a JSON case spec) and show its comparison")
    add_target_arguments(parser)
    parser.add_argument("--case", required=True, metavar="JSON", help="case spec, as printed by a failure")
    add_sanitize_argument(parser)
    parser.set_defaults(handler=handle)


def _details(result: CaseResult) -> list[str]:
    lines = []
    for name, comparison in result.comparisons.items():
        lines.append(f"{name} ({comparison.dtype}, {comparison.numel} elements, threshold {comparison.threshold:g}):")
        for label, distribution in (
            ("normalized", comparison.normalized),
            ("ULP", comparison.ulp),
            ("abs", comparison.abs_err),
            ("rel", comparison.rel_err),
        ):
            quantiles = " ".join(f"{key}={value:.3g}" for key, value in distribution.quantiles.items())
            lines.append(f"  {label:<10} {quantiles}")
        if comparison.worst is not None:
            worst = comparison.worst
            lines.append(
                f"  worst      {worst['path']}: actual={worst['actual']:.6g} expected={worst['expected']:.6g} "
                f"normalized={worst['normalized']:.3g}"
            )
    return lines


def handle(args) -> int:
    kernel = resolve_target(args.kernel, args.device, call_timeout=args.call_timeout)
    spec = parse_case(args.case)
    results = check_one(kernel, spec, args.device, max_golden_seconds=args.max_golden_seconds,
                        sanitize_timeout=args.call_timeout if args.sanitize else None)
    unsupported = next((result for result in results if result.status == "unsupported"), None)
    if unsupported is not None:
        raise UnsupportedCase(
            f"--kernel={args.kernel} does not support this case on --device={args.device}: {unsupported.reason}"
        )
    print(format_table(results))
    for result in results:
        details = _details(result)
        if details:
            print()
            if len(results) > 1:
                print(f"{result.spec.name}:")
            print("\n".join(details))
    for description in failure_descriptions(results):
        print()
        print(description)
    return 0 if all(result.passed for result in results) else 1
