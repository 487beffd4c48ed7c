"""Search the bundled Triton kernels for out-of-bounds memory accesses on the CPU, with the GPU's tiles.

Runs random dense and packed (varlen) cases, forward and both backward modes,
through the Triton interpreter under the bounds check of
``fa2_verify/verify/interpreter_bounds.py``, with the ``sm90`` tile table (the H100's
tiles, not the interpreter's 16 x 16 ones) and, with ``--tma``, the TMA tensor
descriptor loads the kernels use there.  Inputs are guarded and drawn in the
property suite's memory layouts; lengths sit at and around the tile edges.
Prints every case that touched memory outside its tensors; exit status 1 if
any did.  It found the varlen row -1 load that faulted an H100
(lab/benchmarks-history.md, "The suite after the search changes")::

    PYTHONPATH=. TRITON_INTERPRET=1 python lab/probes/probe_bounds.py --cases 150 --seed 1 [--tma] [--varlen]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("lab/probes/probe_bounds.py: set TRITON_INTERPRET=1 (the bounds check runs in the Triton interpreter)")

import torch  # noqa: E402

from fa2_verify.core.layouts import LAYOUTS, to_layout  # noqa: E402
from fa2_verify.kernels.triton_fa2 import configs, launch  # noqa: E402
from fa2_verify.verify.interpreter_bounds import bounds_checked  # noqa: E402

LENGTHS = (1, 2, 17, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257)
HEAD_DIMS = (32, 40, 64, 72, 96, 128, 136, 192, 256)
WINDOWS = ((-1, -1), (0, -1), (200, -1), (3, 0), (-1, 5), (10, 10), (0, 0))
DTYPES = (torch.float16, torch.float32)


def _tiles(dtype: torch.dtype, head_dim: int, seqlen: int) -> dict:
    block_d = next(block for block in (32, 64, 128, 256) if head_dim <= block)
    return {name: configs.select("sm90", name, dtype, block_d, seqlen) for name in configs.PASSES}


def _draw(rng: random.Random, varlen: bool) -> dict:
    causal = rng.random() < 0.3
    heads_kv = rng.choice((1, 2))
    case = {
        "dtype": rng.choice(DTYPES), "head_dim": rng.choice(HEAD_DIMS), "heads_q": heads_kv * rng.choice((1, 2, 4)),
        "heads_kv": heads_kv, "causal": causal, "window_size": (-1, -1) if causal else rng.choice(WINDOWS),
        "deterministic": rng.random() < 0.5, "layout": rng.choice(LAYOUTS),
    }
    if varlen:
        lengths = [(rng.choice((0, *LENGTHS)), rng.choice((0, *LENGTHS))) for _ in range(rng.randint(1, 3))]
        lengths[0] = (max(lengths[0][0], 1), max(lengths[0][1], 1))
        case["lengths"] = lengths
    else:
        case.update(batch=rng.choice((1, 2)), seqlen_q=rng.choice(LENGTHS), seqlen_k=rng.choice(LENGTHS))
    return case


def _run(case: dict, generator: torch.Generator) -> None:
    dtype, head_dim, layout = case["dtype"], case["head_dim"], case["layout"]
    mask = {"causal": case["causal"], "window_size": case["window_size"], "softmax_scale": head_dim**-0.5}

    def tensor(*shape: int) -> torch.Tensor:
        drawn = torch.randn(*shape, generator=generator).to(dtype)
        return to_layout(drawn, layout) if drawn.dim() == 4 else to_layout(drawn[None], layout)[0]

    if "lengths" in case:
        lengths = case["lengths"]
        total_q, total_k = sum(q for q, _ in lengths), sum(k for _, k in lengths)
        q, dout = tensor(total_q, case["heads_q"], head_dim), tensor(total_q, case["heads_q"], head_dim)
        k, v = tensor(total_k, case["heads_kv"], head_dim), tensor(total_k, case["heads_kv"], head_dim)
        cu_q = torch.tensor([0, *itertools.accumulate(q for q, _ in lengths)], dtype=torch.int32)
        cu_k = torch.tensor([0, *itertools.accumulate(k for _, k in lengths)], dtype=torch.int32)
        longest = (max(q for q, _ in lengths), max(k for _, k in lengths))
        tiles = _tiles(dtype, head_dim, max(longest))
        out, lse = launch.forward_varlen(q, k, v, cu_q, cu_k, *longest, tiles=tiles, **mask)
        launch.backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k, *longest, deterministic=case["deterministic"],
                               tiles=tiles, **mask)
        return
    batch, seqlen_q, seqlen_k = case["batch"], case["seqlen_q"], case["seqlen_k"]
    q, dout = tensor(batch, seqlen_q, case["heads_q"], head_dim), tensor(batch, seqlen_q, case["heads_q"], head_dim)
    k, v = tensor(batch, seqlen_k, case["heads_kv"], head_dim), tensor(batch, seqlen_k, case["heads_kv"], head_dim)
    tiles = _tiles(dtype, head_dim, max(seqlen_q, seqlen_k))
    out, lse = launch.forward(q, k, v, tiles=tiles, **mask)
    launch.backward(dout, q, k, v, out, lse, deterministic=case["deterministic"], tiles=tiles, **mask)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100, help="cases to run (default: 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the case draws (default: 0)")
    parser.add_argument("--tma", action="store_true", help="load through TMA descriptors where the sm90 tiles do")
    parser.add_argument("--varlen", action="store_true", help="packed cases instead of dense ones")
    args = parser.parse_args(argv)
    if args.tma:
        launch._tma_capable = lambda problem: True  # the interpreter runs tensor descriptors too
    rng = random.Random(args.seed)
    outside = 0
    with bounds_checked():
        for index in range(args.cases):
            case = _draw(rng, args.varlen)
            try:
                _run(case, torch.Generator().manual_seed(index))
            except Exception as raised:  # noqa: BLE001 - the interpreter wraps the check's AssertionError
                if "outside every tensor argument" not in str(raised):
                    raise
                outside += 1
                print(f"OUTSIDE {case}: {str(raised).splitlines()[0][:200]}", flush=True)
    print(f"{args.cases} cases, {outside} with an access outside their tensors")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
