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
row of each mode), and ``--stages`` the host time of each stage of one
forward call of that row (validation, output allocation, tiles and launch
plans, the launch, the record), unprofiled.  Needs CUDA.
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


def forward_stages(row, calls: int) -> dict[str, float]:
    """Host microseconds per call of each stage of ``launch.forward`` for ``row``, each stage repeated ``calls``
    times on its own (the stages as :func:`kernels.triton_fa2.launch._forward_call` runs them)."""
    from fa2_verify.kernels.triton_fa2 import launch, plans, validation

    q, k, v, _ = timing.row_inputs(row)
    scale = row.head_dim**-0.5

    def timed(fn) -> float:
        return host_ms_per_call(fn, calls) * 1e3

    problem = validation.check_forward(q, k, v, softmax_scale=scale, causal=row.causal, window_size=(-1, -1))
    shape = (problem.batch, problem.heads_q, problem.seqlen_q)
    tensors = launch.forward_tensors(q, k, v, shape)
    chosen = launch._tiles(problem, ("forward",), None)
    planned = plans.forward_launches(problem, *tensors, chosen, launch._tma_capable(problem))
    return {
        "validation.check_forward": timed(lambda: validation.check_forward(
            q, k, v, softmax_scale=scale, causal=row.causal, window_size=(-1, -1))),
        "forward_tensors (2 allocations)": timed(lambda: launch.forward_tensors(q, k, v, shape)),
        "tiles": timed(lambda: launch._tiles(problem, ("forward",), None)),
        "plans.forward_launches": timed(lambda: plans.forward_launches(
            problem, *tensors, chosen, launch._tma_capable(problem))),
        "launch (Triton's launcher)": timed(lambda: launch._run(planned)),
        "record": timed(lambda: launch._record(problem, "forward", chosen, tma_used=True)),
        "whole call": timed(lambda: launch.forward(q, k, v, softmax_scale=scale, causal=row.causal)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="1024,2048", help="comma-separated sequence lengths (default 1024,2048)")
    parser.add_argument("--calls", type=int, default=50, help="calls issued per host measurement (default 50)")
    parser.add_argument("--profile", action="store_true", help="print where triton's host time goes")
    parser.add_argument("--stages", action="store_true", help="time each stage of a triton forward call")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_overhead.py: error: no CUDA device: it times the kernels' launch on a GPU", file=sys.stderr)
        return 2
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
    if args.stages:
        row = next(row for row in timing.BENCH_ROWS if row.mode == "fwd" and row.seqlen in seqlens)
        print(f"\n{row.label()}: host microseconds per forward call, by stage")
        for stage, micros in forward_stages(row, args.calls).items():
            print(f"  {stage:<34s} {micros:8.1f}")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
