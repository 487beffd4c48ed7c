"""``fa2-verify gate``: fail when a kernel regresses against its baseline on the gate corpus.

Checks first the whole baseline (its JSON Schema and invariants,
:func:`records.baseline.load_baseline`), that it matches this run (kernel,
device and its name, corpus version and digest, schema version, dtype set)
and that it covers every case and group of it (:func:`records.gate.check_compatible`),
and fails closed when it does not; then runs the corpus and compares (:mod:`records.gate`), printing
every regression: which quantile of which (dtype, output, feature) rose and by
how much, which case newly fails, which capability disappeared.  Exit status:
0 no regression, 1 a regression, 2 a missing, corrupt or mismatched baseline
or bad arguments (one line on stderr).
"""

from __future__ import annotations

import pathlib

from fa2_verify.records import baseline as baselines
from fa2_verify.records import gate
from fa2_verify.core.outputs import check_outputs, write_text_atomic
from fa2_verify.app.cases.gate_corpus import load_corpus
from fa2_verify.app.runs import golden_options
from fa2_verify.app.targets import resolve_target
from fa2_verify.cli.arguments import add_corpus_arguments, add_target_arguments, parse_dtypes
from fa2_verify.core.errors import UsageError
from fa2_verify.records.report_markdown import render_gate


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("gate", help="compare a kernel with its baseline on the gate corpus")
    add_target_arguments(parser)
    parser.add_argument("--baseline", required=True, type=pathlib.Path, metavar="FILE", help="baseline JSON")
    add_corpus_arguments(parser)
    parser.add_argument("--dtypes", metavar="LIST", help="comma-separated dtypes; must equal the baseline's set")
    parser.add_argument(
        "--relative-margin",
        type=float,
        default=gate.RELATIVE_MARGIN,
        metavar="R",
        help=f"tolerated relative rise of a quantile (default {gate.RELATIVE_MARGIN})",
    )
    parser.add_argument(
        "--floor",
        action="append",
        default=[],
        metavar="METRIC=VALUE",
        help="absolute floor of the margin per metric (defaults: "
        + ", ".join(f"{m}={v}" for m, v in gate.FLOORS.items())
        + ")",
    )
    parser.add_argument(
        "--output-margin",
        action="append",
        default=[],
        metavar="OUTPUT=R",
        help="relative margin for one output, e.g. dq=0.5 for an atomic-accumulation backward",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        metavar="FILE",
        help="also write this run, in the baseline format (a candidate new baseline)",
    )
    parser.add_argument("--markdown", type=pathlib.Path, metavar="FILE", help="write a Markdown summary of the verdict")
    parser.add_argument("--overwrite", action="store_true", help="replace existing --out/--markdown files")
    parser.set_defaults(handler=handle)


def _pairs(items: list[str], flag: str, example: str) -> dict[str, float]:
    pairs = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is None or not name.strip():
            raise UsageError(f"{flag} {item!r} is not NAME=NUMBER: pass e.g. {flag} {example}")
        pairs[name.strip()] = number
    return pairs


def margins(args) -> gate.Margins:
    return gate.Margins(
        relative=args.relative_margin,
        floors={**gate.FLOORS, **_pairs(args.floor, "--floor", "normalized=0.02")},
        outputs=_pairs(args.output_margin, "--output-margin", "dq=0.5"),
    )


def handle(args) -> int:
    chosen_margins = margins(args)
    check_outputs(
        {"--out": args.out, "--markdown": args.markdown},
        overwrite=args.overwrite,
        inputs={"--baseline": args.baseline, "--corpus": args.corpus},
    )
    baseline = baselines.load_baseline(args.baseline)
    corpus = load_corpus(args.corpus)
    dtypes = parse_dtypes(args.dtypes) or tuple(sorted(baseline.dtypes))
    kernel = resolve_target(args.kernel, args.device, call_timeout=args.call_timeout)
    gate.check_compatible(
        baseline, kernel=args.kernel, device=args.device, corpus=corpus, dtypes=dtypes, source=str(args.baseline)
    )
    current = baselines.record(kernel, corpus, device=args.device, dtypes=dtypes, golden_options=golden_options(args.golden_cache),
                               max_golden_seconds=args.max_golden_seconds)
    result = gate.compare(baseline, current, chosen_margins)
    print(gate.format_result(result, source=str(args.baseline)))
    if args.out is not None:
        print(f"wrote {baselines.write_baseline(current, args.out, overwrite=args.overwrite)}")
    if args.markdown is not None:
        written = write_text_atomic(args.markdown, render_gate(result), overwrite=args.overwrite, flag="--markdown")
        print(f"wrote {written}")
    return 0 if result.passed else 1
