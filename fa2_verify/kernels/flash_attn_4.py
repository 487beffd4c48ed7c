"""``flash-attn-4``: FlashAttention-4 (``flash_attn.cute``, the CuTe DSL kernels) behind the contract.

``flash_attn.cute.flash_attn_func(q, k, v, softmax_scale=, causal=,
window_size=(left, right), deterministic=, return_lse=True)`` takes the
contract's (batch, seqlen, heads, head_dim) layout and GQA/MQA by head count,
and returns ``(out, lse)`` with the float32 natural-log LSE (batch, heads_q,
seqlen_q).  Its windows use ``None`` for an unbounded side where the contract
uses -1, and it reads ``window_size=(None, 0)`` as causal; the adapter passes
the effective window (:func:`fa4_window`) with ``causal=False``, one spelling
for every mask.  Its backward exists only through autograd: the adapter
recomputes the forward on leaf copies of q, k, v and differentiates it with
``dout``, as :mod:`kernels.flash_attn` does.

Packed sequences map onto ``flash_attn.cute.flash_attn_varlen_func``, called
with keywords only (its fourth positional parameter is ``qv``, not
``cu_seqlens_q``): (total, heads, head_dim) inputs, ``cu_seqlens_q/k`` and
``max_seqlen_q/k``, and an LSE of (heads_q, total_q), as the contract's
varlen entry points take and return them.

The kernels are JIT-compiled through the CuTe DSL (``nvidia-cutlass-dsl``)
for sm90/sm100.  Nothing is imported until asked: without the package, without
a CUDA device, or when ``import flash_attn.cute`` fails (e.g. the DSL's
``cutlass.cute`` Python package missing), :meth:`FlashAttn4.unavailable_reason` says which and every
call raises :class:`~core.errors.UnsupportedCase`.  (The DSL's ``cutlass.cute``
ships in ``nvidia-cutlass-dsl-libs-core``; lab/third-party/install-fa4.sh installs the set.)
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
from typing import Any

import torch

from fa2_verify.core.contract import UNBOUNDED, Capabilities, effective_window
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.kernels.autograd import recomputed_gradients

#: Head dims of FlashAttention-4's Hopper forward and backward.
HEAD_DIMS: tuple[int, ...] = (64, 96, 128)

#: The oldest GPU FlashAttention-4 compiles for.
MIN_CAPABILITY = (9, 0)


def fa4_window(causal: bool, window_size: tuple[int, int]) -> tuple[int | None, int | None]:
    """The contract's effective window in FlashAttention-4's spelling: ``None`` for an unbounded side."""
    left, right = (None if bound == UNBOUNDED else bound for bound in effective_window(causal, window_size))
    return left, right


def _installed() -> bool:
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except ModuleNotFoundError:
        return False


@functools.cache
def _import_failure() -> str | None:
    """Why ``import flash_attn.cute`` fails here (once per process), or None."""
    try:
        importlib.import_module("flash_attn.cute")
    except Exception as exc:  # the DSL's import can fail in any way; report it as the reason
        return f"import flash_attn.cute failed: {type(exc).__name__}: {exc}"
    return None


class FlashAttn4:
    """The ``flash-attn-4`` target."""

    capabilities = Capabilities(
        dtypes={"cuda": ("float16", "bfloat16")},
        head_dims=HEAD_DIMS,
        gqa_dkv_reproducible=False,
        notes=(
            "GQA/MQA dK, dV are summed over the group's query heads in a float32 accumulator in arbitrary order "
            "(its dKV postprocess), so they are bitwise reproducible for MHA only",
            "needs flash-attn-4 with nvidia-cutlass-dsl and an sm90+ GPU (CuTe DSL kernels, compiled on first use)",
            "deterministic=True exists in its API but is not declared until it has run on a GPU",
        ),
        varlen=True,
    )

    def unavailable_reason(self) -> str | None:
        if not _installed():
            return ("package flash-attn-4 not installed (pip install flash-attn-4 nvidia-cutlass-dsl; "
                    "without network: lab/third-party/fetch-fa4-wheels.sh, then lab/third-party/install-fa4.sh)")
        if not torch.cuda.is_available():
            return "needs a CUDA device (FlashAttention-4 runs on sm90+ GPUs only)"
        capability = torch.cuda.get_device_capability()
        if capability < MIN_CAPABILITY:
            return f"needs an sm90+ GPU; this one is sm{capability[0]}{capability[1]}"
        return _import_failure()

    def config(self) -> dict[str, Any]:
        try:
            version = importlib.metadata.version("flash-attn-4")
        except importlib.metadata.PackageNotFoundError:
            version = None
        return {"kernel": "flash-attn-4", "flash_attn_4": version}

    def _call(self, name: str, softmax_scale, causal, window_size, **packing):
        """``flash_attn.cute.<name>`` with the case's scale and mask bound, in FlashAttention-4's spelling
        (:func:`fa4_window`, ``causal=False``), and a packed batch's ``cu_seqlens``/``max_seqlen`` keywords."""
        reason = self.unavailable_reason()
        if reason is not None:
            raise UnsupportedCase(f"flash-attn-4: {reason}")
        function = getattr(importlib.import_module("flash_attn.cute"), name)
        return functools.partial(function, softmax_scale=softmax_scale, causal=False,
                                 window_size=fa4_window(causal, window_size), **packing)  # fmt: skip

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out, lse = self._call("flash_attn_func", softmax_scale, causal, window_size)(q, k, v, return_lse=True)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED),
                 deterministic=False):  # fmt: skip
        function = self._call("flash_attn_func", softmax_scale, causal, window_size)
        return recomputed_gradients(lambda *leaves: function(*leaves)[0], dout, q, k, v)

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale,
                       causal=False, window_size=(UNBOUNDED, UNBOUNDED)):  # fmt: skip
        function = self._call("flash_attn_varlen_func", softmax_scale, causal, window_size, cu_seqlens_q=cu_seqlens_q,
                              cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)  # fmt: skip
        out, lse = function(q, k, v, return_lse=True)
        return out, lse

    def backward_varlen(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                        softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):  # fmt: skip
        function = self._call("flash_attn_varlen_func", softmax_scale, causal, window_size, cu_seqlens_q=cu_seqlens_q,
                              cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)  # fmt: skip
        return recomputed_gradients(lambda *leaves: function(*leaves)[0], dout, q, k, v)

KERNEL = FlashAttn4()
