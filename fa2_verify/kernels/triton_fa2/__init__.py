"""Bundled FlashAttention-2 forward and backward kernels in Triton (registry name ``triton``).

Forward (Dao 2023, Algorithm 1): online softmax with deferred normalisation
in the log2 domain (``exp2`` with the scale folded in), storing only the
log-sum-exp (float32, natural log).  Backward (Algorithm 2): recomputes P from
the LSE, parallel over key tiles; dQ is accumulated across key tiles with fp32
atomic adds, or, with ``deterministic=True`` (and by default where the tile
table finds it faster: 16-bit head_dim 64 on Hopper), by a separate pass over
query tiles that is bitwise reproducible.  docs/triton-kernel.md has the design.

Entry points (``KERNEL`` implements the contract of :mod:`core.contract`)::

    forward(q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1)) -> (out, lse)
        q (batch, seqlen_q, heads_q, head_dim); k, v (batch, seqlen_k, heads_kv, head_dim)
        out like q; lse float32 (batch, heads_q, seqlen_q)
    backward(dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(-1, -1),
             deterministic=False) -> (dq, dk, dv)
    forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                   softmax_scale, causal=False, window_size=(-1, -1)) -> (out, lse)
        packed sequences, flash-attn style: q (total_q, heads_q, head_dim),
        k, v (total_k, heads_kv, head_dim); cu_seqlens_* int32 (batch + 1,) cumulative
        lengths starting at 0 (a sequence may have length 0); max_seqlen_* >= the longest;
        out like q; lse float32 (heads_q, total_q).  Masks align each sequence's own
        bottom-right corners.
    backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                    softmax_scale, causal=False, window_size=(-1, -1), deterministic=False) -> (dq, dk, dv)

Masks are bottom-right aligned; GQA/MQA when heads_q is a multiple of
heads_kv; any seqlens (including 0 and 1); head_dim a multiple of 8 from 32
to 256 (padded to a power of two with masked loads); float16, bfloat16 and
float32 (fp32 products in true fp32, ``input_precision="ieee"``).  A row
that sees no key gets out = 0, lse = +inf, dq = 0.  Arbitrary strides are
passed to the kernels; a head_dim stride other than 1 is copied first.

Compile-time values (one Triton variant each; docs/triton-kernel.md, "Compile
variants"): the dtype, the padded head-dim block ``BLOCK_D`` and whether the
head dim fills it (``EVEN_D``: its column masks fold away), the tiles, warps
and stages, varlen, TMA, atomic or deterministic dQ, whether the tile loop
has a lower window bound (``HAS_LEFT``/``HAS_RIGHT``: without one its leading
masked range compiles away), each tensor's stride unit (the largest power of
two up to 16 bytes dividing its strides: the alignment 128-bit loads need)
and a GQA group of 1 in the backward.  Everything else is a runtime value:
sequence lengths, the head dim within its block, the window bounds (an absent
one is ``plans.NO_BOUND``), the strides in their unit.  :mod:`.plans` computes
every launch's arguments as a pure function of the call, :mod:`.variants`
reads Triton's compile key from them without a GPU (``python -m
lab.probes.count_variants``), and ``fa2-verify warmup`` compiles a profile's
variants in parallel ahead of a suite run.

Where it runs is computed from the environment (:mod:`.environment`): CUDA
when a GPU is visible, the CPU under ``TRITON_INTERPRET=1`` (float16 and
float32).  Importing this package imports neither Triton nor the kernels.
"""

from __future__ import annotations

from typing import Any

from fa2_verify.core.contract import Capabilities
from fa2_verify.kernels.triton_fa2 import configs, environment
from fa2_verify.core.errors import UnsupportedCase


def _launch():
    """The launch module, imported on first use (it imports Triton and decorates the kernels)."""
    reason = environment.current().unavailable_reason()
    if reason is not None:
        raise UnsupportedCase(f"triton kernel: {reason}")
    from fa2_verify.kernels.triton_fa2 import launch

    return launch


class TritonFA2:
    """The ``triton`` target: the contract plus varlen, ``unavailable_reason`` and ``config``."""

    @property
    def capabilities(self) -> Capabilities:
        return environment.current().capabilities

    def unavailable_reason(self) -> str | None:
        return environment.current().unavailable_reason()

    def config(self) -> dict[str, Any]:
        """Where the kernels run and the tiles each call shape of this process used."""
        env = environment.current()
        return {
            "kernel": "triton_fa2",
            "interpret": env.interpret,
            "tiles_by_call": configs.recorded(),
        }

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1)):
        return _launch().forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(-1, -1),
                 deterministic=False):
        return _launch().backward(dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal,
                                  window_size=window_size, deterministic=deterministic)

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                       softmax_scale, causal=False, window_size=(-1, -1)):
        return _launch().forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        softmax_scale=softmax_scale, causal=causal, window_size=window_size)

    def backward_varlen(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                        softmax_scale, causal=False, window_size=(-1, -1), deterministic=False):
        return _launch().backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                         max_seqlen_q, max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                                         window_size=window_size, deterministic=deterministic)


KERNEL = TritonFA2()
