"""``fa2-verify race``: many calls on race-prone shapes, each output held to what it promises.

Runs ``--cases race-prone`` (the default, :data:`app.cases.race.RACE_CASES`
of the device type, fitted to the kernel as ``run`` fits its sets:
:func:`app.cases.fitting.fit_case`; a case that fitting makes a duplicate of
an earlier one, e.g. a deterministic case on a kernel without a deterministic
backward, runs once), or the case specs of a JSON file (a list of objects, as
a reproduction line prints them; padded cases only), ``1 + --repeats`` calls
each (:func:`properties.race.race_case`).  Prints one row per (case, output):
its promise, the number of distinct results, the calls that differ from the
first, the largest spread and its share of the atomic-dQ bound; then a line
per broken promise naming the output and its first differing element; and
writes the whole as JSON to ``--json-report PATH`` (atomically, checked before
any case runs).  Before each case: ``fa2-verify: running case I of N: NAME``
on stderr.

Exit status: 0 when every case ran and every promise held; 1 when a promise
was broken (bitwise results that differ where the kernel promises them, a dQ
spread above the atomic-dQ bound) or the kernel raised; 2 (one line on
stderr) for bad arguments (``--repeats`` below 1, a bad case file, an output
path that cannot be written), an unknown kernel, a case too large for the
memory free, or when no case is supported (nothing verified).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from fa2_verify.app.cases.fitting import fitted_cases
from fa2_verify.app.cases.race import RACE_CASES
from fa2_verify.app.cases.sets import case_label
from fa2_verify.app.runs import announce
from fa2_verify.app.targets import resolve_target
from fa2_verify.cli.arguments import add_target_arguments
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import UsageError
from fa2_verify.core.user_json import read_json
from fa2_verify.core.varlen import VarlenSpec, spec_from_dict
from fa2_verify.properties.race import CaseRace, race_case
from fa2_verify.verify import device_fault
from fa2_verify.core.outputs import check_outputs, write_text_atomic
from fa2_verify.verify.memory import require_fits

#: ``--cases`` for the bundled set; anything else is a JSON file of case specs.
RACE_PRONE = "race-prone"

#: Calls after the first, by default: a race that shows once in a hundred calls shows here.
DEFAULT_REPEATS = 200

_COLUMNS = (
    ("case", "<34"), ("output", "<6"), ("promise", "<15"), ("distinct", ">8"), ("differ", ">6"),
    ("max spread", ">10"), ("/bound", ">8"), ("verdict", "<"),
)


def repeats(text: str) -> int:
    """``--repeats``: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--repeats={text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--repeats={value}: at least 1 call after the first is needed to compare")
    return value


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "race", help="call a kernel many times on race-prone shapes; bitwise or atomic-dQ spread as promised",
    )
    add_target_arguments(parser)
    parser.add_argument("--repeats", type=repeats, default=DEFAULT_REPEATS, metavar="N",
                        help=f"calls after the first, each compared with it (default {DEFAULT_REPEATS})")
    parser.add_argument("--cases", default=RACE_PRONE, metavar="race-prone|FILE",
                        help="the race-prone set of the device (default) or a JSON file: a list of case specs")
    parser.add_argument("--json-report", type=pathlib.Path, metavar="PATH", help="write the results as JSON")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json-report")
    parser.set_defaults(handler=handle)


def read_cases(path: str) -> tuple[CaseSpec, ...]:
    """The padded case specs of the JSON file ``path`` (a list of objects), or a one-line error."""
    source = f"--cases={path}"
    records = read_json(path, source)
    if not isinstance(records, list) or not records:
        raise UsageError(f"{source}: expected a non-empty JSON list of case specs")
    specs = []
    for number, record in enumerate(records):
        try:
            spec = spec_from_dict(record)
        except UsageError as exc:
            raise UsageError(f"{source}: case {number}: {exc}") from None
        if isinstance(spec, VarlenSpec):
            raise UsageError(f"{source}: case {number} is a packed batch (seqlens); race runs padded cases only")
        specs.append(spec)
    return tuple(specs)


def race_set(args, kernel) -> tuple[CaseSpec, ...]:
    """The cases of ``--cases``: the race-prone set fitted to the kernel, without duplicates, or the file's."""
    if args.cases != RACE_PRONE:
        return read_cases(args.cases)
    fitted = fitted_cases(kernel.capabilities, RACE_CASES[torch.device(args.device).type], args.device)
    unique: dict[str, CaseSpec] = {}
    for spec in fitted:
        unique.setdefault(json.dumps({**spec.to_dict(), "name": None}, sort_keys=True), spec)
    return tuple(unique.values())


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def format_table(races: list[CaseRace]) -> str:
    """One row per (case, output); one row for an unsupported or errored case, with its status."""
    rows = [tuple(name for name, _ in _COLUMNS)]
    for race in races:
        name = case_label(race.spec)
        if not race.outputs:
            rows.append((name, "-", "-", "-", "-", "-", "-", race.status))
        for output in race.outputs:
            rows.append((
                name, output.output, output.promise, str(output.distinct), str(output.differing_calls),
                _cell(output.max_spread), _cell(output.spread_over_bound), "held" if output.passed else "BROKEN",
            ))
    return "\n".join(
        " ".join(f"{cell:{align}}" for cell, (_, align) in zip(row, _COLUMNS)).rstrip() for row in rows
    )


def failures(races: list[CaseRace], kernel: str, device: str) -> list[str]:
    """A description of each broken promise (the output, its first differing element) and each errored case."""
    lines = []
    for race in races:
        reproduce = race.spec.reproduction(kernel, device)
        if race.status == "error":
            lines.append(f"{kernel} on {device}: case {case_label(race.spec)} error: {race.reason}")
        for output in race.outputs:
            if not output.passed:
                lines.append(f"{kernel} on {device}: case {case_label(race.spec)}: {output.describe()}\n"
                             f"  reproduce one call: {reproduce}")
    return lines


def handle(args) -> int:
    check_outputs({"--json-report": args.json_report}, overwrite=args.overwrite,
                  inputs={"--cases": None if args.cases == RACE_PRONE else args.cases})
    kernel = resolve_target(args.kernel, args.device, call_timeout=args.call_timeout)
    specs = race_set(args, kernel)
    for spec in specs:
        require_fits(spec, args.device, max_golden_seconds=args.max_golden_seconds)
    races: list[CaseRace] = []
    for index, spec in enumerate(specs):
        announce(index, len(specs), spec)
        races.append(race_case(kernel, spec, args.device, args.repeats))
        if device_fault.recorded() is not None:
            print(f"fa2-verify: the device faulted in case {case_label(spec)}; the cases after it were not run",
                  flush=True)
            break
    print(format_table(races))
    for description in failures(races, args.kernel, args.device):
        print()
        print(description)
    counts = {status: sum(race.status == status for race in races) for status in ("passed", "failed", "error",
                                                                                   "unsupported")}
    print()
    print(f"{args.kernel} on {args.device}, {1 + args.repeats} calls per case: {counts['passed']} passed, "
          f"{counts['failed']} failed, {counts['error']} errors, {counts['unsupported']} unsupported "
          f"(of {len(specs)} cases)")
    if args.json_report is not None:
        report = {
            "kernel": args.kernel, "device": args.device, "repeats": args.repeats, "cases_from": args.cases,
            "cases": [race.to_dict() for race in races], "counts": counts,
        }
        path = write_text_atomic(args.json_report, json.dumps(report, indent=1, allow_nan=False) + "\n",
                                 overwrite=args.overwrite, flag="--json-report")
        print(f"wrote {path}")
    if counts["failed"] or counts["error"] or len(races) < len(specs):
        return 1
    unsupported = next((race for race in races if race.status == "unsupported"), None)
    if args.cases != RACE_PRONE and unsupported is not None:
        raise UsageError(f"--cases={args.cases}: --kernel={args.kernel} does not support case "
                         f"{case_label(unsupported.spec)} on --device={args.device} ({unsupported.reason}): "
                         "a case of the file was not verified")
    if counts["passed"] == 0:
        raise UsageError(f"--kernel={args.kernel} supports none of the {len(specs)} cases on --device={args.device}: "
                         "nothing was verified")
    return 0
