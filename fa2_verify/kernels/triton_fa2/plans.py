"""What each launch of the Triton FA2 kernels passes: grid, runtime arguments, compile-time values.

One pure function per entry point of :mod:`.kernels` turns a call (its
:class:`~.validation.Problem`), its tensors and its tile into a
:class:`Launch`.  :mod:`.launch` runs exactly what these return, and
:mod:`.variants` reads from the same :class:`Launch` the compile key Triton
derives (the constexprs plus Triton's own specialization of the other
arguments), so the variant count, the warm-up and the real launch cannot
disagree.  The tensors may live on the ``meta`` device: a plan reads only
their dtypes, shapes, strides and addresses.  Importing this module imports
no Triton.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from fa2_verify.kernels.triton_fa2 import configs
from fa2_verify.kernels.triton_fa2.configs import TileConfig
from fa2_verify.kernels.triton_fa2.validation import Problem

#: log2(e): the softmax scale is folded into base-2 exponents (the kernels' LOG2E).
LOG2E = 1.4426950408889634

#: Rows per program of the delta preprocess on a GPU (the interpreter uses 16).
PREPROCESS_ROWS = 128

#: The window bound passed for "no bound": larger than any distance between a query and a key
#: (sequences up to 2^29 tokens), small enough that the kernels' int32 bound arithmetic cannot
#: overflow.  A bound at or above it bounds nothing either, so it is clamped to it.
NO_BOUND = 2**30

#: Head dims are multiples of 8 (:data:`.environment.HEAD_DIMS`); the kernels get them in these
#: units, so one variant serves every head dim of a padded block and Triton still knows that a
#: head_dim mask is constant over 8 columns (16-byte vectors of 16-bit data).
HEAD_DIM_UNIT = 8

#: The largest stride unit, in bytes: a 16-byte aligned row is all a vectorized load (128 bits per
#: thread) or a TMA descriptor needs, so a larger unit would only split variants.
STRIDE_UNIT_BYTES = 16

#: The first integer Triton passes to a kernel as 64-bit rather than 32-bit.
INT32_LIMIT = 2**31


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernels.<kernel>[grid](*args, **constexprs, **options)``."""

    kernel: str
    grid: tuple[int, int, int]
    args: tuple[Any, ...]
    constexprs: Mapping[str, Any]
    options: Mapping[str, int]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def strides(tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, sequence, head) strides in elements; a packed tensor has batch stride 0."""
    s = tuple(tensor.stride())
    return (0, s[0], s[1]) if varlen else (s[0], s[1], s[2])


def stride_unit(tensor, varlen: bool) -> int:
    """The largest power of two of elements, up to :data:`STRIDE_UNIT_BYTES` bytes, dividing the
    (batch, sequence, head) strides.

    The kernels get those strides divided by it and multiply back by it as a
    constexpr, so Triton knows the alignment its vectorized loads need while
    tensors whose strides differ by a multiple of it share one variant.

    A tensor with a stride of 2^31 elements or more gets unit 1: Triton
    passes an argument that fits in 32 bits as a 32-bit integer, so a
    quotient below 2^31 multiplied back in the kernel would wrap past 2^31
    (the bug class of ``tests.mutants.BATCH_OFFSET_INT32_WRAP``); whole, such
    a stride arrives as a 64-bit integer.
    """
    tensor_strides = strides(tensor, varlen)
    if any(stride >= INT32_LIMIT for stride in tensor_strides):
        return 1
    unit = max(STRIDE_UNIT_BYTES // tensor.element_size(), 1)
    while any(stride % unit for stride in tensor_strides):
        unit //= 2
    return unit


def _bound(bound: int) -> int:
    """A window bound for the kernels: -1 (none) and anything beyond :data:`NO_BOUND` become it."""
    return NO_BOUND if bound < 0 else min(bound, NO_BOUND)


def _even(problem: Problem) -> bool:
    """The head dim fills its padded block: no column is masked (a compile-time fact, see kernels._head_dim)."""
    return problem.head_dim == problem.block_d


def _mask_and_sizes(problem: Problem) -> tuple[int, int, int]:
    """(left, right, head_dim_units): the runtime mask bounds and head dim."""
    return _bound(problem.left), _bound(problem.right), problem.head_dim // HEAD_DIM_UNIT


def _in_units(tensor, varlen: bool) -> tuple[int, int, int]:
    unit = stride_unit(tensor, varlen)
    along_0, along_1, along_2 = (stride // unit for stride in strides(tensor, varlen))
    return along_0, along_1, along_2


def lse_strides(problem: Problem, total_q: int) -> tuple[int, int]:
    if problem.varlen:
        return 0, total_q
    return problem.heads_q * problem.seqlen_q, problem.seqlen_q


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs multiply in true fp32 (``ieee``), not tf32."""
    return "ieee" if dtype == torch.float32 else "tf32"


def tiles(problem: Problem, passes: tuple[str, ...], target: str,
          override: Mapping[str, TileConfig] | None) -> dict[str, TileConfig]:
    """The tile of each pass: the table row of ``target``, unless ``override`` names the pass."""
    seqlen = max(problem.seqlen_q, problem.seqlen_k)
    chosen = {name: configs.select(target, name, problem.torch_dtype, problem.block_d, seqlen) for name in passes}
    if override:
        chosen.update({name: tile for name, tile in override.items() if name in passes})
    return chosen


def backward_passes(problem: Problem, target: str, deterministic: bool) -> tuple[str, ...]:
    """The tiled passes of a backward call: the key-tile pass, and the query-tile dQ pass when the call
    is ``deterministic`` or ``target`` computes dQ that way by default (:func:`.configs.separate_dq`)."""
    if deterministic or configs.separate_dq(target, problem.torch_dtype, problem.block_d):
        return ("backward_kv", "backward_dq")
    return ("backward_kv",)


def use_tma(tile: TileConfig, problem: Problem, tensors: tuple, tma_capable: bool) -> bool:
    """TMA when the tile asks for it and the hardware and layouts allow it: ``tma_capable``
    (a Hopper-or-later GPU, not the interpreter), 16-bit data, 16-byte aligned base pointers
    and (batch, sequence, head) strides, a 16-byte head_dim."""
    if not tile.use_tma or not tma_capable or problem.torch_dtype == torch.float32:
        return False
    size = problem.torch_dtype.itemsize
    for tensor in tensors:
        if tensor.data_ptr() % 16 or any(stride * size % 16 for stride in strides(tensor, problem.varlen)):
            return False
    return problem.head_dim * size % 16 == 0


def _options(tile: TileConfig) -> dict[str, int]:
    return {"num_warps": tile.num_warps, "num_stages": tile.num_stages}


def forward(problem: Problem, q, k, v, out, lse, tile: TileConfig, tma: bool) -> Launch:
    """The forward kernel: one program per (query tile, query head, batch)."""
    varlen = problem.varlen
    args = (
        q, k, v, out, lse, problem.cu_seqlens_q, problem.cu_seqlens_k,
        *_in_units(q, varlen), *_in_units(k, varlen), *_in_units(v, varlen), *_in_units(out, varlen),
        *lse_strides(problem, q.shape[0]),
        problem.seqlen_q, problem.seqlen_k, problem.group, problem.scale * LOG2E, *_mask_and_sizes(problem),
    )
    constexprs = dict(BLOCK_D=problem.block_d, EVEN_D=_even(problem), BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
                      VARLEN=varlen, DOT_PRECISION=dot_precision(problem.torch_dtype), USE_TMA=tma,
                      HAS_LEFT=problem.left >= 0,
                      Q_UNIT=stride_unit(q, varlen), K_UNIT=stride_unit(k, varlen), V_UNIT=stride_unit(v, varlen),
                      O_UNIT=stride_unit(out, varlen))
    grid = (cdiv(problem.seqlen_q, tile.block_m), problem.heads_q, problem.batch)
    return Launch("forward_kernel", grid, args, constexprs, _options(tile))


def backward_preprocess(problem: Problem, out, dout, delta, rows: int) -> Launch:
    """delta = rowsum(dout * out): one program per (``rows`` query rows, query head, batch)."""
    varlen = problem.varlen
    args = (out, dout, delta, problem.cu_seqlens_q, *_in_units(out, varlen), *_in_units(dout, varlen),
            *lse_strides(problem, out.shape[0]), problem.seqlen_q, problem.head_dim // HEAD_DIM_UNIT)
    constexprs = dict(BLOCK_D=problem.block_d, EVEN_D=_even(problem), BLOCK_M=rows, VARLEN=varlen,
                      O_UNIT=stride_unit(out, varlen), DO_UNIT=stride_unit(dout, varlen))
    grid = (cdiv(problem.seqlen_q, rows), problem.heads_q, problem.batch)
    return Launch("backward_preprocess_kernel", grid, args, constexprs, {})


def _backward_common(problem: Problem, q, k, v, dout) -> tuple[dict[str, Any], tuple]:
    varlen = problem.varlen
    constexprs = dict(BLOCK_D=problem.block_d, EVEN_D=_even(problem), VARLEN=varlen,
                      DOT_PRECISION=dot_precision(problem.torch_dtype),
                      Q_UNIT=stride_unit(q, varlen), K_UNIT=stride_unit(k, varlen), V_UNIT=stride_unit(v, varlen),
                      DO_UNIT=stride_unit(dout, varlen))
    scalars = (problem.seqlen_q, problem.seqlen_k, problem.group, problem.scale * LOG2E,
               problem.scale, *_mask_and_sizes(problem))
    return constexprs, scalars


def backward_kv(problem: Problem, q, k, v, dout, lse, delta, dq_target, dk, dv, tile: TileConfig, tma: bool,
                atomic_dq: bool) -> Launch:
    """dK, dV (and, with ``atomic_dq``, dQ by fp32 atomics): one program per (key tile, kv head, batch)."""
    varlen = problem.varlen
    common, scalars = _backward_common(problem, q, k, v, dout)
    args = (
        q, k, v, dout, lse, delta, dq_target, dk, dv, problem.cu_seqlens_q, problem.cu_seqlens_k,
        *_in_units(q, varlen), *_in_units(k, varlen), *_in_units(v, varlen), *_in_units(dout, varlen),
        *_in_units(dq_target, varlen), *_in_units(dk, varlen), *_in_units(dv, varlen),
        *lse_strides(problem, q.shape[0]), *scalars,
    )
    constexprs = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, ATOMIC_DQ=atomic_dq, USE_TMA=tma,
                      HAS_RIGHT=problem.right >= 0,
                      DQ_UNIT=stride_unit(dq_target, varlen), DK_UNIT=stride_unit(dk, varlen),
                      DV_UNIT=stride_unit(dv, varlen), **common)
    grid = (cdiv(problem.seqlen_k, tile.block_n), problem.heads_kv, problem.batch)
    return Launch("backward_kv_kernel", grid, args, constexprs, _options(tile))


def backward_dq(problem: Problem, q, k, v, dout, lse, delta, dq, tile: TileConfig, tma: bool) -> Launch:
    """Deterministic dQ: one program per (query tile, query head, batch)."""
    varlen = problem.varlen
    common, scalars = _backward_common(problem, q, k, v, dout)
    args = (
        q, k, v, dout, lse, delta, dq, problem.cu_seqlens_q, problem.cu_seqlens_k,
        *_in_units(q, varlen), *_in_units(k, varlen), *_in_units(v, varlen), *_in_units(dout, varlen),
        *_in_units(dq, varlen), *lse_strides(problem, q.shape[0]), *scalars,
    )
    constexprs = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, USE_TMA=tma, HAS_LEFT=problem.left >= 0,
                      DQ_UNIT=stride_unit(dq, varlen),
                      **common)
    grid = (cdiv(problem.seqlen_q, tile.block_m), problem.heads_q, problem.batch)
    return Launch("backward_dq_kernel", grid, args, constexprs, _options(tile))


def forward_launches(problem: Problem, q, k, v, out, lse, chosen: Mapping[str, TileConfig],
                     tma_capable: bool) -> list[Launch]:
    """The launches of a forward call with at least one query row and one key."""
    tile = chosen["forward"]
    return [forward(problem, q, k, v, out, lse, tile, use_tma(tile, problem, (q, k, v, out), tma_capable))]


def backward_launches(problem: Problem, dout, q, k, v, out, lse, delta, dq_target, dq, dk, dv,
                      chosen: Mapping[str, TileConfig], tma_capable: bool, rows: int) -> list[Launch]:
    """The launches of a backward call with at least one query row and one key, in order.

    ``dq_target`` is where the key-tile pass accumulates dQ: the fp32 buffer
    of atomic adds, or ``dq`` itself when the query-tile pass
    (``"backward_dq" in chosen``, :func:`backward_passes`) computes it.
    """
    separate_dq = "backward_dq" in chosen
    kv_tile = chosen["backward_kv"]
    launches = [
        backward_preprocess(problem, out, dout, delta, rows),
        backward_kv(problem, q, k, v, dout, lse, delta, dq_target, dk, dv, kv_tile,
                    use_tma(kv_tile, problem, (q, dout), tma_capable), atomic_dq=not separate_dq),
    ]
    if separate_dq:
        dq_tile = chosen["backward_dq"]
        launches.append(backward_dq(problem, q, k, v, dout, lse, delta, dq, dq_tile,
                                    use_tma(dq_tile, problem, (q, dout, k, v), tma_capable)))
    return launches
