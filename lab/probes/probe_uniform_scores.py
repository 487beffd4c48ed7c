"""Does a target's backward survive a query row whose scores are all one value ``c``: for which ``c`` is it finite?

``python3 lab/probes/probe_uniform_scores.py --kernel NAME [--scores -25,-17,-14,0,17,25]
[--seqlens-k 16,64,128] [--head-dims 8,64] [--dtypes float16,bfloat16]``

Softmax is shift-invariant: a row whose scaled scores all equal ``c`` has
P = 1/seqlen_k whatever ``c``, its LSE is ``c + ln(seqlen_k)``, and dQ, dK,
dV do not depend on ``c`` beyond Q's own size.  Each cell builds such a case
(one query row along the first axis, ``q = c / (k_0 * scale) e_0``, every key
``k_0 = 0.5`` on that axis and random on the others, so that each scaled score
is ``c``; V and dO random), runs the target's
forward and backward through the registry on ``--device`` (default cuda), and prints ``finite`` or which
gradients hold NaN/Inf, and the largest relative difference of the finite
gradients from a float64 autograd reference.  It needs the target's device.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys


def gradients(kernel, c: float, seqlen_k: int, head_dim: int, dtype_name: str, device: str) -> str:
    """One cell: the target's dq, dk, dv on a row of scores all ``c``, against float64 autograd."""
    import torch

    from fa2_verify.core.errors import UnsupportedCase

    dtype = getattr(torch, dtype_name)
    rng = torch.Generator(device=device).manual_seed(0)
    scale = head_dim**-0.5
    key = 0.5
    q = torch.zeros(1, 1, 1, head_dim, device=device, dtype=torch.float64)
    q[..., 0] = c / (key * scale)
    k = torch.randn(1, seqlen_k, 1, head_dim, device=device, generator=rng, dtype=torch.float64)
    k[..., 0] = key
    v = torch.randn(1, seqlen_k, 1, head_dim, device=device, generator=rng, dtype=torch.float64)
    dout = torch.randn(1, 1, 1, head_dim, device=device, generator=rng, dtype=torch.float64)
    q, k, v, dout = (t.to(dtype) for t in (q, k, v, dout))
    masking = {"softmax_scale": scale, "causal": False}
    try:
        out, lse = kernel.forward(q, k, v, **masking)
    except UnsupportedCase as exc:
        return f"unsupported: {exc}"
    dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, **masking)[:3]
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    scores = torch.einsum("bqhd,bkhd->bhqk", exact[0], exact[1]) * scale
    torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), exact[2]).backward(dout.double())
    bad = [name for name, grad in zip(("dq", "dk", "dv"), (dq, dk, dv)) if not torch.isfinite(grad).all()]
    if bad:
        return f"{', '.join(bad)} not finite"
    worst = max(((got.double() - ref.grad).abs().max() / ref.grad.abs().max().clamp_min(1e-30)).item()
                for got, ref in zip((dq, dk, dv), exact))
    return f"finite (rel. diff {worst:.2g})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--scores", default="-40,-25,-20,-17,-16,-15,-14,-10,0,10,17,25")
    parser.add_argument("--seqlens-k", default="16,32,64,128")
    parser.add_argument("--head-dims", default="8,64")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    import torch

    from fa2_verify.core.errors import Fa2VerifyError
    from fa2_verify.app.targets import load_target

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"probe_uniform_scores.py: error: --device={args.device}: no CUDA device is visible", file=sys.stderr)
        return 2
    try:
        kernel = load_target(args.kernel)
    except Fa2VerifyError as exc:
        print(f"probe_uniform_scores.py: error: {exc}", file=sys.stderr)
        return 2
    scores = [float(value) for value in args.scores.split(",")]
    print(f"| dtype | d | seqlen_k | {' | '.join(f'c = {c:g}' for c in scores)} |")
    print(f"|---|---:|---:|{'---|' * len(scores)}")
    for dtype, head_dim, seqlen_k in itertools.product(args.dtypes.split(","), map(int, args.head_dims.split(",")),
                                                       map(int, args.seqlens_k.split(","))):
        cells = [gradients(kernel, c, seqlen_k, head_dim, dtype, args.device) for c in scores]
        print(f"| {dtype} | {head_dim} | {seqlen_k} | {' | '.join(cells)} |", flush=True)
    print(f"(a row of equal scores c: P = 1/seqlen_k, LSE = c + ln(seqlen_k); e^-17 = {math.exp(-17):.2g} lies "
          f"below float16's smallest subnormal 6.0e-08)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
