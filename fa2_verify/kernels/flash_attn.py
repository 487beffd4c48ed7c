"""``flash-attn``: the flash-attn package (Dao 2023, FlashAttention-2) behind the kernel contract.

The contract maps one to one onto ``flash_attn.flash_attn_func`` (flash-attn
>= 2.4): the (batch, seqlen, heads, head_dim) layout, ``softmax_scale``,
``causal`` and ``window_size`` (flash-attn's own, bottom-right aligned since
2.1), GQA/MQA by head count; ``return_attn_probs=True`` returns the float32
natural-log LSE (batch, heads_q, seqlen_q) beside the output, and
``dropout_p=0``.  Packed sequences map onto ``flash_attn_varlen_func``, whose
LSE is (heads_q, total_q).

Backward: flash-attn exposes its backward only through autograd (its
low-level ``_flash_attn_backward`` changes signature between releases), so
:meth:`FlashAttn.backward` runs ``flash_attn_func(..., deterministic=...)``
on the given q, k, v with gradients enabled and differentiates it with
``dout``.  flash-attn's forward is deterministic, so the out and lse it saves
for its backward are the ones :meth:`forward` returned for the same inputs;
the ``out``/``lse`` arguments are therefore not passed on.

Nothing is imported until a call: without the package,
:meth:`FlashAttn.unavailable_reason` says so and every call raises
:class:`~core.errors.UnsupportedCase` with that reason.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

import torch

from fa2_verify.core.contract import Capabilities
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.kernels.autograd import recomputed_gradients

#: flash-attn 2 supports head dims up to 256 that are multiples of 8.
HEAD_DIMS: tuple[int, ...] = tuple(range(8, 257, 8))

#: A build of flash-attn with a subset of its head-dim templates (lab/third-party/build-flash-attn.sh) declares the
#: head dims it runs exactly, as a comma-separated list in this variable.
HEAD_DIMS_ENV = "FA2_FLASH_ATTN_HEAD_DIMS"


def _declared_head_dims() -> tuple[int, ...]:
    listed = os.environ.get(HEAD_DIMS_ENV, "")
    return tuple(int(dim) for dim in listed.split(",")) if listed else HEAD_DIMS


def _package_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _cuda_available() -> bool:
    return torch.cuda.is_available()


class FlashAttn:
    """The ``flash-attn`` target."""

    capabilities = Capabilities(
        dtypes={"cuda": ("float16", "bfloat16")},
        head_dims=_declared_head_dims(),
        causal=True,
        window=True,
        gqa=True,
        backward=True,
        deterministic_backward=True,
        varlen=True,
        notes=("needs flash-attn >= 2.4 (sliding windows, deterministic backward) and an sm80+ GPU",),
    )

    def unavailable_reason(self) -> str | None:
        if not _package_installed():
            return ("the flash-attn package is not installed "
                    "(pip install flash-attn --no-build-isolation; it compiles CUDA extensions)")
        if not _cuda_available():
            return "no CUDA device is visible (flash-attn runs on CUDA only)"
        return None

    def config(self) -> dict[str, Any]:
        version = None
        if _package_installed():
            version = getattr(importlib.import_module("flash_attn"), "__version__", None)
        return {"kernel": "flash-attn", "flash_attn": version}

    def _package(self):
        reason = self.unavailable_reason()
        if reason is not None:
            raise UnsupportedCase(f"flash-attn: {reason}")
        return importlib.import_module("flash_attn")

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1)):
        out, lse, _ = self._package().flash_attn_func(
            q, k, v, dropout_p=0.0, softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size),
            return_attn_probs=True,
        )
        return out, lse

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(-1, -1),
                 deterministic=False):
        package = self._package()
        return recomputed_gradients(
            lambda *leaves: package.flash_attn_func(
                *leaves, dropout_p=0.0, softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size),
                deterministic=deterministic,
            ),
            dout, q, k, v,
        )

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                       softmax_scale, causal=False, window_size=(-1, -1)):
        out, lse, _ = self._package().flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
            softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size), return_attn_probs=True,
        )
        return out, lse

    def backward_varlen(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                        softmax_scale, causal=False, window_size=(-1, -1), deterministic=False):
        package = self._package()
        return recomputed_gradients(
            lambda *leaves: package.flash_attn_varlen_func(
                *leaves, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size),
                deterministic=deterministic,
            ),
            dout, q, k, v,
        )


KERNEL = FlashAttn()
