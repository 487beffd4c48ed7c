"""A forward-only Triton attention kernel that autotunes per shape, as kernels published on the package index do.

``_forward`` is FlashAttention-2's forward (Dao 2023, Algorithm 1: a running
maximum, ``P`` rounded to the input dtype for the ``P V`` product, one
division by ``l`` at the end) under ``@triton.autotune`` over four tile
configurations keyed on the lengths and the head dim, so every new shape
class costs four compiles and a timed run of each: what makes a property
suite that draws a new shape per example run out of time (issue "Other
people's kernels", docs/properties.md).  :data:`AUTOTUNED` is its target,
``tests.triton_autotuned:AUTOTUNED``: (batch, seqlen, heads, head_dim)
tensors, causal aligned bottom-right, GQA, head dims 16 to 128 (powers of
two), float16 and bfloat16 on a GPU (float16 under Triton's interpreter,
which cannot time the configurations and runs the first), with its
natural-log LSE; no window, no backward.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

import fa2_verify

_CONFIGS = [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=2)
            for block_m, block_n, warps in ((64, 32, 4), (64, 64, 4), (128, 32, 8), (128, 64, 8))]


@triton.autotune(configs=_CONFIGS, key=["seqlen_q", "seqlen_k", "HEAD_DIM"])
@triton.jit
def _forward(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, scale, seqlen_q, seqlen_k, heads,
             stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
             stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
             GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    batch = tl.program_id(1) // heads
    head = tl.program_id(1) % heads
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qs + dims[None, :],
                mask=rows[:, None] < seqlen_q, other=0.0)
    k_base = k_ptr + batch * stride_kb + (head // GROUP) * stride_kh
    v_base = v_ptr + batch * stride_vb + (head // GROUP) * stride_vh
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    diagonal = seqlen_k - seqlen_q  # bottom-right: row i sees the keys j <= i + diagonal
    end = seqlen_k
    if CAUSAL:
        end = tl.minimum(seqlen_k, (start_m + 1) * BLOCK_M + diagonal)
    for start_n in range(0, end, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + keys[None, :] * stride_ks + dims[:, None], mask=keys[None, :] < seqlen_k, other=0.0)
        scores = tl.dot(q, k) * scale
        visible = keys[None, :] < seqlen_k
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + diagonal)
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.exp(scores - safe_max[:, None])
        rescale = tl.exp(row_max - safe_max)
        row_sum = row_sum * rescale + tl.sum(p, 1)
        v = tl.load(v_base + keys[:, None] * stride_vs + dims[None, :], mask=keys[:, None] < seqlen_k, other=0.0)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        row_max = new_max
    seen = row_sum > 0
    out = acc / tl.where(seen, row_sum, 1.0)[:, None]
    lse = tl.where(seen, row_max + tl.log(tl.where(seen, row_sum, 1.0)), float("-inf"))
    tl.store(out_ptr + batch * stride_ob + head * stride_oh + rows[:, None] * stride_os + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=rows[:, None] < seqlen_q)
    tl.store(lse_ptr + batch * stride_lb + head * stride_lh + rows, lse, mask=rows < seqlen_q)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              softmax_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of (batch, seqlen, heads, head_dim) ``q``, ``k``, ``v``; ``lse`` (batch, heads, seqlen_q)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    q, k, v = (tensor if tensor.stride(-1) == 1 else tensor.contiguous() for tensor in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(head_dim)

    def grid(meta):
        return (triton.cdiv(seqlen_q, meta["BLOCK_M"]), batch * heads)

    # Triton's interpreter (the CPU) cannot time the configurations: it runs the first one untuned
    kernel, tiles = (_forward, {}) if q.is_cuda else (_forward.fn, _CONFIGS[0].kwargs)
    kernel[grid](q, k, v, out, lse, scale, seqlen_q, seqlen_k, heads, *q.stride()[:3], *k.stride()[:3],
                 *v.stride()[:3], *out.stride()[:3], *lse.stride()[:2],
                 GROUP=heads // heads_kv, HEAD_DIM=head_dim, CAUSAL=causal, **tiles)
    return out, lse


AUTOTUNED = fa2_verify.autograd_target(
    attention,
    lse=lambda returned: returned[1],
    capabilities={"dtypes": {"cuda": ["float16", "bfloat16"], "cpu": ["float16"]}, "head_dims": [16, 32, 64, 128],
                  "gqa": True, "window": False, "backward": False},
)
