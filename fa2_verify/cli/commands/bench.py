"""``fa2-verify bench``: time the ``triton`` kernels against PyTorch's built-in FA2 on a GPU.

A thin wrapper over :mod:`benchmarks.bench_kernels` (its docstring describes the
sections, the rows and the checks); it needs a CUDA device and a source checkout
(the ``benchmarks`` package is not installed with fa2-verify).
"""

from __future__ import annotations

import importlib

from fa2_verify.core.errors import UsageError
from fa2_verify.verify.registry import require_device


def _benchmark_module():
    try:
        return importlib.import_module("benchmarks.bench_kernels")
    except ImportError as exc:
        raise UsageError(f"fa2-verify bench: cannot import benchmarks.bench_kernels ({exc}): "
                         "run it from the root of a source checkout") from None


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmark the triton kernels against PyTorch's FA2 (GPU)")
    parser.set_defaults(handler=handle)
    parser.add_argument("--sections", default="check,spread,bench",
                        help="comma-separated, from check,spread,sweep,bench (default: check,spread,bench)")
    parser.add_argument("--out", default=None, help="directory for the JSON results and tables")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes that compile the kernels before timing (default: min(16, CPUs))")
    parser.add_argument("--seqlens", default=None, help="bench seqlens, comma-separated (default: 1024..16384)")
    parser.add_argument("--use-sweep", action="store_true",
                        help="bench with the sweep's best tiles where it has them, else the configuration table")


def handle(args) -> int:
    require_device("cuda")
    bench = _benchmark_module()
    argv = ["--sections", args.sections]
    for flag, value in (("--out", args.out), ("--jobs", args.jobs), ("--seqlens", args.seqlens)):
        if value is not None:
            argv += [flag, str(value)]
    if args.use_sweep:
        argv.append("--use-sweep")
    return bench.main(argv)
