"""``sdpa-cudnn``: PyTorch's cuDNN attention behind the contract.

The op (torch 2.11 to 2.13) is ``aten::_scaled_dot_product_cudnn_attention(q,
k, v, attn_bias, compute_log_sumexp=True, dropout_p=0, is_causal,
return_debug_mask=False, scale=)`` in (batch, heads, seqlen, head_dim)
layout; its first two results are ``out`` and the float32 natural-log LSE
(which may carry a trailing axis of 1).  Masks as an additive bias, GQA by
repeating K and V, the LSE trimmed and the backward through the op's autograd
formula: :mod:`kernels.sdpa_ops`.

cuDNN's backward does not take one query and one key: its frontend says
"s_q = s_kv = 1 is not supported" for a causal call, and without a mask the
same call killed the process (segmentation fault) on an H100 with torch 2.11
and cuDNN 9 (docs/targets.md).  The backward declares that case unsupported
(:func:`_backward_limit`) before calling the op, so the suite checks every
other case instead of losing its worker.

It runs on CUDA with cuDNN only: elsewhere ``unavailable_reason()`` says why
and every call raises :class:`~core.errors.UnsupportedCase`.
"""

from __future__ import annotations

import torch

from fa2_verify.core.contract import Capabilities
from fa2_verify.kernels.sdpa_ops import SdpaTarget

#: Head dims declared: multiples of 8 up to 128, which every cuDNN 9 SDPA path supports on sm80+.
HEAD_DIMS: tuple[int, ...] = tuple(range(8, 129, 8))

CAPABILITIES = Capabilities(
    dtypes={"cuda": ("float16", "bfloat16")},
    head_dims=HEAD_DIMS,
    notes=(
        "cuda with cuDNN 9 and an sm80+ GPU; masks other than a square causal one are a 0/-inf additive bias",
        "GQA/MQA by repeating K and V over each group (dK, dV summed back through autograd)",
    ),
)


def _op(q, k, v, bias, is_causal: bool, softmax_scale: float):
    out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, bias, True, 0.0, is_causal, False, scale=softmax_scale
    )
    return out, lse


def _why_unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device (cuDNN attention has no CPU kernel)"
    if not torch.backends.cudnn.is_available():
        return "this PyTorch build has no cuDNN (torch.backends.cudnn.is_available() is False)"
    return None


def _backward_limit(seqlen_q: int, seqlen_k: int) -> str | None:
    if seqlen_q == seqlen_k == 1:
        return "cuDNN's SDPA backward does not support s_q = s_kv = 1 (its frontend's error; unmasked, the call crashes)"
    return None


def _describe() -> dict[str, object]:
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"op": "aten::_scaled_dot_product_cudnn_attention", "cudnn": version}


KERNEL = SdpaTarget("sdpa-cudnn", _op, CAPABILITIES, _why_unavailable, _describe, _backward_limit)
