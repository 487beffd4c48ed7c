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

from fa2_verify.kernels.triton_fa2 import configs, kernels, validation
from fa2_verify.kernels.triton_fa2.configs import TileConfig
from fa2_verify.kernels.triton_fa2.validation import Problem

#: Rows per program of the delta preprocess (interpreter: 16).
PREPROCESS_ROWS = 128


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 or tensor.shape[-1] == 1 else tensor.contiguous()


def _strides(tensor: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, sequence, head) strides in elements; a packed tensor has batch stride 0."""
    if varlen:
        return 0, tensor.stride(0), tensor.stride(1)
    return tensor.stride(0), tensor.stride(1), tensor.stride(2)


def _lse_strides(problem: Problem, total_q: int) -> tuple[int, int]:
    if problem.varlen:
        return 0, total_q
    return problem.heads_q * problem.seqlen_q, problem.seqlen_q


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs multiply in true fp32 (``ieee``), not tf32."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _tiles(problem: Problem, passes: tuple[str, ...], override: Mapping[str, TileConfig] | None) -> dict[str, TileConfig]:
    target = configs.target_for(problem.device, kernels.INTERPRET)
    seqlen = max(problem.seqlen_q, problem.seqlen_k)
    chosen = {name: configs.select(target, name, problem.torch_dtype, problem.block_d, seqlen) for name in passes}
    if override:
        chosen.update({name: tile for name, tile in override.items() if name in passes})
    return chosen


def _record(problem: Problem, entry: str, tiles: Mapping[str, TileConfig], **extra) -> None:
    configs.record(problem.describe(entry), {
        "target": configs.target_for(problem.device, kernels.INTERPRET),
        "triton": triton.__version__,
        **{name: tile.as_dict() for name, tile in tiles.items()},
        **extra,
    })


def _mask_flags(problem: Problem) -> dict[str, bool]:
    return {"HAS_LEFT": problem.left >= 0, "HAS_RIGHT": problem.right >= 0}


def _descriptor_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory Triton writes in-kernel TMA descriptors to (``triton.set_allocator``)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _use_tma(tile: TileConfig, problem: Problem, tensors: tuple[torch.Tensor, ...]) -> bool:
    """TMA when the tile asks for it and the hardware and layouts allow it: a Hopper-or-later
    GPU, 16-bit data, 16-byte aligned base pointers and (batch, sequence, head) strides."""
    if not tile.use_tma or kernels.INTERPRET or problem.device.type != "cuda":
        return False
    if problem.torch_dtype == torch.float32 or torch.cuda.get_device_capability(problem.device)[0] < 9:
        return False
    size = problem.torch_dtype.itemsize
    for tensor in tensors:
        if tensor.data_ptr() % 16 or any(stride * size % 16 for stride in _strides(tensor, problem.varlen)):
            return False
    if problem.head_dim * size % 16:
        return False
    triton.set_allocator(_descriptor_scratch)
    return True


# --------------------------------------------------------------------------- forward


def _forward(problem: Problem, q, k, v, out, lse, tiles: Mapping[str, TileConfig]) -> bool:
    """Launch the forward; returns whether it used TMA."""
    tile = tiles["forward"]
    use_tma = _use_tma(tile, problem, (q, k, v, out))
    total_q = q.shape[0]
    stride_lb, stride_lh = _lse_strides(problem, total_q)
    grid = (triton.cdiv(problem.seqlen_q, tile.block_m), problem.heads_q, problem.batch)
    kernels.forward_kernel[grid](
        q, k, v, out, lse, problem.cu_seqlens_q, problem.cu_seqlens_k,
        *_strides(q, problem.varlen), *_strides(k, problem.varlen), *_strides(v, problem.varlen),
        *_strides(out, problem.varlen), stride_lb, stride_lh,
        problem.seqlen_q, problem.seqlen_k, problem.group, problem.softmax_scale * kernels.LOG2E.value, problem.left, problem.right,
        HEAD_DIM=problem.head_dim, BLOCK_D=problem.block_d, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        VARLEN=problem.varlen, DOT_PRECISION=_dot_precision(problem.torch_dtype), USE_TMA=use_tma,
        **_mask_flags(problem), num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    return use_tma


def _forward_call(problem: Problem, entry: str, q, k, v, lse_shape, tiles):
    q, k, v = (_unit_last_stride(t) for t in (q, k, v))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    chosen = _tiles(problem, ("forward",), tiles)
    if out.numel() == 0:
        return out, lse
    if k.numel() == 0:
        out.zero_()
        lse.fill_(math.inf)
        return out, lse
    _record(problem, entry, chosen, tma_used=_forward(problem, q, k, v, out, lse, chosen))
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


def _backward(problem: Problem, dout, q, k, v, out, lse, dq, dk, dv, deterministic: bool,
              tiles: Mapping[str, TileConfig]) -> dict[str, bool]:
    """Launch the backward passes; returns which of them used TMA."""
    varlen = problem.varlen
    total_q = q.shape[0]
    stride_lb, stride_lh = _lse_strides(problem, total_q)
    delta = torch.empty_like(lse)
    rows = 16 if kernels.INTERPRET else PREPROCESS_ROWS
    kernels.backward_preprocess_kernel[(triton.cdiv(problem.seqlen_q, rows), problem.heads_q, problem.batch)](
        out, dout, delta, problem.cu_seqlens_q,
        *_strides(out, varlen), *_strides(dout, varlen), stride_lb, stride_lh, problem.seqlen_q,
        HEAD_DIM=problem.head_dim, BLOCK_D=problem.block_d, BLOCK_M=rows, VARLEN=varlen,
    )
    common = dict(HEAD_DIM=problem.head_dim, BLOCK_D=problem.block_d, VARLEN=varlen,
                  DOT_PRECISION=_dot_precision(problem.torch_dtype), **_mask_flags(problem))
    scalars = (problem.seqlen_q, problem.seqlen_k, problem.group, problem.softmax_scale * kernels.LOG2E.value,
               problem.softmax_scale, problem.left, problem.right)
    dq_target = dq if deterministic else torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv_tile = tiles["backward_kv"]
    used = {"backward_kv": _use_tma(kv_tile, problem, (q, dout))}
    kernels.backward_kv_kernel[(triton.cdiv(problem.seqlen_k, kv_tile.block_n), problem.heads_kv, problem.batch)](
        q, k, v, dout, lse, delta, dq_target, dk, dv, problem.cu_seqlens_q, problem.cu_seqlens_k,
        *_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(dout, varlen),
        *_strides(dq_target, varlen), *_strides(dk, varlen), *_strides(dv, varlen), stride_lb, stride_lh,
        *scalars, BLOCK_M=kv_tile.block_m, BLOCK_N=kv_tile.block_n, ATOMIC_DQ=not deterministic,
        USE_TMA=used["backward_kv"], **common, num_warps=kv_tile.num_warps, num_stages=kv_tile.num_stages,
    )
    if deterministic:
        dq_tile = tiles["backward_dq"]
        used["backward_dq"] = _use_tma(dq_tile, problem, (q, dout, k, v))
        kernels.backward_dq_kernel[(triton.cdiv(problem.seqlen_q, dq_tile.block_m), problem.heads_q, problem.batch)](
            q, k, v, dout, lse, delta, dq, problem.cu_seqlens_q, problem.cu_seqlens_k,
            *_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(dout, varlen),
            *_strides(dq, varlen), stride_lb, stride_lh,
            *scalars, BLOCK_M=dq_tile.block_m, BLOCK_N=dq_tile.block_n, USE_TMA=used["backward_dq"], **common,
            num_warps=dq_tile.num_warps, num_stages=dq_tile.num_stages,
        )
    else:
        dq.copy_(dq_target)
    return used


def _backward_passes(deterministic: bool) -> tuple[str, ...]:
    return ("backward_kv", "backward_dq") if deterministic else ("backward_kv",)


def _backward_call(problem: Problem, entry: str, dout, q, k, v, out, lse, deterministic, tiles):
    validation.check_backward_extras(problem, q, dout, out, lse)
    q, k, v, dout, out = (_unit_last_stride(t) for t in (q, k, v, dout, out))
    lse = lse.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    chosen = _tiles(problem, _backward_passes(deterministic), tiles)
    if q.numel() == 0 or k.numel() == 0:
        for grad in (dq, dk, dv):
            grad.zero_()
        return dq, dk, dv
    used = _backward(problem, dout, q, k, v, out, lse, dq, dk, dv, bool(deterministic), chosen)
    _record(problem, entry, chosen, deterministic=bool(deterministic), tma_used=used)
    return dq, dk, dv


def backward(dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(-1, -1),
             deterministic=False, tiles=None):
    """Dense backward: ``(dq, dk, dv)`` shaped and typed like q, k, v.

    ``deterministic=False`` accumulates dq across key tiles with fp32 atomic
    adds (run-to-run rounding differences in dq); ``True`` computes dq in a
    separate pass over query tiles, bitwise reproducible.
    """
    problem = validation.check_forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
    return _backward_call(problem, "backward", dout, q, k, v, out, lse, deterministic, tiles)


def backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                    softmax_scale, causal=False, window_size=(-1, -1), deterministic=False, tiles=None):
    """Packed backward: ``(dq, dk, dv)`` in the packed layouts of q, k, v."""
    problem = validation.check_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                              softmax_scale=softmax_scale, causal=causal, window_size=window_size)
    return _backward_call(problem, "backward_varlen", dout, q, k, v, out, lse, deterministic, tiles)
