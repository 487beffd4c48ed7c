"""Memory layouts of a case's inputs: the same values, other strides.

A kernel must give the same outputs whatever the strides of its inputs (the
contract fixes the logical layout, not the memory one).  The layout property
(:mod:`properties.relation_checks`) and the benchmark's strided cases
(:mod:`bench.checks`) build their inputs here.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fa2_verify.core.case import Case

#: Non-contiguous layouts; the last dimension keeps stride 1, as FA2 kernels require.
LAYOUTS: tuple[str, ...] = ("contiguous", "heads-major", "padded-head-dim", "strided-seqlen")


def to_layout(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``tensor`` (batch, seqlen, heads, head_dim) in the memory layout ``layout``."""
    if layout == "contiguous":
        return tensor.contiguous()
    if layout == "heads-major":
        return tensor.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "padded-head-dim":
        padded = torch.full((*tensor.shape[:-1], tensor.shape[-1] + 8), math.nan, dtype=tensor.dtype, device=tensor.device)
        padded[..., : tensor.shape[-1]] = tensor
        return padded[..., : tensor.shape[-1]]
    if layout == "strided-seqlen":
        batch, seqlen, heads, head_dim = tensor.shape
        spread = torch.full((batch, 2 * seqlen, heads, head_dim), math.nan, dtype=tensor.dtype, device=tensor.device)
        spread[:, ::2] = tensor
        return spread[:, ::2]
    raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")


def in_layout(case: Case, layout: str) -> Case:
    """``case`` with q, k, v and dout in ``layout``."""
    return dataclasses.replace(case, **{name: to_layout(getattr(case, name), layout) for name in ("q", "k", "v", "dout")})
