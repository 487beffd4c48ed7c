"""Benchmark and check the Triton FA2 kernels against PyTorch's built-in FA2 on a GPU: ``fa2-verify bench``.

Sections (``--sections``, default ``check,spread,bench``):

``check``   :mod:`bench.checks`: every feature on odd shapes through the
            product's check (poisoned outputs, golden, error model).
``spread``  :func:`bench.timing.dq_spread`: dq of the atomic backward over
            repeated calls; the deterministic backward bit for bit.
``sweep``   :mod:`bench.sweep`: candidate tile configurations, the best per
            (pass, head_dim, seqlen bucket).
``bench``   :mod:`bench.timing`: ``triton`` and SDPA's flash backend timed in
            the same run, each row with a check verdict.

Kernels compile once per variant; ``--jobs N`` compiles them first in N
processes that share Triton's cache.  Tables go to stdout and, with
``--out DIR``, to files there (written atomically).  Exit status 1 when a check
fails or a kernel did not compile.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import pathlib
import time

import torch

from fa2_verify.app.cases.bench_checks import CHECK_CASES
from fa2_verify.bench import checks
from fa2_verify.bench.sweep import SWEEP_POINTS, best_tiles, sweep_point
from fa2_verify.bench.timing import BENCH_ROWS, DTYPES_BENCHED, SEQLENS, BenchRow, bench_row, dq_spread
from fa2_verify.core.errors import UsageError
from fa2_verify.kernels.triton_fa2.configs import bucket
from fa2_verify.core.outputs import write_text_atomic

SECTIONS = ("check", "spread", "sweep", "bench")


def _jobs(sections: tuple[str, ...], rows: tuple[BenchRow, ...]) -> list[tuple[str, int]]:
    jobs: list[tuple[str, int]] = []
    if "check" in sections:
        jobs += [("check", i) for i in range(len(CHECK_CASES))]
    if "spread" in sections:
        jobs += [("spread", i) for i in range(len(DTYPES_BENCHED))]
    if "sweep" in sections:
        jobs += [("sweep", i) for i in range(len(SWEEP_POINTS))]
    if "bench" in sections:
        jobs += [("bench", i) for i in range(len(rows))]
    return jobs


def _warm(job: tuple[str, int]) -> str:
    """Run one job once without measuring, so that its kernels are compiled into Triton's cache."""
    section, index = job
    try:
        if section == "check":
            checks.warm(CHECK_CASES[index])
        elif section == "spread":
            dq_spread(DTYPES_BENCHED[index], warm_only=True)
        elif section == "sweep":
            sweep_point(SWEEP_POINTS[index], warm_only=True)
        else:
            bench_row(BENCH_ROWS[index], warm_only=True)
        torch.cuda.synchronize()
        return ""
    except Exception as exc:
        return f"{section}[{index}]: {type(exc).__name__}: {str(exc)[:300]}"


def warm_up(jobs: list[tuple[str, int]], workers: int) -> list[str]:
    if workers <= 1 or not jobs:
        return []
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return [message for message in pool.map(_warm, jobs) if message]


def _geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def _table(columns: tuple[tuple[str, str], ...], rows: list[list[str]]) -> list[str]:
    """A Markdown table: ``columns`` are (heading, alignment: ``---`` or ``---:``), an empty cell stays ``| |``."""
    def line(cells) -> str:
        return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"

    return [line(heading for heading, _ in columns), line(align for _, align in columns)] + [line(row) for row in rows]


def _error_row(name: str, error: str, width: int, verdict: str = "") -> list[str]:
    """The row of a ``name`` that raised ``error``, ``width`` cells, ending with ``verdict``."""
    return [name, f"error: {error}"] + [""] * (width - 3) + [verdict]


_BENCH_COLUMNS = (("row", "---"), ("triton TFLOP/s", "---:"), ("sdpa-flash TFLOP/s", "---:"), ("ratio", "---:"),
                  ("triton peak MiB", "---:"), ("sdpa peak MiB", "---:"), ("check (max normalized error)", "---"))

_CHECK_COLUMNS = (("case", "---"), ("atomic: out lse dq dk dv", "---"), ("deterministic: out lse dq dk dv", "---"),
                  ("det. bitwise", "---"), ("passed", "---"))


def _bench_table(results: list[dict]) -> str:
    rows = []
    for r in results:
        if "error" in r:
            rows.append(_error_row(r["label"], r["error"], len(_BENCH_COLUMNS)))
            continue
        check = r["check"]
        verdict = "-" if check is None else ("ok" if check["passed"] else "FAIL") + " " + ", ".join(
            f"{name} {error:.2g}" for name, error in check["normalized_max"].items())
        rows.append([r["label"], f"{r['tflops_triton']:.0f}", f"{r['tflops_sdpa']:.0f}", f"{r['ratio']:.2f}",
                     f"{r['peak_mib_triton']:.0f}", f"{r['peak_mib_sdpa']:.0f}", verdict])
    lines = _table(_BENCH_COLUMNS, rows)
    for mode in ("fwd", "fwd+bwd"):
        ratios = [r["ratio"] for r in results if "ratio" in r and r["row"]["mode"] == mode]
        if ratios:
            lines.append(f"\n{mode}: geometric-mean ratio {_geomean(ratios):.3f}, min {min(ratios):.3f} "
                         f"over {len(ratios)} rows")
    return "\n".join(lines)


def _check_table(results: list[dict]) -> str:
    """One row per case: the largest normalized error of each output (threshold 1) in both backward modes."""
    def fmt(summary):
        worst = summary["normalized_max"]
        return " ".join(f"{worst[n]:.2g}" if n in worst else "-" for n in ("out", "lse", "dq", "dk", "dv"))

    rows = [
        _error_row(r["name"], r["error"], len(_CHECK_COLUMNS), "FAIL") if "error" in r else
        [r["name"], fmt(r["atomic"]), fmt(r["deterministic"]), f"{r['bitwise_repeat']}", "ok" if r["passed"] else "FAIL"]
        for r in results
    ]
    return "\n".join(_table(_CHECK_COLUMNS, rows))


def _write(out_dir: str | None, name: str, text: str) -> None:
    if out_dir is not None:
        write_text_atomic(pathlib.Path(out_dir) / name, text, overwrite=True, flag="--out")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sections", default="check,spread,bench",
                        help=f"comma-separated, from {','.join(SECTIONS)} (default: check,spread,bench)")
    parser.add_argument("--out", default=None, help="directory for the JSON results and tables")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes that compile the kernels before timing (1: compile while timing)")
    parser.add_argument("--seqlens", default=",".join(map(str, SEQLENS)), help="bench seqlens, comma-separated")
    parser.add_argument("--use-sweep", action="store_true",
                        help="bench with the sweep's best tiles where it has them, else the configuration table")


def run(args: argparse.Namespace) -> int:
    sections = tuple(s for s in args.sections.split(",") if s)
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise UsageError(f"--sections={args.sections} names {unknown}: use some of {','.join(SECTIONS)}")
    seqlens = tuple(int(s) for s in args.seqlens.split(","))
    rows = tuple(r for r in BENCH_ROWS if r.seqlen in seqlens)
    started = time.time()
    warm_errors = warm_up(_jobs(sections, rows), args.jobs)
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "warm_errors": warm_errors,
                    "warm_seconds": time.time() - started}
    import triton

    report["triton"] = triton.__version__
    print(f"device {report['device']}, torch {torch.__version__}, triton {triton.__version__}; "
          f"compiled in {report['warm_seconds']:.0f}s; warm-up errors: {len(warm_errors)}", flush=True)
    for message in warm_errors:
        print("  warm-up:", message, flush=True)

    if "check" in sections:
        results = []
        for case in CHECK_CASES:
            try:
                results.append(checks.check(case))
            except Exception as exc:
                results.append({"name": case.name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        report["check"] = results
        report["negative_control"] = checks.negative_control()
        table = _check_table(results)
        _write(args.out, "check.md", table)
        print(table, "\n", json.dumps(report["negative_control"]), flush=True)

    if "spread" in sections:
        report["spread"] = [dq_spread(dtype) for dtype in DTYPES_BENCHED]
        print(json.dumps(report["spread"], indent=1), flush=True)

    tiles_override = None
    if "sweep" in sections:
        results = [sweep_point(point) for point in SWEEP_POINTS]
        report["sweep"] = results
        best = best_tiles(results)
        report["sweep_best"] = {f"{p} d={d} {size}": tile.as_dict() for (p, d, size), tile in best.items()}
        lines = [f"{r['point']['pass_name']:<12} d={r['point']['head_dim']:<3} s={r['point']['seqlen']:<5} "
                 f"causal={r['point']['causal']!s:<5} deterministic={r['point']['deterministic']!s:<5} "
                 f"{tuple(r['point']['tile'].values())} " + (f"{r['ms']:.3f} ms" if "ms" in r else r["error"])
                 for r in results]
        _write(args.out, "sweep.txt", "\n".join(lines))
        print("\n".join(lines), "\nbest:", json.dumps(report["sweep_best"]), flush=True)
        if args.use_sweep:
            tiles_override = best

    if "bench" in sections:
        results = []
        for row in rows:
            tiles = None
            if tiles_override:
                tiles = {p: t for (p, d, size), t in tiles_override.items()
                         if d == row.head_dim and size == bucket(row.seqlen)}
            try:
                results.append(bench_row(row, tiles=tiles))
            except Exception as exc:
                results.append({"label": row.label(), "row": dataclasses.asdict(row),
                                "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        report["bench"] = results
        table = _bench_table(results)
        _write(args.out, "bench.md", table)
        print(table, flush=True)

    report["config"] = checks.kernel().config()
    _write(args.out, "report.json", json.dumps(report, indent=1, default=str))
    failed = [r for r in report.get("check", []) if not r.get("passed")]
    failed += [r for r in report.get("bench", []) if r.get("check") and not r["check"]["passed"]]
    vacuous = "negative_control" in report and not report["negative_control"]["failed_as_it_must"]
    return 1 if failed or warm_errors or vacuous else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fa2_verify.bench", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))

