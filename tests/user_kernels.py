"""Kernels as a user writes them: plain autograd functions, each made a target by one call.

* ``BHSD_NO_LSE``: attention in (batch, heads, seqlen, head_dim) layout that
  returns only ``out`` (no LSE), causal masks, GQA by repeating K and V.
* ``MULTIPLE_OF_16``: attention in (batch, seqlen, heads, head_dim) layout
  that returns ``(out, lse)`` with a base-2 LSE and rejects any sequence length
  that is not a multiple of 16, declared with plain-dict capabilities.
* ``FORWARD_ONLY``: ``BHSD_NO_LSE``'s function declared without a backward
  (an inference kernel).

The three adapters of docs/targets.md, "Verify your own kernel", exactly as
printed there (between the ``# docs:`` markers; tests/test_conventions.py
checks that the doc shows them unchanged):

* ``SDPA``: PyTorch SDPA's argument names (``is_causal``, ``scale``), BHSD,
  no LSE, MHA only, no windows, top-left causal masks.
* ``WITH_LSE``: a forward-only kernel returning ``(out, lse)``.
* ``CAUSAL_TOP_LEFT``: a causal-only kernel with top-left masks and the
  Triton tutorial's positional ``sm_scale``.

Loadable as ``tests.user_kernels:NAME`` by ``fa2-verify run`` and the property
suite; nothing else adapts them.
"""

from __future__ import annotations

import math

import torch

import fa2_verify
from fa2_verify.core.contract import visible_mask

#: The length every side of a ``MULTIPLE_OF_16`` call must be a multiple of.
SEQLEN_MULTIPLE = 16


def _masked_scores_and_probabilities(q, k, *, causal: bool, softmax_scale: float):
    """Scores (-inf where hidden) and softmax in float32, (batch, heads, seqlen_q, seqlen_k); P = 0 on a row without keys."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * softmax_scale
    visible = visible_mask(q.shape[-2], k.shape[-2], causal=causal, device=q.device)
    empty_rows = ~visible.any(dim=-1, keepdim=True)
    safe = torch.where(visible, scores, torch.where(empty_rows, 0.0, -math.inf))
    return scores.masked_fill(~visible, -math.inf), torch.softmax(safe, dim=-1).masked_fill(~visible, 0.0)


def _repeat_kv(q, k, v, head_axis: int):
    group = q.shape[head_axis] // k.shape[head_axis]
    return k.repeat_interleave(group, dim=head_axis), v.repeat_interleave(group, dim=head_axis)


def bhsd_attention(q, k, v, *, causal=False, softmax_scale=None):
    """``softmax(q k^T * scale) v`` in BHSD layout, float32 inside, ``out`` in q's dtype; no LSE."""
    k, v = _repeat_kv(q, k, v, head_axis=1)
    _, probabilities = _masked_scores_and_probabilities(q, k, causal=causal, softmax_scale=softmax_scale)
    return (probabilities @ v.float()).to(q.dtype)


def multiple_of_16_attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1)):
    """``(out, lse2)`` in BSHD layout with a base-2 LSE; raises unless both lengths are multiples of 16."""
    if q.shape[1] % SEQLEN_MULTIPLE or k.shape[1] % SEQLEN_MULTIPLE:
        raise ValueError(f"seqlens {q.shape[1]}, {k.shape[1]} must be multiples of {SEQLEN_MULTIPLE}")
    if tuple(window_size) != (-1, -1):
        raise ValueError("no sliding windows")
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = _repeat_kv(q, k, v, head_axis=1)
    scores, probabilities = _masked_scores_and_probabilities(q, k, causal=causal, softmax_scale=softmax_scale)
    lse2 = torch.logsumexp(scores, dim=-1) / math.log(2)
    return (probabilities @ v.float()).to(q.dtype).transpose(1, 2), lse2


BHSD_NO_LSE = fa2_verify.autograd_target(
    bhsd_attention,
    layout="bhsd",
    capabilities={"dtypes": {"cpu": ["float16", "float32"]}, "head_dims": [8, 16, 32, 40, 64], "window": False},
)

MULTIPLE_OF_16 = fa2_verify.autograd_target(
    multiple_of_16_attention,
    lse=lambda returned: returned[1],
    lse_base=2,
    capabilities={
        "dtypes": {"cpu": ["float16", "float32"]},
        "head_dims": [8, 16, 32, 40, 64],
        "window": False,
        "seqlen_multiple_of": SEQLEN_MULTIPLE,
    },
)

FORWARD_ONLY = fa2_verify.autograd_target(
    bhsd_attention,
    layout="bhsd",
    capabilities={"dtypes": {"cpu": ["float16", "float32"]}, "head_dims": [8, 16, 32, 40, 64], "window": False,
                  "backward": False},
)


# docs: sdpa
def attn(q, k, v, is_causal=False, scale=None):  # the package's function, (batch, heads, seqlen, head_dim)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)


SDPA = fa2_verify.autograd_target(
    attn,  # argnames found in its signature: is_causal, scale
    layout="bhsd",  # no lse=...: the LSE is reported unsupported, never passed
    capabilities={"dtypes": {"cpu": ["float16", "bfloat16", "float32"]}, "head_dims": [32, 40, 64],
                  "gqa": False, "window": False, "causal_alignment": "top_left"},
)
# docs: end


# docs: with-lse
def attn_with_lse(q, k, v, causal=False, softmax_scale=None):  # (batch, seqlen, heads, head_dim)
    mask = visible_mask(q.shape[1], k.shape[1], causal=causal)
    scores = torch.einsum("bihd,bjhd->bhij", q.float(), k.float()) * softmax_scale
    lse = torch.logsumexp(scores.masked_fill(~mask, -math.inf), dim=-1)  # (batch, heads, seqlen_q)
    out = torch.einsum("bhij,bjhd->bihd", torch.exp(scores - lse[..., None]).masked_fill(~mask, 0), v.float())
    return out.to(q.dtype), lse


WITH_LSE = fa2_verify.autograd_target(
    attn_with_lse,
    lse=lambda returned: returned[1],
    capabilities={"dtypes": {"cpu": ["float16", "bfloat16", "float32"]}, "head_dims": [32, 40, 64], "gqa": False,
                  "window": False, "backward": False},
)
# docs: end


# docs: causal-top-left
def causal_attn(q, k, v, sm_scale):  # causal only; query i sees keys 0..i whatever the lengths
    scores = (q.float() @ k.float().transpose(-1, -2)) * sm_scale
    hidden = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
    return (torch.softmax(scores.masked_fill(hidden, -math.inf), dim=-1) @ v.float()).to(q.dtype)


CAUSAL_TOP_LEFT = fa2_verify.autograd_target(
    causal_attn,
    layout="bhsd",
    capabilities={"dtypes": {"cpu": ["float16", "bfloat16", "float32"]}, "head_dims": [32, 40, 64],
                  "causal_only": True, "causal_alignment": "top_left", "gqa": False, "window": False},
)
# docs: end
