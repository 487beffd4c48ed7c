"""Benchmark: the certified fast golden against plain mpmath, forward and backward.

    python benchmarks/bench_golden.py [--seqlen 2048] [--mp-seqlen 64] [--head-dim 128] [--dtype float16]

Both sides run in the same process and the same call, so they share the
machine's load.  Plain mpmath (``GoldenOptions(method="mpmath")``) is timed at
``--mp-seqlen`` and scaled to ``--seqlen`` by the operation count
``seqlen_q * seqlen_k * head_dim``; the fast side is
``GoldenOptions(method="fast")``, certification included, timed at
``--seqlen``.  Prints the machine, the load average and a Markdown table.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time

import numpy as np
import torch

from fa2_verify import golden
def _inputs(seqlen: int, head_dim: int, dtype: torch.dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, seqlen, 1, head_dim, generator=generator, dtype=torch.float64).to(dtype) for _ in range(4)]


def _time(seqlen: int, args, method: str) -> tuple[float, float, golden.GoldenResult]:
    q, k, v, dout = _inputs(seqlen, args.head_dim, getattr(torch, args.dtype), args.seed)
    options = golden.GoldenOptions(method=method, precision_bits=args.precision_bits)
    wall, cpu = time.perf_counter(), time.process_time()
    result = golden.compute(
        q, k, v, dout, softmax_scale=1 / math.sqrt(args.head_dim), causal=args.causal, options=options
    )
    return time.perf_counter() - wall, time.process_time() - cpu, result


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--mp-seqlen", type=int, default=64)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--precision-bits", type=int, default=113)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="fast-path runs; the median is reported")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    load_before = os.getloadavg()
    fast_runs = [_time(args.seqlen, args, "fast") for _ in range(args.repeats)]
    mp_wall, mp_cpu, _ = _time(args.mp_seqlen, args, "mpmath")
    load_after = os.getloadavg()

    fast_wall = statistics.median(run[0] for run in fast_runs)
    fast_cpu = statistics.median(run[1] for run in fast_runs)
    bound = fast_runs[0][2].certified_bound
    factor = (args.seqlen / args.mp_seqlen) ** 2
    mask = "causal" if args.causal else "none"
    print(f"machine: {_cpu_model()}, {os.cpu_count()} CPUs, numpy {np.__version__}, torch {torch.__version__}")
    print(
        f"load average (1/5/15 min): before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
        f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}"
    )
    print(
        f"case: batch 1, heads 1, head_dim {args.head_dim}, {args.dtype}, mask {mask}, forward + backward, "
        f"{args.precision_bits} bits"
    )
    print()
    print(f"| method | seqlen | wall s | CPU s | wall s scaled to seqlen {args.seqlen} | speedup vs plain mpmath |")
    print("|---|---|---|---|---|---|")
    print(
        f"| plain mpmath | {args.mp_seqlen} | {mp_wall:.2f} | {mp_cpu:.2f} | {mp_wall * factor:.0f} "
        f"(x{factor:.0f}) | 1 |"
    )
    print(
        f"| fast + certification (median of {args.repeats}: "
        f"{', '.join(f'{run[0]:.2f}' for run in fast_runs)}) | {args.seqlen} | {fast_wall:.2f} | {fast_cpu:.2f} "
        f"| {fast_wall:.2f} | {mp_wall * factor / fast_wall:.0f} |"
    )
    print()
    print("certified bounds: " + ", ".join(f"{name} {value:.2e}" for name, value in bound.items()))


if __name__ == "__main__":
    main()
