"""Benchmark: the certified fast golden, against plain mpmath and against an older golden, forward and backward.

    python benchmarks/bench_golden.py [--device cpu|cuda] [--batch 1] [--heads 1] [--heads-kv H] [--seqlen 2048]
        [--head-dim 128] [--causal] [--dtype float16] [--mp-seqlen 64] [--old-root PATH] [--old-device cpu|cuda]
        [--old-seqlen N] [--old-heads N] [--old-repeats N]

Every side runs in the same invocation, so they share the machine's load:

* the fast golden (``GoldenOptions(method="fast")``, certification
  included) on ``--device``, end to end through ``golden.compute``, the
  median of ``--repeats`` runs, then once more split into its phases: the
  float64 pass (:func:`golden.fast.attention`, synchronised) and the
  certification (:func:`golden.certify.certify`, mpmath on the host);
* plain mpmath (``method="mpmath"``) at ``--mp-seqlen``, scaled to
  ``--seqlen`` by the work ``batch * heads * seqlen_q * seqlen_k * head_dim``
  (skipped with ``--mp-seqlen 0``);
* with ``--old-root``, the golden of another checkout (e.g. the one before
  a change), in a subprocess on ``--old-device`` (default the CPU), on the
  same inputs at ``--old-seqlen`` (default ``--seqlen``) and ``--old-heads``
  (default ``--heads``), scaled to the case by the same work ratio when
  smaller (the table says so); the median of ``--old-repeats`` runs there
  (default ``--repeats``).

Every side takes its CPU threads from the environment (``OMP_NUM_THREADS``
for torch, ``OPENBLAS_NUM_THREADS`` for numpy; the subprocess inherits
them): on a machine shared with other jobs, one thread each avoids the
spin-waiting that oversubscription turns into a several-fold slowdown.

Prints the machine, the load average and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from fa2_verify import golden
from fa2_verify.golden import certify, fast, inputs

#: Run in a subprocess with ``sys.path[0]`` at ``--old-root``: times that checkout's ``golden.compute``.
_OLD_GOLDEN = """
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1])
from fa2_verify import golden
spec, device = json.loads(sys.argv[2]), sys.argv[3]
generator = torch.Generator().manual_seed(spec["seed"])
q_shape = (spec["batch"], spec["seqlen"], spec["heads"], spec["head_dim"])
kv_shape = (spec["batch"], spec["seqlen"], spec["heads_kv"], spec["head_dim"])
q, k, v, dout = [torch.randn(*s, generator=generator, dtype=torch.float64).to(getattr(torch, spec["dtype"])).to(device)
                 for s in (q_shape, kv_shape, kv_shape, q_shape)]
options = golden.GoldenOptions(method="fast")
walls = []
for _ in range(spec["repeats"]):
    start = time.perf_counter()
    golden.compute(q, k, v, dout, softmax_scale=spec["head_dim"] ** -0.5, causal=spec["causal"], options=options)
    if device == "cuda":
        torch.cuda.synchronize()
    walls.append(time.perf_counter() - start)
print(json.dumps({"walls": walls, "module": golden.compute.__module__}))
"""


def _inputs(spec: dict, device: str) -> list[torch.Tensor]:
    """Normal inputs drawn on the CPU (the same for every side), then moved to ``device``."""
    generator = torch.Generator().manual_seed(spec["seed"])
    q_shape = (spec["batch"], spec["seqlen"], spec["heads"], spec["head_dim"])
    kv_shape = (spec["batch"], spec["seqlen"], spec["heads_kv"], spec["head_dim"])
    dtype = getattr(torch, spec["dtype"])
    return [torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype).to(device)
            for shape in (q_shape, kv_shape, kv_shape, q_shape)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _compute(spec: dict, device: str, method: str) -> tuple[float, golden.GoldenResult]:
    q, k, v, dout = _inputs(spec, device)
    options = golden.GoldenOptions(method=method)
    _sync(device)
    start = time.perf_counter()
    result = golden.compute(
        q, k, v, dout, softmax_scale=spec["head_dim"] ** -0.5, causal=spec["causal"], options=options
    )
    _sync(device)
    return time.perf_counter() - start, result


def _phases(spec: dict, device: str) -> dict[str, float]:
    """Wall seconds of the float64 pass and of the certification, apart."""
    q, k, v, dout = _inputs(spec, device)
    problem = inputs.prepare(q, k, v, dout, softmax_scale=spec["head_dim"] ** -0.5, causal=spec["causal"], window_size=(-1, -1))
    _sync(device)
    start = time.perf_counter()
    served = fast.attention(problem)
    _sync(device)
    middle = time.perf_counter()
    certify.certify(problem, served, rows=golden.GoldenOptions().certify_rows, precision_bits=113, seed=0)
    return {"float64 pass": middle - start, "certification": time.perf_counter() - middle}


def _old(spec: dict, root: str, device: str) -> dict:
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, "-c", _OLD_GOLDEN, os.path.abspath(root), json.dumps(spec), device],
        env=env, capture_output=True, text=True, check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _work(spec: dict) -> float:
    return spec["batch"] * spec["heads"] * spec["seqlen"] ** 2 * spec["head_dim"] // (2 if spec["causal"] else 1)


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
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--heads-kv", type=int, help="kv heads (default --heads; fewer for GQA)")
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="fast-path runs; the median is reported")
    parser.add_argument("--mp-seqlen", type=int, default=64, help="plain mpmath's seqlen (0: skip)")
    parser.add_argument("--old-root", help="a checkout whose golden is timed beside this one")
    parser.add_argument("--old-device", default="cpu", choices=["cpu", "cuda"], help="where the old golden runs")
    parser.add_argument("--old-repeats", type=int, help="old golden runs (default --repeats); the median is reported")
    parser.add_argument("--old-seqlen", type=int, help="the old golden's seqlen (default --seqlen), scaled by work")
    parser.add_argument("--old-heads", type=int, help="the old golden's heads (default --heads), scaled by work")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spec = {
        "batch": args.batch, "heads": args.heads, "heads_kv": args.heads_kv or args.heads, "seqlen": args.seqlen,
        "head_dim": args.head_dim, "repeats": args.repeats,
        "dtype": args.dtype, "causal": args.causal, "seed": args.seed,
    }

    load_before = os.getloadavg()
    runs = [_compute(spec, args.device, "fast") for _ in range(args.repeats)]
    phases = _phases(spec, args.device)
    rows = []
    if args.old_root:
        old_heads = args.old_heads or args.heads
        old_spec = {**spec, "seqlen": args.old_seqlen or args.seqlen, "heads": old_heads,
                    "heads_kv": old_heads * spec["heads_kv"] // spec["heads"], "repeats": args.old_repeats or args.repeats}
        old = _old(old_spec, args.old_root, args.old_device)
        old_wall = statistics.median(old["walls"])
        factor = _work(spec) / _work(old_spec)
        label = (f"{old['module']} at {args.old_root}, {args.old_device} (median of {len(old['walls'])}: "
                 + ", ".join(f"{wall:.2f}" for wall in old["walls"]) + ")")
        scaled = f"{old_wall * factor:.2f}" + (f" (measured at heads {old_spec['heads']}, seqlen {old_spec['seqlen']}: {old_wall:.2f} s, x{factor:.0f})" if factor != 1 else "")
        rows.append((label, scaled, old_wall * factor))
    if args.mp_seqlen:
        mp_spec = {**spec, "seqlen": args.mp_seqlen}
        mp_wall, _ = _compute(mp_spec, "cpu", "mpmath")
        factor = _work(spec) / _work(mp_spec)
        rows.append(("plain mpmath, CPU", f"{mp_wall * factor:.0f} (measured at seqlen {args.mp_seqlen}: {mp_wall:.2f} s, x{factor:.0f})", mp_wall * factor))
    load_after = os.getloadavg()

    wall = statistics.median(run[0] for run in runs)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else _cpu_model()
    print(
        f"machine: {_cpu_model()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; "
        f"device {device_name}; numpy {np.__version__}, torch {torch.__version__}"
    )
    print(
        f"load average (1/5/15 min): before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
        f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}"
    )
    print(
        f"case: batch {args.batch}, heads {args.heads}/{spec['heads_kv']}, seqlen {args.seqlen}, head_dim {args.head_dim}, {args.dtype}, "
        f"mask {'causal' if args.causal else 'none'}, forward + backward, 113 bits"
    )
    print()
    print("| golden | wall s | speedup of the torch golden |")
    print("|---|---|---|")
    runs_text = ", ".join(f"{run[0]:.2f}" for run in runs)
    split = ", ".join(f"{name} {value:.2f}" for name, value in phases.items())
    print(f"| torch fast + certification, {args.device} (median of {args.repeats}: {runs_text}; split: {split}) | {wall:.2f} | 1 |")
    for label, text, seconds in rows:
        print(f"| {label} | {text} | {seconds / wall:.1f} |")
    print()
    print("certified bounds: " + ", ".join(f"{name} {value:.2e}" for name, value in runs[0][1].certified_bound.items()))


if __name__ == "__main__":
    main()
