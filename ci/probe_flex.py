"""Which shapes compiled FlexAttention refuses to build, through the ``flex-attention`` adapter, on this GPU.

``python3 ci/probe_flex.py [--processes N]`` calls the adapter's forward and
backward on a grid of small shapes (head_dim, query heads per kv head, sequence
length, dtype, causal or not), one fresh process per shape so that each
compiles alone, and prints one Markdown row per shape: ``ok``, or the
exception's class and first line (an ``InductorError`` wrapping
``NoValidChoicesError`` is Inductor finding no kernel configuration).  The
grid brackets the cases the property suite reported in docs/targets.md
(4 query heads on 1 kv head, head_dim 16 and 32, 33 and 52 tokens): it varies
one factor at a time around them, so the table shows which factor decides.
It needs a CUDA device; its findings are recorded in docs/targets.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import multiprocessing

HEAD_DIMS = (16, 32, 64)
GROUPS = ((4, 4), (4, 2), (4, 1))
SEQLENS = (33, 128, 129)
DTYPES = ("float16", "bfloat16")


def probe(shape: tuple[int, int, int, int, str, bool]) -> str:
    """``ok`` when forward and backward of ``shape`` run, else the failing pass and its exception's first line."""
    import torch

    from fa2_verify.kernels.flex_attention import KERNEL

    head_dim, heads_q, heads_kv, seqlen, dtype, causal = shape
    rng = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, seqlen, heads_q, head_dim, device="cuda", generator=rng).to(getattr(torch, dtype))
    k, v = (torch.randn(1, seqlen, heads_kv, head_dim, device="cuda", generator=rng).to(q.dtype) for _ in range(2))
    scale = head_dim**-0.5
    step = "forward"
    try:
        out, lse = KERNEL.forward(q, k, v, softmax_scale=scale, causal=causal)
        step = "backward"
        KERNEL.backward(torch.ones_like(out), q, k, v, out, lse, softmax_scale=scale, causal=causal)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the probe reports every failure as a table cell
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        names = [name for name in ("NoValidChoicesError", "LoweringException") if name in str(exc)]
        return f"{step}: {type(exc).__name__}{' (' + ', '.join(names) + ')' if names else ''}: {first}"
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8, help="shapes compiled at once (default 8)")
    args = parser.parse_args()
    shapes = [
        (head_dim, heads_q, heads_kv, seqlen, dtype, causal)
        for head_dim, (heads_q, heads_kv), seqlen, dtype, causal in itertools.product(
            HEAD_DIMS, GROUPS, SEQLENS, DTYPES, (True,)
        )
    ]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.processes, mp_context=context, max_tasks_per_child=1) as pool:
        results = list(pool.map(probe, shapes))
    print("| head_dim | heads q/kv | seqlen | dtype | causal | result |\n|---|---|---|---|---|---|")
    for (head_dim, heads_q, heads_kv, seqlen, dtype, causal), result in zip(shapes, results):
        print(f"| {head_dim} | {heads_q}/{heads_kv} | {seqlen} | {dtype} | {causal} | {result} |")


if __name__ == "__main__":
    main()
