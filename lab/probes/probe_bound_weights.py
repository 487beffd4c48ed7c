"""The error model's bounds with :mod:`verify.bound_weights`' Triton passes beside the torch evaluation, on one device.

    python lab/probes/probe_bound_weights.py --device cuda --cases s131072-causal-bf16 s16384-none-fp16
    PYTHONPATH=. TRITON_INTERPRET=1 python lab/probes/probe_bound_weights.py --cases s2048-causal-bf16

Per case of the scale set of ``--device`` (``app.cases.scale``; all of them without ``--cases``), forward and
backward, the golden computed untimed: :func:`verify.error_model.bounds_and_flush_shares` with
``fused_weights=False`` and ``True`` (in each of ``--tiles``), each synchronised, the shares made where the product makes them
(bfloat16), the faster of ``--repeats`` runs after one untimed call each (Triton's compile), and the largest
relative difference of every bound and every share (the last tile's).  First, Triton's float64 ``exp`` and libdevice's beside
torch's on 2^20 arguments in [-700, 700] (compiled only: the interpreter has no libdevice).  One JSON line each.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl
from synced import timed

from fa2_verify.app.cases.scale import SCALE_CASES
from fa2_verify.core import triton_tiles
from fa2_verify.core.case import make_case
from fa2_verify.verify import bound_weights, check, error_model, noise_verdicts


@triton.jit
def _exponentials(X, PLAIN, LIBDEVICE, n, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + at, mask=at < n)
    tl.store(PLAIN + at, tl.exp(x), mask=at < n)
    tl.store(LIBDEVICE + at, tl.extra.cuda.libdevice.exp(x), mask=at < n)


def _exp_errors(device: str) -> dict[str, float]:
    """The largest relative error of ``tl.exp`` and libdevice's ``exp`` on float64, against torch's."""
    x = torch.linspace(-700.0, 700.0, 1 << 20, dtype=torch.float64, device=device)
    plain, libdevice = torch.empty_like(x), torch.empty_like(x)
    _exponentials[(x.numel() // 1024,)](x, plain, libdevice, x.numel(), BLOCK=1024)
    exact = x.exp()
    return {name: float(((value - exact) / exact).abs().max()) for name, value in
            (("tl.exp", plain), ("libdevice.exp", libdevice))}


def _differences(fused: tuple[dict, dict], reference: tuple[dict, dict]) -> dict[str, float]:
    differences = {}
    for kind, fused_part, reference_part in zip(("bound", "share"), fused, reference):
        for name, expected in reference_part.items():
            gap = (fused_part[name] - expected).abs()
            differences[f"{kind} {name}"] = float(torch.where(gap > 0, gap / expected.abs(), 0.0).max())
    return differences


def probe(spec, device: str, repeats: int, tiles: list[tuple[int, int, int]]) -> dict:
    case = make_case(spec, device)
    golden = check.golden_for(case)
    flush = noise_verdicts.flush_matters(spec.torch_dtype)
    run = (error_model.bounds_and_flush_shares, case, golden)
    seconds, results = {}, {}
    for fused, tile in [(False, None), *((True, tile) for tile in tiles)]:
        if tile:
            triton_tiles.TILE = tile
        results[fused] = timed(device, *run, flush_shares=flush, fused_weights=fused)[0]
        seconds[str(tile) if fused else "torch"] = round(min(
            timed(device, *run, flush_shares=flush, fused_weights=fused)[1] for _ in range(repeats)), 3)
    differences = _differences(results[True], results[False])
    return {"case": spec.name, "seconds": seconds, "worst relative difference": max(differences.values()),
            "differences": differences}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", nargs="*", default=[], help="scale-set case names (default: all)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tiles", nargs="*", default=[], help="ROWS,KEYS,WARPS tiles of the fused passes to time "
                        "(default: core.triton_tiles.TILE)")
    args = parser.parse_args()
    tiles = [tuple(int(part) for part in tile.split(",")) for tile in args.tiles] or [triton_tiles.TILE]
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        print(json.dumps({"float64 exp, largest relative error": _exp_errors(args.device)}), flush=True)
    for spec in SCALE_CASES[torch.device(args.device).type]:
        if not args.cases or spec.name in args.cases:
            print(json.dumps(probe(spec, args.device, args.repeats, tiles)), flush=True)


if __name__ == "__main__":
    main()
