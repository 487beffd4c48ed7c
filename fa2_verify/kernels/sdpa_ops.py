"""What the adapters of PyTorch's fused SDPA ops share: layout, masks as a bias, GQA, and the call pattern.

PyTorch's memory-efficient and cuDNN attention ops
(``aten::_scaled_dot_product_efficient_attention``,
``aten::_scaled_dot_product_cudnn_attention``) take (batch, heads, seqlen,
head_dim) tensors, one ``is_causal`` flag that is top-left aligned, an optional
additive ``attn_bias``, and no GQA.  The contract maps onto them thus:

* layout: the adapter passes ``transpose(1, 2)`` views and transposes ``out``
  back (:func:`heads_first`);
* masks: ``is_causal`` only where top-left and bottom-right alignment agree
  (``causal`` with no left window and ``seqlen_q == seqlen_k``); every other
  mask is an additive bias, 0 where query ``i`` sees key ``j``
  (:func:`core.contract.visible_mask`) and ``-inf`` elsewhere, allocated with
  its last dimension padded to a multiple of :data:`BIAS_ALIGNMENT` and sliced
  back (the alignment the memory-efficient kernel wants for its bias rows);
* GQA/MQA: K and V repeated over each group of query heads
  (``repeat_interleave``, so query head ``h`` reads kv head ``h // group``);
  the backward differentiates through the repeat, which sums each group's
  dK, dV back onto its kv head;
* LSE: the op's float32 natural-log LSE, trimmed to (batch, heads_q, seqlen_q)
  (the memory-efficient op pads seqlen_q; cuDNN may add a trailing axis of 1),
  with ``-inf`` on the rows that see no key, where the memory-efficient op
  writes 0;
* backward: the op's autograd formula on leaf copies of q, k, v
  (``torch.autograd.grad``), recomputing the forward, as
  :mod:`kernels.autograd` does; the contract's ``out``/``lse`` are not reused.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from fa2_verify.core.contract import UNBOUNDED, Capabilities, effective_window, visible_mask, visible_ranges
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.kernels.autograd import recomputed_gradients

#: Multiple the bias's last (key) dimension is allocated at before slicing.
BIAS_ALIGNMENT = 16

#: ``op(q, k, v, attn_bias, is_causal, softmax_scale) -> (out, lse)`` in (batch, heads, seqlen, head_dim).
SdpaOp = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool, float], tuple]


def heads_first(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(batch, seqlen, heads, head_dim) <-> (batch, heads, seqlen, head_dim) views."""
    return tuple(t.transpose(1, 2) for t in tensors)


def mask_arguments(
    q: torch.Tensor, seqlen_k: int, causal: bool, window_size: tuple[int, int]
) -> tuple[torch.Tensor | None, bool]:
    """``(attn_bias, is_causal)`` for the contract's mask on BHSD ``q`` (see the module docstring)."""
    batch, heads, seqlen_q, _ = q.shape
    window = effective_window(causal, window_size)
    if window == (UNBOUNDED, UNBOUNDED):
        return None, False
    if window == (UNBOUNDED, 0) and seqlen_q == seqlen_k:
        return None, True
    visible = visible_mask(seqlen_q, seqlen_k, window_size=window, device=q.device)
    padded = math.ceil(seqlen_k / BIAS_ALIGNMENT) * BIAS_ALIGNMENT
    storage = torch.zeros(seqlen_q, padded, dtype=q.dtype, device=q.device)
    bias = storage[:, :seqlen_k].masked_fill_(~visible, -math.inf)
    return bias.expand(batch, heads, seqlen_q, seqlen_k), False


def repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V (BHSD) repeated over each group of query heads."""
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def trimmed_lse(lse: torch.Tensor, batch: int, heads: int, seqlen_q: int) -> torch.Tensor:
    """The op's LSE as the contract's float32 (batch, heads_q, seqlen_q)."""
    if lse.dim() == 4:
        lse = lse[..., 0]
    return lse[:, :, :seqlen_q].to(torch.float32).reshape(batch, heads, seqlen_q)


def sdpa_forward(op: SdpaOp, q, k, v, *, softmax_scale: float, causal: bool, window_size) -> tuple:
    """``(out, lse)`` in the contract's layout from a BHSD ``op``.

    A row that sees no key gets ``lse = -inf`` (the contract): the
    memory-efficient op writes 0 there (seen on an H100, docs/targets.md),
    beside the row's correct ``out = 0``.
    """
    q_bhsd, k_bhsd, v_bhsd = heads_first(q, k, v)
    k_bhsd, v_bhsd = repeat_kv(q_bhsd, k_bhsd, v_bhsd)
    bias, is_causal = mask_arguments(q_bhsd, k.shape[1], causal, window_size)
    out, lse = op(q_bhsd, k_bhsd, v_bhsd, bias, is_causal, softmax_scale)
    lse = trimmed_lse(lse, q.shape[0], q.shape[2], q.shape[1])
    first, last = visible_ranges(q.shape[1], k.shape[1], causal=causal, window_size=window_size, device=lse.device)
    return out.transpose(1, 2), lse.masked_fill(first > last, -math.inf)


def sdpa_backward(op: SdpaOp, dout, q, k, v, *, softmax_scale: float, causal: bool, window_size) -> tuple:
    """``(dq, dk, dv)`` through the op's autograd formula, on leaf copies of q, k, v."""
    masking = {"softmax_scale": softmax_scale, "causal": causal, "window_size": window_size}
    return recomputed_gradients(lambda *leaves: sdpa_forward(op, *leaves, **masking)[0], dout, q, k, v)


class SdpaTarget:
    """A fused SDPA op as a kernel target: ``name``, the BHSD ``op``, honest ``capabilities``,
    ``why_unavailable()`` (None where it runs), ``describe()`` (what a run records) and
    ``backward_limit(seqlen_q, seqlen_k)``: why the op's backward refuses those lengths, or None."""

    def __init__(
        self,
        name: str,
        op: SdpaOp,
        capabilities: Capabilities,
        why_unavailable: Callable[[], str | None],
        describe: Callable[[], dict[str, Any]],
        backward_limit: Callable[[int, int], str | None] = lambda seqlen_q, seqlen_k: None,
    ) -> None:
        self.name = name
        self.op = op
        self.capabilities = capabilities
        self._why_unavailable = why_unavailable
        self._describe = describe
        self._backward_limit = backward_limit

    def unavailable_reason(self) -> str | None:
        return self._why_unavailable()

    def config(self) -> dict[str, Any]:
        return {"kernel": self.name, "torch": torch.__version__, **self._describe()}

    def _require_available(self) -> None:
        """Raise :class:`UnsupportedCase` with the reason the op cannot run here."""
        reason = self.unavailable_reason()
        if reason is not None:
            raise UnsupportedCase(f"{self.name}: {reason}")

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        self._require_available()
        return sdpa_forward(self.op, q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED),
                 deterministic=False):  # fmt: skip
        self._require_available()
        limit = self._backward_limit(q.shape[1], k.shape[1])
        if limit is not None:
            raise UnsupportedCase(f"{self.name}: {limit}")
        return sdpa_backward(self.op, dout, q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
