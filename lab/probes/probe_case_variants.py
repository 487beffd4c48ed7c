"""Which field of a failing case decides the failure: the case, then each one-field variation of it.

``python3 lab/probes/probe_case_variants.py --kernel NAME --device cuda --case JSON
--vary generator=normal --vary seqlen_q=16 --vary 'window_size=[3,-1]' ...``
checks the case (as ``fa2-verify repro`` does: :func:`verify.check.check_case`
against the golden) and then each variation, which changes one field of it
to the JSON value given (a bare word is a string), all in this process, and prints one Markdown row per case: the
field changed, pass or fail, and per output the worst normalized error and
how many elements are not finite.  A property failure's shrunk case is
minimal for Hypothesis's order; this shows which of its fields the failure
needs, for a report upstream (docs/targets.md records the findings).  An
unsupported variation is a row saying so.
"""

from __future__ import annotations

import argparse
import json
import sys

from fa2_verify.app.targets import resolve_target
from fa2_verify.cli.arguments import parse_case
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.errors import Fa2VerifyError
from fa2_verify.verify.check import check_case


def variations(spec: CaseSpec, vary: list[str]) -> list[tuple[str, CaseSpec]]:
    """``spec`` as given, then one case per ``field=value`` of ``vary`` (a JSON value, else a string)."""
    cases = [("(as given)", spec)]
    for option in vary:
        field, _, text = option.partition("=")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        cases.append((option, parse_case(json.dumps(spec.to_dict() | {field: value}))))
    return cases


def row(label: str, kernel, spec: CaseSpec, device: str) -> str:
    result = check_case(kernel, make_case(spec, device))
    if result.status == "unsupported":
        return f"| {label} | unsupported: {result.reason} | |"
    cells = ", ".join(f"{name} {comparison.normalized.quantiles['max']:.3g} ({comparison.nonfinite} non-finite)"
                      for name, comparison in result.comparisons.items())
    return f"| {label} | {'pass' if result.passed else '**fail**'} | {cells} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--case", required=True, help="the failing case's JSON spec")
    parser.add_argument("--vary", action="append", default=[], metavar="FIELD=VALUE", help="a variation to try (repeatable)")
    args = parser.parse_args()
    try:
        kernel = resolve_target(args.kernel, args.device)
        cases = variations(parse_case(args.case), args.vary)
    except Fa2VerifyError as exc:
        print(f"probe_case_variants.py: error: {exc}", file=sys.stderr)
        return 2
    print("| case | verdict | worst normalized error per output |")
    print("|---|---|---|")
    for label, spec in cases:
        print(row(label, kernel, spec, args.device), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
