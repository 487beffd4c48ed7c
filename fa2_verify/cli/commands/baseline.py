"""``fa2-verify baseline``: record a kernel's baseline on the gate corpus.

Runs every corpus case of the chosen dtypes through the kernel
(:func:`records.baseline.record`), prints one line per (dtype, output, feature)
group and writes the baseline JSON to ``--out``.  ``--repeats N`` runs the
corpus N times and stores the spread of each quantile as its jitter, which the
gate adds to its margin (for kernels whose results vary from run to run, such
as a backward with atomic dQ accumulation).  Exit status: 0 once written, 2 for
bad arguments or an ``--out`` that cannot be written (checked before any case
runs: it exists without ``--overwrite``, is a directory, its parent is not a
writable directory, it is a symlink loop or it is the ``--corpus`` file), and 2 without writing anything when no corpus case ran
(all unsupported, or all errors) or when no case ran of a dtype that
``--dtypes`` names.
"""

from __future__ import annotations

import pathlib

from fa2_verify.app.cases.gate_corpus import load_corpus
from fa2_verify.app.runs import golden_options
from fa2_verify.app.targets import resolve_target
from fa2_verify.cli.arguments import add_corpus_arguments, add_target_arguments, parse_dtypes
from fa2_verify.records import baseline as baselines
from fa2_verify.verify.corpus import Corpus
from fa2_verify.core.errors import UsageError
from fa2_verify.core.outputs import check_outputs


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("baseline", help="record a kernel's baseline on the gate corpus")
    add_target_arguments(parser)
    parser.add_argument("--out", required=True, type=pathlib.Path, metavar="FILE", help="baseline JSON to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="N",
        help="run the corpus N times and record each quantile's spread as jitter (default 1)",
    )
    add_corpus_arguments(parser)
    parser.add_argument("--dtypes", metavar="LIST", help="comma-separated dtypes to cover (default: all in the corpus)")
    parser.set_defaults(handler=handle)


def format_groups(baseline: baselines.Baseline) -> str:
    """One line per group: normalized p50/p99/max and ULP max."""
    lines = [f"{'group':<36} {'cases':>5} {'p50':>9} {'p99':>9} {'max':>9} {'max ULP':>9}"]
    for group in baseline.groups.values():
        normalized, ulp = group.quantiles["normalized"], group.quantiles["ulp"]
        lines.append(
            f"{group.where:<36} {group.cases:>5} {normalized['p50']:>9.3g} {normalized['p99']:>9.3g} "
            f"{normalized['max']:>9.3g} {ulp['max']:>9.3g}"
        )
    return "\n".join(lines)


def handle(args) -> int:
    if args.repeats < 1:
        raise UsageError(f"--repeats={args.repeats} is not valid: use a positive integer")
    check_outputs({"--out": args.out}, overwrite=args.overwrite, inputs={"--corpus": args.corpus})
    kernel = resolve_target(args.kernel, args.device, call_timeout=args.call_timeout)
    corpus = load_corpus(args.corpus)
    baseline = baselines.record(
        kernel,
        corpus,
        device=args.device,
        dtypes=parse_dtypes(args.dtypes),
        repeats=args.repeats,
        golden_options=golden_options(args.golden_cache),
        max_golden_seconds=args.max_golden_seconds,
    )
    print(format_groups(baseline))
    statuses = [case.status for case in baseline.cases.values()]
    print(
        f"{kernel.name} on {baseline.device_name}: corpus version {corpus.version}, {len(statuses)} cases: "
        + ", ".join(f"{statuses.count(s)} {s}" for s in ("passed", "failed", "error", "unsupported"))
    )
    if statuses.count("failed") or statuses.count("error"):
        print("note: the gate flags only new failures; the failing cases above are recorded as they are")
    require_measured(baseline, args, corpus)
    print(f"wrote {baselines.write_baseline(baseline, args.out, overwrite=args.overwrite)}")
    return 0


def require_measured(baseline: baselines.Baseline, args, corpus: Corpus) -> None:
    """Refuse (one line, nothing written) a baseline that measured nothing, or nothing of a dtype that
    ``--dtypes`` asked for: the gate would have nothing to hold the kernel to there.

    Without ``--dtypes`` a dtype the kernel does not run is recorded as unsupported
    (the gate then notices the capability if it appears or disappears); named
    explicitly, it was asked for and not verified.
    """
    measured = {dtype for dtype, _, _ in baseline.groups}
    if not measured:
        raise UsageError(
            f"--kernel={args.kernel} ran none of the {len(baseline.cases)} corpus cases of "
            f"{','.join(baseline.dtypes)} on --device={args.device} ({_reasons(baseline, set(baseline.cases))}): "
            "nothing was verified, no baseline written"
        )
    unmeasured = [dtype for dtype in baseline.dtypes if dtype not in measured]
    if args.dtypes is not None and unmeasured:
        names = {spec.name for spec in corpus.cases if spec.dtype in unmeasured}
        raise UsageError(
            f"--dtypes={args.dtypes}: --kernel={args.kernel} ran no corpus case of {','.join(unmeasured)} on "
            f"--device={args.device} ({_reasons(baseline, names)}): leave it out of --dtypes; no baseline written"
        )


def _reasons(baseline: baselines.Baseline, names: set[str]) -> str:
    """The distinct reasons why the cases ``names`` of ``baseline`` gave no measurement, joined."""
    return "; ".join(sorted({case.reason or case.status for name, case in baseline.cases.items() if name in names}))
