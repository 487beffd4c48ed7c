"""Correct kernels with legitimately different numerics: positive controls for the error model.

Each is :class:`kernels.reference.TiledAttention` with one documented step done
the way another correct FA2 implementation does it, within the model kernel of
docs/error-model.md.  A check that fails one of them raises a false alarm.
"""

from __future__ import annotations

import torch

from fa2_verify.kernels.reference import DEFERRED, TiledAttention


class RoundedProbabilityScoreGradient(TiledAttention):
    """``dS = fl_T(P) ∘ (dP - D)``: the backward forms dS from ``P`` rounded to the input
    dtype (with its subnormals), the copy it made for ``dV = P^T dO``, as PyTorch's
    memory-efficient backward does (docs/error-model.md, equation (6))."""

    def __init__(self) -> None:
        super().__init__(block_q=DEFERRED.block_q, block_k=DEFERRED.block_k, accumulate=DEFERRED.accumulate)

    def _score_gradient(self, p: torch.Tensor, dp: torch.Tensor, delta: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return super()._score_gradient(p.to(dtype).to(p.dtype), dp, delta, dtype)


ROUNDED_P_DS = RoundedProbabilityScoreGradient()
