"""Which small shapes a target fails to run at all (raises, or kills its process), one fresh process per shape.

``python3 lab/probes/probe_shapes.py --kernel NAME [--head-dims 16,32] [--heads 4/4,4/1]
[--seqlens 33,128,1/2] [--masks causal,none] [--dtypes float16] [--processes N]``
calls the target's forward and backward, through the registry as the suite
does, on every shape of the grid (batch 1; a sequence length ``Q/K`` sets
seqlen_q and seqlen_k, a plain one both), each in its own process so
that a compile cache or a crash of one shape cannot touch another, and prints
one Markdown row per shape: ``ok``; the failing pass with the exception's
class and first line; or the signal that killed the process (a segmentation
fault is ``killed by SIGSEGV``).  Numbers are not checked here: this finds
where a kernel does not run, for the property suite's crash and error reports
to be narrowed to the factor that decides (docs/targets.md records the
findings).  It needs the target's device (CUDA for the GPU targets).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import signal
import subprocess
import sys


def run_one(kernel: str, head_dim: int, heads_q: int, heads_kv: int, seqlens: str, causal: bool, dtype: str) -> str:
    """Forward then backward of one shape; ``ok`` or the failing pass and the exception's first line."""
    import torch

    from fa2_verify.app.targets import load_target

    target = load_target(kernel)
    rng = torch.Generator(device="cuda").manual_seed(0)
    seqlen_q, seqlen_k = _pair(seqlens)
    q = torch.randn(1, seqlen_q, heads_q, head_dim, device="cuda", generator=rng).to(getattr(torch, dtype))
    k, v = (torch.randn(1, seqlen_k, heads_kv, head_dim, device="cuda", generator=rng).to(q.dtype) for _ in range(2))
    masking = {"softmax_scale": head_dim**-0.5, "causal": causal}
    step = "forward"
    try:
        out, lse = target.forward(q, k, v, **masking)
        step = "backward"
        target.backward(torch.ones_like(out), q, k, v, out, lse, **masking)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the probe reports every failure as a table cell
        text = str(exc)
        first = (text.strip().splitlines() or [""])[0][:160]
        names = [name for name in ("NoValidChoicesError", "LoweringException") if name in text]
        return f"{step}: {type(exc).__name__}{' (' + ', '.join(names) + ')' if names else ''}: {first}"
    return "ok"


def probe(kernel: str, shape: tuple, timeout: float) -> str:
    """Run :func:`run_one` for ``shape`` in a child process; a signal or a timeout is the cell."""
    command = [sys.executable, __file__, "--one", json.dumps([kernel, *shape])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:.0f} s"
    if done.returncode < 0:
        return f"killed by {signal.Signals(-done.returncode).name}"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return f"exit {done.returncode}: {tail}"
    return lines[-1]


def _pair(seqlens: str) -> tuple[int, int]:
    """``"Q/K"`` or ``"N"`` (both) as (seqlen_q, seqlen_k)."""
    query, _, key = seqlens.partition("/")
    return int(query), int(key or query)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", help="registered target name or module:ATTRIBUTE")
    parser.add_argument("--head-dims", type=_ints, default=[16, 32, 64])
    parser.add_argument("--heads", default="4/4,4/2,4/1", help="query/kv head pairs, comma separated")
    parser.add_argument("--seqlens", default="33,128,129", help="N or Q/K, comma separated")
    parser.add_argument("--masks", default="causal", help="causal and/or none, comma separated")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--processes", type=int, default=8, help="shapes run at once (default 8)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per shape (default 300)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(run_one(*json.loads(args.one)))
        return
    if not args.kernel:
        parser.error("--kernel is required")
    heads = [tuple(int(n) for n in pair.split("/")) for pair in args.heads.split(",")]
    shapes = [
        (head_dim, heads_q, heads_kv, seqlens, mask == "causal", dtype)
        for head_dim, (heads_q, heads_kv), seqlens, mask, dtype in itertools.product(
            args.head_dims, heads, args.seqlens.split(","), args.masks.split(","), args.dtypes.split(",")
        )
    ]
    with concurrent.futures.ThreadPoolExecutor(args.processes) as pool:
        results = list(pool.map(lambda shape: probe(args.kernel, shape, args.timeout), shapes))
    print(f"{args.kernel}: batch 1\n")
    print("| head_dim | heads q/kv | seqlen q/k | causal | dtype | result |\n|---|---|---|---|---|---|")
    for (head_dim, heads_q, heads_kv, seqlens, causal, dtype), result in zip(shapes, results):
        print(f"| {head_dim} | {heads_q}/{heads_kv} | {'/'.join(map(str, _pair(seqlens)))} | {causal} | {dtype} | {result} |")


if __name__ == "__main__":
    main()
