"""``flex-attention``: PyTorch's FlexAttention, compiled, behind the contract.

``torch.nn.attention.flex_attention.flex_attention(q, k, v, block_mask=,
scale=, enable_gqa=True, return_lse=True)`` works in (batch, heads, seqlen,
head_dim) layout (the adapter passes ``transpose(1, 2)`` views), reads kv head
``h // (heads_q // heads_kv)`` with ``enable_gqa=True`` and returns the
float32 LSE in the natural log (``return_aux=AuxRequest(lse=True)``; the
frontend converts its kernels' base-2 LSE back, pytorch/pytorch#133159).  The contract's masks are ``mask_mod``
functions aligned to the bottom-right corner (:func:`window_mask_mod`), turned
into a ``BlockMask`` by ``create_block_mask``; an unmasked call passes none.
The function is wrapped in ``torch.compile`` once per process (FlexAttention
is meant to run compiled; eager runs a slow reference), and the backward is
its autograd formula on leaf copies of q, k, v, recomputing the forward.

Every call runs the compiled kernel or fails (:data:`NEVER_EAGER`): Dynamo
compiles ``flex_attention`` anew for each shape, dtype and mask, and by
default, past its recompile limit (8 entries) or on an error it suppresses,
it runs the function eagerly instead, with a warning.  Eager FlexAttention is
its unfused reference (scores materialized in the input dtype), a different
kernel with different numerics: a property run draws far more than 8
shapes per process, so without this most of its examples would have checked
the reference, not FlexAttention's kernels.

Short GQA queries do not compile: below 128 queries FlexAttention lowers a
grouped call to its decoding template, which packs the group's rows (query
heads per kv head x seqlen_q) into one tile, and where they exceed 128 Inductor
raises ``LoweringException: NoValidChoicesError`` (docs/targets.md gives the
probe grid).  PyTorch documents no such limit; the adapter declines those
shapes (:func:`_group_rows_limit`) before compiling, so the suite reports the
limit once, as a finding, and checks every other shape.

Sequences must be non-empty (``create_block_mask`` needs a length): declared
as ``min_seqlen=1``.  It runs on CUDA (an sm80+ GPU) only: compiled
FlexAttention on the CPU (torch 2.13) supports neither ``return_lse`` nor the
backward ("torch.compile on CPU only supports inference").  The adapter's own
forward logic (layout, masks, GQA, LSE) is checked on the CPU with the
uncompiled function in tests/test_targets_adapters.py (eager FlexAttention has
no CPU backward either).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from fa2_verify.core.contract import UNBOUNDED, Capabilities, effective_window
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.kernels.autograd import recomputed_gradients

#: Head dims declared: powers of two from 16 to 128, which its Triton templates tile without padding.
HEAD_DIMS: tuple[int, ...] = (16, 32, 64, 128)


def window_mask_mod(seqlen_q: int, seqlen_k: int, window: tuple[int, int]) -> Callable:
    """``mask_mod(b, h, q_idx, kv_idx)``: True where query ``i`` sees key ``j`` under bottom-right alignment.

    Query ``i`` sees key ``j`` iff ``i + sk - sq - left <= j <= i + sk - sq + right``
    (-1: unbounded side), as :func:`core.contract.visible_ranges`.
    """
    shift = seqlen_k - seqlen_q
    left, right = window

    def mask_mod(batch, head, q_idx, kv_idx):
        diagonal = q_idx + shift
        visible = kv_idx >= 0
        if left != UNBOUNDED:
            visible = visible & (kv_idx >= diagonal - left)
        if right != UNBOUNDED:
            visible = visible & (kv_idx <= diagonal + right)
        return visible

    return mask_mod


#: Dynamo settings for every call of the compiled function: room for one compiled entry per shape, dtype and
#: mask a run draws, a hard error (not an eager fallback) where even that is exceeded, no suppressed errors.
NEVER_EAGER: dict[str, Any] = {
    "recompile_limit": 4096,
    "accumulated_recompile_limit": 4096,
    "fail_on_recompile_limit_hit": True,
    "suppress_errors": False,
}


@functools.cache
def _compiled() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False, fullgraph=True)


def _block_mask(seqlen_q: int, seqlen_k: int, window: tuple[int, int], device: torch.device):
    if window == (UNBOUNDED, UNBOUNDED):
        return None
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(
        window_mask_mod(seqlen_q, seqlen_k, window), B=None, H=None, Q_LEN=seqlen_q, KV_LEN=seqlen_k, device=device
    )


def _attention(q, k, v, *, softmax_scale: float, causal: bool, window_size) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` in the contract's layout."""
    block_mask = _block_mask(q.shape[1], k.shape[1], effective_window(causal, window_size), q.device)
    from torch.nn.attention.flex_attention import AuxRequest

    with torch._dynamo.config.patch(NEVER_EAGER):
        out, aux = _compiled()(
            *(t.transpose(1, 2) for t in (q, k, v)), block_mask=block_mask, scale=softmax_scale, enable_gqa=True,
            return_aux=AuxRequest(lse=True),
        )  # fmt: skip
    return out.transpose(1, 2), aux.lse


def _gradients(dout, q, k, v, *, softmax_scale: float, causal: bool, window_size) -> tuple[torch.Tensor, ...]:
    """``(dq, dk, dv)``: the autograd formula of :func:`_attention` on leaf copies of q, k, v."""
    masking = {"softmax_scale": softmax_scale, "causal": causal, "window_size": window_size}
    return recomputed_gradients(lambda *leaves: _attention(*leaves, **masking)[0], dout, q, k, v)


#: Longest query FlexAttention lowers to its decoding template, and the most rows (group x seqlen_q) it packs.
DECODING_ROWS = 128


def _group_rows_limit(seqlen_q: int, heads_q: int, heads_kv: int) -> str | None:
    """Why FlexAttention cannot compile this grouping, or ``None``."""
    rows = heads_q // heads_kv * seqlen_q
    if heads_q != heads_kv and seqlen_q < DECODING_ROWS < rows:
        return (
            f"FlexAttention does not compile GQA queries shorter than {DECODING_ROWS} whose group rows exceed"
            f" {DECODING_ROWS} ({heads_q // heads_kv} x {seqlen_q} = {rows}: Inductor's NoValidChoicesError)"
        )
    return None


class FlexAttention:
    """The ``flex-attention`` target."""

    capabilities = Capabilities(
        dtypes={"cuda": ("float16", "bfloat16", "float32")},
        head_dims=HEAD_DIMS,
        min_seqlen=1,
        notes=(
            "compiled with torch.compile; the first call of each shape compiles (seconds to minutes)",
            "masks as bottom-right aligned mask_mods; GQA/MQA through enable_gqa=True",
            "declines GQA queries shorter than 128 whose group rows exceed 128 (they do not compile)",
            "cuda only (sm80+): compiled on the CPU it supports neither return_lse nor a backward (torch 2.13)",
        ),
    )

    def unavailable_reason(self) -> str | None:
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError as exc:
            return f"this PyTorch has no FlexAttention ({exc})"
        if not torch.cuda.is_available():
            return "needs a CUDA device (compiled FlexAttention on the CPU has no return_lse and no backward)"
        return None

    def config(self) -> dict[str, Any]:
        return {"kernel": "flex-attention", "torch": torch.__version__, "compiled": True}

    def _require(self, q: torch.Tensor, k: torch.Tensor) -> None:
        reason = self.unavailable_reason()
        if reason is None and q.device.type == "cuda" and torch.cuda.get_device_capability(q.device) < (8, 0):
            reason = "FlexAttention's Triton kernels need an sm80+ GPU"
        if reason is None:
            reason = _group_rows_limit(q.shape[1], q.shape[2], k.shape[2])
        if reason is not None:
            raise UnsupportedCase(f"flex-attention: {reason}")

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        self._require(q, k)
        return _attention(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED),
                 deterministic=False):  # fmt: skip
        self._require(q, k)
        return _gradients(dout, q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)


KERNEL = FlexAttention()
