"""``fa2-verify report``: turn allure-results directories into an HTML report (Allure 3).

``pytest --alluredir allure-results`` writes one Allure result per property
test, with its error histograms and data attached
(:mod:`records.allure_report`); this command runs ``allure generate`` on them.
Several directories are the runner shards of one run (``--fa2-shard I/N``):
they are merged into one set of results first (``--merged-results DIR`` keeps
it), and refused in one line unless they are every shard of one run, each
test in one of them (:mod:`records.allure_merge`).
Allure 3 is the npm package ``allure``: ``npm ci --prefix ci`` installs the
version pinned in ``ci/package.json``.  Exit status: 0 once generated, 2 when
the results are missing or are not every shard of one run, the output exists without ``--overwrite``, is a file
or holds the results or the current directory, Allure 3 is not installed, or
``allure generate`` fails (one line on stderr; an old report is replaced only
by a complete new one, :func:`core.outputs.directory_replacing`).
"""

from __future__ import annotations

import pathlib

from fa2_verify.records.allure_report import generate_html


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("report", help="generate the Allure 3 HTML report from allure-results")
    parser.add_argument(
        "results",
        nargs="*",
        type=pathlib.Path,
        default=[pathlib.Path("allure-results")],
        metavar="RESULTS",
        help="allure-results directory, or one per runner shard of a run to merge (default: allure-results)",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("allure-report"),
        metavar="DIR",
        help="report directory (default: allure-report)",
    )
    parser.add_argument(
        "--merged-results",
        type=pathlib.Path,
        metavar="DIR",
        help="also write the merged Allure results of the RESULTS directories there",
    )
    parser.add_argument("--name", default="fa2-verify", help="report title (default: fa2-verify)")
    parser.add_argument("--allure", metavar="PATH", help="Allure 3 executable (default: ci/node_modules, then PATH)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out directory")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    index = generate_html(args.results, args.out, allure=args.allure, name=args.name, overwrite=args.overwrite,
                          merged_dir=args.merged_results)
    print(f"wrote {index} (serve {args.out} over HTTP to view it, e.g. `python -m http.server -d {args.out}`)")
    return 0
