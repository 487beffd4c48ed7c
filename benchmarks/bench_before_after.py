"""The kernel benchmark for two copies of the triton kernel, each against PyTorch's FA2, in one session.

    python benchmarks/bench_before_after.py --before DIR [--repeats 3] [--seqlens 1024,2048,...]
        [--modes fwd,fwd+bwd] [--out DIR]

``--before DIR`` is a package root holding another copy of ``fa2_verify``
(e.g. ``git archive main fa2_verify | tar -x -C DIR``); the other side is
this working tree.  Two copies of one package cannot share a process, so each
side is a process of its own (:mod:`benchmarks.bench_side`, its package root
first on ``PYTHONPATH``) that times rows with its own copy of
:func:`fa2_verify.bench.timing.bench_row`: triton and PyTorch's FA2 (SDPA's
flash backend) in that process on the same inputs, CUDA-event medians.  The
rows are the working tree's ``BENCH_ROWS`` (the same list for both sides);
the sides take turns row by row, the first of each pair alternating, and the
whole list runs ``--repeats`` times, so drift of the GPU's clocks reaches
both sides alike.  Each side's ratio per row (PyTorch FA2's time over
triton's) is the median over the repeats.

Printed: per row the ratio before and after, the geometric means per mode,
the lowest row, and whether the after side meets the kernel-speed targets
(:data:`TARGETS`: forward geometric mean >= 1.30, forward+backward >= 1.16,
no row below 0.8).  Exit status 0 when it does, 1 when not, 2 on bad input
or without CUDA (one line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys

if __package__ in (None, ""):  # run as a script: the repository root, so that fa2_verify and benchmarks import
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from fa2_verify.bench.timing import BENCH_ROWS, BenchRow  # noqa: E402
from fa2_verify.core.errors import DeviceUnavailable, Fa2VerifyError, UsageError  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
SIDE = pathlib.Path(__file__).resolve().parent / "bench_side.py"
SIDES = ("before", "after")
MODES = ("fwd", "fwd+bwd")
#: Geometric-mean ratio to PyTorch's FA2 each mode must reach (issue 14), and the floor of every row.
TARGETS = {"fwd": 1.30, "fwd+bwd": 1.16}
ROW_FLOOR = 0.8


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_before_after.py", description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="package root holding the fa2_verify to compare against")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the rows (default 3)")
    parser.add_argument("--seqlens", default=None, help="comma-separated seqlens (default: every benchmark seqlen)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, from fwd,fwd+bwd (default both)")
    parser.add_argument("--out", default=None, help="directory for before-after.md and before-after.json")
    args = parser.parse_args(argv)
    root = pathlib.Path(args.before).resolve()
    if not (root / "fa2_verify" / "__init__.py").is_file():
        raise UsageError(f"--before={args.before}: holds no fa2_verify package")
    args.before = root
    args.modes = tuple(mode for mode in args.modes.split(",") if mode)
    if not args.modes or set(args.modes) - set(MODES):
        raise UsageError(f"--modes={','.join(args.modes)}: use fwd, fwd+bwd or both")
    if args.repeats < 1:
        raise UsageError(f"--repeats={args.repeats}: use 1 or more")
    try:
        args.seqlens = None if args.seqlens is None else {int(s) for s in args.seqlens.split(",") if s}
    except ValueError:
        raise UsageError(f"--seqlens={args.seqlens}: use comma-separated integers") from None
    return args


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise DeviceUnavailable("no CUDA device: the kernel benchmark times triton against PyTorch's FA2 on a GPU")


class Side:
    """One side's process (:mod:`benchmarks.bench_side`): send a row, read its timing."""

    def __init__(self, name: str, root: pathlib.Path) -> None:
        self.name = name
        paths = [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen([sys.executable, str(SIDE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env, cwd=REPO)  # fmt: skip
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise Fa2VerifyError(f"the {self.name} side's process exited ({self.process.wait()}): see its stderr above")
        return json.loads(line)

    def time(self, row: dict) -> dict:
        self.process.stdin.write(json.dumps(row) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def measure(sides: dict[str, Side], rows: list[dict], repeats: int) -> dict[str, list[list[dict]]]:
    """Per side, per row, the replies of every repeat; the sides alternate which goes first."""
    replies: dict[str, list[list[dict]]] = {name: [[] for _ in rows] for name in sides}
    turn = 0
    for repeat in range(repeats):
        for index, row in enumerate(rows):
            order = SIDES if turn % 2 == 0 else SIDES[::-1]
            turn += 1
            for name in order:
                replies[name][index].append(sides[name].time(row))
            print(f"  [{repeat + 1}/{repeats}] {label(row)}: "
                  + ", ".join(f"{name} {_show(replies[name][index][-1])}" for name in SIDES), flush=True)  # fmt: skip
    return replies


def _show(reply: dict) -> str:
    return f"{reply['ratio']:.3f}" if "ratio" in reply else reply["error"]


def label(row: dict) -> str:
    """The benchmark's own label of a row (:meth:`bench.timing.BenchRow.label`)."""
    return BenchRow(**row).label()


def median_ratio(replies: list[dict]) -> float | None:
    """The median ratio of a row's repeats; ``None`` when any repeat failed."""
    if not replies or any("ratio" not in reply for reply in replies):
        return None
    return statistics.median(reply["ratio"] for reply in replies)


def summarize(rows: list[dict], replies: dict[str, list[list[dict]]]) -> dict:
    """Per row each side's median ratio; per side and mode the geometric mean, the lowest row and the verdicts."""
    table = [{"row": row, **{name: median_ratio(replies[name][index]) for name in SIDES}}
             for index, row in enumerate(rows)]  # fmt: skip
    sides = {}
    for name in SIDES:
        modes = {}
        for mode in dict.fromkeys(row["mode"] for row in rows):
            ratios = [entry[name] for entry in table if entry["row"]["mode"] == mode]
            measured = [ratio for ratio in ratios if ratio is not None]
            lowest = min(measured, default=None)
            geomean = statistics.geometric_mean(measured) if measured else None
            complete = len(measured) == len(ratios)
            modes[mode] = {
                "geomean": geomean, "lowest": lowest, "rows": len(ratios), "failed_rows": len(ratios) - len(measured),
                "geomean_ok": complete and geomean is not None and geomean >= TARGETS[mode],
                "floor_ok": complete and lowest is not None and lowest >= ROW_FLOOR,
            }  # fmt: skip
        sides[name] = modes
    return {"rows": table, "sides": sides}


def _ratio(value: float | None) -> str:
    return "failed" if value is None else f"{value:.3f}"


def markdown(summary: dict) -> str:
    """The per-row table, then per side and mode the geometric mean and lowest row, and the targets' verdicts."""
    lines = ["| row | before | after | after / before |", "|---|---:|---:|---:|"]
    for entry in summary["rows"]:
        change = "-" if entry["before"] is None or entry["after"] is None else f"{entry['after'] / entry['before']:.3f}"
        lines.append(f"| {label(entry['row'])} | {_ratio(entry['before'])} | {_ratio(entry['after'])} | {change} |")
    lines.append("")
    for name in SIDES:
        for mode, result in summary["sides"][name].items():
            failed = f", {result['failed_rows']} row(s) failed" if result["failed_rows"] else ""
            lines.append(f"{name:<6} {mode:<7}: geometric mean {_ratio(result['geomean'])} "
                         f"(target >= {TARGETS[mode]:.2f}: {'met' if result['geomean_ok'] else 'NOT met'}), "
                         f"lowest row {_ratio(result['lowest'])} "
                         f"(target >= {ROW_FLOOR}: {'met' if result['floor_ok'] else 'NOT met'}){failed}")  # fmt: skip
    return "\n".join(lines) + "\n"


def met(summary: dict) -> bool:
    """Whether the after side meets every target."""
    return all(result["geomean_ok"] and result["floor_ok"] for result in summary["sides"]["after"].values())


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        require_cuda()
        rows = [dataclasses.asdict(row) for row in BENCH_ROWS
                if row.mode in args.modes and (args.seqlens is None or row.seqlen in args.seqlens)]  # fmt: skip
        if not rows:
            raise UsageError("--seqlens/--modes select no benchmark row")
        sides = {"before": Side("before", args.before), "after": Side("after", REPO)}
        for name, side in sides.items():
            print(f"{name}: {json.dumps(side.hello)}", flush=True)
        try:
            replies = measure(sides, rows, args.repeats)
        finally:
            for side in sides.values():
                side.close()
    except Fa2VerifyError as exc:
        print(f"bench_before_after.py: error: {exc}", file=sys.stderr)
        return 2
    summary = summarize(rows, replies)
    text = markdown(summary)
    print(text, end="")
    if args.out is not None:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "before-after.md").write_text(text, encoding="utf-8")
        hello = {name: side.hello for name, side in sides.items()}
        record = {"processes": hello, "replies": replies, **summary}
        (out / "before-after.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    return 0 if met(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
