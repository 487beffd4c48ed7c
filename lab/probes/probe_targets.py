"""What each third-party attention entry point takes and returns on this GPU: signatures, LSE layout and base.

``python3 lab/probes/probe_targets.py`` prints, per target, the call's signature (where
Python can read it), the shape and dtype of what it returns, and the relative
error of its output and of ``lse`` read as natural log and as base 2 against a
float64 reference on one small causal case (batch 2, seqlen 256, 4 heads,
head_dim 128, float16).  A target that cannot be imported or called prints the
one-line reason.  It needs a CUDA device; its findings are recorded in
docs/targets.md, and the adapters in ``fa2_verify/kernels/`` follow them.
"""

from __future__ import annotations

import inspect
import math
import traceback

import torch


def reference(q, k, v, causal):
    """float64 attention in BHSD and its natural-log LSE."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(scores, -1)
    return torch.softmax(scores, -1) @ v, lse


def relative(actual, expected):
    return ((actual.double() - expected).norm() / expected.norm()).item()


def report(name, call):
    try:
        lines = call()
        print(f"== {name}")
        for line in lines:
            print(f"   {line}")
    except Exception as exc:
        print(f"== {name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        traceback.print_exc(limit=2)


def main() -> None:
    torch.manual_seed(0)
    b, s, h, d = 2, 256, 4, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    expected, lse = reference(q, k, v, causal=True)

    def lse_errors(found):
        found = found.double()[..., : lse.shape[-1]]
        return f"lse {tuple(found.shape)}: natural {relative(found, lse):.2e}, base-2 read {relative(found * math.log(2), lse):.2e}"

    def efficient():
        op = torch.ops.aten._scaled_dot_product_efficient_attention
        out, found, *rest = op(q, k, v, None, True, 0.0, True)
        return [str(op.default._schema), f"out {relative(out, expected):.2e}", lse_errors(found), f"extra {len(rest)}"]

    def cudnn():
        op = torch.ops.aten._scaled_dot_product_cudnn_attention
        result = op(q, k, v, None, True, 0.0, True, False)
        out, found = result[0], result[1]
        return [str(op.default._schema), f"out {relative(out, expected):.2e}", lse_errors(found), f"returns {len(result)}"]

    def flex():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        signature = str(inspect.signature(flex_attention))
        block_mask = create_block_mask(lambda b_, h_, i, j: j <= i, None, None, s, s, device="cuda")
        compiled = torch.compile(flex_attention)
        out, found = compiled(q, k, v, block_mask=block_mask, return_lse=True)
        return [signature, f"out {relative(out, expected):.2e}", lse_errors(found)]

    def fa4():
        from flash_attn.cute import flash_attn_func

        signature = str(inspect.signature(flash_attn_func))
        bshd = [t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
        result = flash_attn_func(*bshd, causal=True)
        out, found = (result if isinstance(result, tuple) else (result, None))[:2]
        lines = [signature, f"returns {type(result).__name__} of {len(result) if isinstance(result, tuple) else 1}",
                 f"out {relative(out.transpose(1, 2), expected):.2e}"]
        if found is not None:
            lines.append(lse_errors(found))
        out.backward(torch.randn_like(out))
        lines.append(f"backward ok: dq finite {bool(bshd[0].grad.isfinite().all())}")
        return lines

    print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
    for name, call in (("sdpa-efficient", efficient), ("sdpa-cudnn", cudnn), ("flex-attention", flex),
                       ("flash-attn-4", fa4)):
        report(name, call)


if __name__ == "__main__":
    main()
