"""Launch wrappers: check the arguments, allocate the outputs, launch the kernels.

Dense and packed (varlen) calls share the kernels: a dense tensor is a batch
of equal-length sequences, a packed one a batch of stride 0 whose sequences
start at ``cu_seqlens[b]``.  Inputs whose head_dim stride is not 1 are copied
to a contiguous layout; any other strides are passed to the kernels as they are.

``tiles`` (a ``{pass: TileConfig}`` mapping) overrides the table of
:mod:`kernels.triton_fa2.configs` for benchmark sweeps; every call records the
configuration it used (:func:`kernels.triton_fa2.configs.recorded`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import triton

from fa2_verify.kernels.triton_fa2 import configs, kernels, plans, validation
from fa2_verify.kernels.triton_fa2.configs import TileConfig
from fa2_verify.kernels.triton_fa2.validation import Problem


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 or tensor.shape[-1] == 1 else tensor.contiguous()


def _target(problem: Problem) -> str:
    return configs.target_for(problem.device, kernels.INTERPRET)


def _tma_capable(problem: Problem) -> bool:
    """A Hopper-or-later GPU, not the interpreter: where TMA tensor descriptors exist."""
    return (not kernels.INTERPRET and problem.device.type == "cuda"
            and configs.compute_capability(problem.device)[0] >= 9)


def _tiles(problem: Problem, passes: tuple[str, ...], override: Mapping[str, TileConfig] | None) -> dict[str, TileConfig]:
    return plans.tiles(problem, passes, _target(problem), override)


def _record(problem: Problem, entry: str, tiles: Mapping[str, TileConfig], **extra) -> None:
    configs.record(problem.describe(entry), {
        "target": _target(problem),
        "triton": triton.__version__,
        **{name: tile.as_dict() for name, tile in tiles.items()},
        **extra,
    })


def _descriptor_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory Triton writes in-kernel TMA descriptors to (``triton.set_allocator``)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _run(launches: list[plans.Launch]) -> dict[str, bool]:
    """Launch each plan in order; returns, per kernel, whether it used TMA."""
    used = {}
    for plan in launches:
        tma = bool(plan.constexprs.get("USE_TMA", False))
        if tma:
            triton.set_allocator(_descriptor_scratch)
        getattr(kernels, plan.kernel)[plan.grid](*plan.args, **plan.constexprs, **plan.options)
        used[plan.kernel] = tma
    return used


def forward_tensors(q, k, v, lse_shape) -> tuple[torch.Tensor, ...]:
    """(q, k, v, out, lse) as the forward kernel gets them: inputs with a unit head_dim stride, new outputs."""
    q, k, v = (_unit_last_stride(t) for t in (q, k, v))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    return q, k, v, out, lse


def _forward_call(problem: Problem, entry: str, q, k, v, lse_shape, tiles):
    q, k, v, out, lse = forward_tensors(q, k, v, lse_shape)
    chosen = _tiles(problem, ("forward",), tiles)
    if out.numel() == 0:
        return out, lse
    if k.numel() == 0:
        out.zero_()
        lse.fill_(math.inf)
        return out, lse
    used = _run(plans.forward_launches(problem, q, k, v, out, lse, chosen, _tma_capable(problem)))
    _record(problem, entry, chosen, tma_used=used["forward_kernel"])
    return out, lse


def forward(q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1), tiles=None):
    """Dense forward: ``(out, lse)``, lse float32 (batch, heads_q, seqlen_q), natural log."""
    problem = validation.check_forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
    lse_shape = (problem.batch, problem.heads_q, problem.seqlen_q)
    return _forward_call(problem, "forward", q, k, v, lse_shape, tiles)


def forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                   softmax_scale, causal=False, window_size=(-1, -1), tiles=None):
    """Packed forward: ``(out, lse)``, out (total_q, heads_q, head_dim), lse float32 (heads_q, total_q)."""
    problem = validation.check_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                              softmax_scale=softmax_scale, causal=causal, window_size=window_size)
    return _forward_call(problem, "forward_varlen", q, k, v, (problem.heads_q, q.shape[0]), tiles)


# --------------------------------------------------------------------------- backward


#: (dout, q, k, v, out, lse, delta, dq_target, dq, dk, dv), :func:`backward_tensors`.
BackwardTensors = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
]


def backward_tensors(dout, q, k, v, out, lse, separate_dq: bool) -> BackwardTensors:
    """(dout, q, k, v, out, lse, delta, dq_target, dq, dk, dv) as the backward kernels get them: inputs with
    a unit head_dim stride, a contiguous lse, new gradients, the delta rows and where dQ accumulates
    (an fp32 buffer of atomic adds, or dq itself when a pass of its own computes it)."""
    q, k, v, dout, out = (_unit_last_stride(t) for t in (q, k, v, dout, out))
    lse = lse.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    delta = torch.empty_like(lse)
    dq_target = dq if separate_dq else torch.empty(q.shape, dtype=torch.float32, device=q.device)
    return dout, q, k, v, out, lse, delta, dq_target, dq, dk, dv


def preprocess_rows() -> int:
    """Rows per program of the delta preprocess: 16 in the interpreter, so small tests span several."""
    return 16 if kernels.INTERPRET else plans.PREPROCESS_ROWS


def _backward_call(problem: Problem, entry: str, dout, q, k, v, out, lse, deterministic, tiles):
    validation.check_backward_extras(problem, q, dout, out, lse)
    deterministic = bool(deterministic)
    passes = plans.backward_passes(problem, _target(problem), deterministic)
    separate_dq = "backward_dq" in passes
    tensors = backward_tensors(dout, q, k, v, out, lse, separate_dq)
    dq_target, dq, dk, dv = tensors[7:]
    chosen = _tiles(problem, passes, tiles)
    if q.numel() == 0 or k.numel() == 0:
        for grad in (dq, dk, dv):
            grad.zero_()
        return dq, dk, dv
    if not separate_dq:
        dq_target.zero_()
    ran = _run(plans.backward_launches(problem, *tensors, chosen, _tma_capable(problem), preprocess_rows()))
    if not separate_dq:
        dq.copy_(dq_target)
    used = {"backward_kv": ran["backward_kv_kernel"]}
    if separate_dq:
        used["backward_dq"] = ran["backward_dq_kernel"]
    _record(problem, entry, chosen, deterministic=deterministic, dq_pass="separate" if separate_dq else "atomic",
            tma_used=used)
    return dq, dk, dv


def backward(dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(-1, -1),
             deterministic=False, tiles=None):
    """Dense backward: ``(dq, dk, dv)`` shaped and typed like q, k, v.

    ``deterministic=False`` accumulates dq across key tiles with fp32 atomic
    adds (run-to-run rounding differences in dq), except where the tile table
    finds the separate pass faster (:func:`.configs.separate_dq`); ``True``
    always computes dq in a separate pass over query tiles, bitwise reproducible.
    """
    problem = validation.check_forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
    return _backward_call(problem, "backward", dout, q, k, v, out, lse, deterministic, tiles)


def backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                    softmax_scale, causal=False, window_size=(-1, -1), deterministic=False, tiles=None):
    """Packed backward: ``(dq, dk, dv)`` in the packed layouts of q, k, v."""
    problem = validation.check_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                              softmax_scale=softmax_scale, causal=causal, window_size=window_size)
    return _backward_call(problem, "backward_varlen", dout, q, k, v, out, lse, deterministic, tiles)
