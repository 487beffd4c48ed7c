"""``sdpa-efficient``: PyTorch's memory-efficient attention (xFormers' cutlass kernel) behind the contract.

The op is ``aten::_scaled_dot_product_efficient_attention(q, k, v, attn_bias,
compute_log_sumexp=True, dropout_p=0, is_causal, scale=)`` in (batch, heads,
seqlen, head_dim) layout; it returns ``(out, lse, philox_seed,
philox_offset)`` with the float32 natural-log LSE padded along seqlen_q.
Masks as an additive bias, GQA by repeating K and V, the LSE trimmed and the
backward through the op's autograd formula: :mod:`kernels.sdpa_ops`.

It runs on CUDA only: on a machine without one, ``unavailable_reason()`` says
so and every call raises :class:`~core.errors.UnsupportedCase`.
"""

from __future__ import annotations

import torch

from fa2_verify.core.contract import Capabilities
from fa2_verify.kernels.sdpa_ops import SdpaTarget

#: Head dims declared: multiples of 8 up to 256 (the kernel takes more; these are the ones checked).
HEAD_DIMS: tuple[int, ...] = tuple(range(8, 257, 8))

CAPABILITIES = Capabilities(
    dtypes={"cuda": ("float16", "bfloat16", "float32")},
    head_dims=HEAD_DIMS,
    notes=(
        "cuda only; masks other than a square causal one are passed as a 0/-inf additive bias",
        "GQA/MQA by repeating K and V over each group (dK, dV summed back through autograd)",
        "its backward is nondeterministic (PyTorch warns so); no deterministic mode is declared",
    ),
)


def _op(q, k, v, bias, is_causal: bool, softmax_scale: float):
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, 0.0, is_causal, scale=softmax_scale
    )
    return out, lse


def _why_unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device (PyTorch's memory-efficient attention has no CPU kernel)"
    return None


KERNEL = SdpaTarget(
    "sdpa-efficient", _op, CAPABILITIES, _why_unavailable,
    lambda: {"op": "aten::_scaled_dot_product_efficient_attention"},
)  # fmt: skip
