"""Is a benchmark row bound by the host: the CPU time to issue one call, next to the GPU time of that call.

    python benchmarks/launch_overhead.py [--seqlens 1024,2048] [--calls 50]

For each row of the kernel benchmark (:data:`fa2_verify.bench.timing.BENCH_ROWS`)
at the sequence lengths given, float16, it prints for ``triton`` and PyTorch's FA2
(the benchmark's own callables): the CUDA-event median of a call
(``triton.testing.do_bench``, as the benchmark times it) and the host time per
call, measured as the wall-clock of issuing ``--calls`` calls back to back
without synchronizing (the GPU queue absorbs them), after a warm-up.  A row
whose host time per call reaches its GPU time keeps the GPU waiting on the
Python launcher: its ratio then measures the launch path, not the kernel.
``--profile`` then prints where ``triton``'s host time goes (cProfile, the
functions with the most cumulative time over ``--calls`` calls of the first
row of each mode).  Needs CUDA.
"""

from __future__ import annotations

import argparse
import cProfile
import pathlib
import pstats
import sys
import time

if __package__ in (None, ""):  # run as a script: the repository root, so that `fa2_verify` imports from the tree
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from fa2_verify.bench import timing  # noqa: E402


def host_ms_per_call(fn, calls: int) -> float:
    """Wall-clock milliseconds per call of issuing ``calls`` calls without synchronizing."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="1024,2048", help="comma-separated sequence lengths (default 1024,2048)")
    parser.add_argument("--calls", type=int, default=50, help="calls issued per host measurement (default 50)")
    parser.add_argument("--profile", action="store_true", help="print where triton's host time goes")
    args = parser.parse_args()
    seqlens = {int(value) for value in args.seqlens.split(",")}
    print("| row | triton GPU ms | triton host ms/call | FA2 GPU ms | FA2 host ms/call |")
    print("|---|---:|---:|---:|---:|")
    for row in timing.BENCH_ROWS:
        if row.seqlen not in seqlens or row.dtype != "float16":
            continue
        q, k, v, dout = timing.row_inputs(row)
        ours, sdpa = timing._ours(row, q, k, v, dout), timing._sdpa(row, q, k, v, dout)
        cells = []
        for fn in (ours, sdpa):
            cells += [timing.median_ms(fn), host_ms_per_call(fn, args.calls)]
        print(f"| {row.label()} | {' | '.join(f'{cell:.3f}' for cell in cells)} |", flush=True)
    if args.profile:
        for mode in ("fwd", "fwd+bwd"):
            row = next(row for row in timing.BENCH_ROWS if row.mode == mode and row.seqlen in seqlens)
            ours = timing._ours(row, *timing.row_inputs(row))
            ours()
            torch.cuda.synchronize()
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [ours() for _ in range(args.calls)])
            torch.cuda.synchronize()
            print(f"\n{row.label()}: triton's host time over {args.calls} calls")
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(35)


if __name__ == "__main__":
    main()
