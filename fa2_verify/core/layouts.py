"""Memory layouts of a case's inputs: the same values, other strides, in storage poisoned around them.

A kernel must give the same outputs whatever the strides of its inputs (the
contract fixes the logical layout, not the memory one: docs/design.md, "The
kernel contract").  The layout property (:mod:`properties.relation_checks`),
the varlen property (:func:`core.varlen.pack`) and the benchmark's strided
cases (:mod:`bench.checks`) build their inputs here.

Every tensor a layout makes is a view into a storage whose other elements
are NaN (:func:`guarded`): before it, after it, and in the gaps its strides
leave.  A kernel that reads memory it must not (V rows past ``seqlen_k``
multiplied by ``P = 0``, flash-attn #2374; tiles outside a window, vLLM
#30887) then reads NaN, and ``0 * NaN = NaN`` reaches an output.

:data:`LAYOUTS` arrange each tensor alone (:func:`to_layout`);
:data:`JOINT_LAYOUTS` arrange q, k, v together (:func:`arrange`): one packed
qkv storage, or K and V broadcast with stride 0 over batch or heads (their
values then repeat, so such a layout is compared with the contiguous copy of
itself, :func:`in_layout` then ``in_layout(..., "contiguous")``).  The last
dimension keeps stride 1 everywhere, as FA2 kernels require.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fa2_verify.core.case import Case
from fa2_verify.core.contract import Capabilities

#: Layouts of each tensor alone; the first is contiguous.  ``unaligned-offset``: contiguous strides at a
#: storage offset one element past a 16-byte boundary; ``outer-stride``: a gap of NaN rows after every
#: batch element (a view of a larger buffer, as a dO sliced from a bigger gradient, flash-attn #2611).
LAYOUTS: tuple[str, ...] = (
    "contiguous", "heads-major", "padded-head-dim", "strided-seqlen", "unaligned-offset", "outer-stride",
)

#: The layout whose data pointers are not 16-byte aligned, drawn only for a kernel that declares it takes them.
UNALIGNED = "unaligned-offset"


def layouts_for(capabilities: Capabilities) -> tuple[str, ...]:
    """:data:`LAYOUTS` a kernel declaring ``capabilities`` is handed: without :data:`UNALIGNED` unless it
    declares ``unaligned_inputs`` (the contract hands inputs 16-byte aligned otherwise)."""
    return tuple(layout for layout in LAYOUTS if layout != UNALIGNED or capabilities.unaligned_inputs)


#: Layouts of q, k, v together.  ``packed-qkv``: q, k, v sliced from one (batch, seqlen, heads_q + 2 heads_kv,
#: head_dim) storage ((B, S, 3, H, D) for MHA); ``kv-expanded-batch``, ``kv-expanded-heads``: K and V with
#: stride 0 over batch, or over their heads (PyTorch #191937, shared-KV GQA), their values repeated.
JOINT_LAYOUTS: tuple[str, ...] = ("packed-qkv", "kv-expanded-batch", "kv-expanded-heads")

#: Joint layouts that keep every value (a packed varlen batch may take them).
VALUE_KEEPING_JOINT_LAYOUTS: tuple[str, ...] = ("packed-qkv",)

#: Most guard elements on each side of a tensor: enough for any tile a kernel over-reads, bounded
#: so that a large case does not triple its inputs' memory.
MAX_GUARD = 2**20

#: Guards are whole multiples of this many bytes, so a guarded tensor keeps its storage's alignment.
_GUARD_ALIGNMENT = 256

#: Gap rows of ``outer-stride`` after each batch element.
_OUTER_GAP_ROWS = 3


def storage_span(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """How many storage elements a view spans, from its first element to its last (non-negative strides)."""
    if math.prod(shape) == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))


def guarded(tensor: torch.Tensor, *, strides: tuple[int, ...] | None = None, misalign: int = 0) -> torch.Tensor:
    """``tensor``'s values with ``strides`` (its own by default) in the middle of a NaN-filled storage (integers: -1).

    A guard of ``min(span, MAX_GUARD)`` elements, rounded up to 256 bytes, lies before and after the
    view (``misalign`` elements more before it), and every element the strides skip is NaN too.
    A dimension of stride 0 holds one copy: its values must repeat along it.
    """
    strides = tuple(tensor.stride() if strides is None else strides)
    span = storage_span(tuple(tensor.shape), strides)
    unit = max(1, _GUARD_ALIGNMENT // tensor.element_size())
    guard = -(-max(min(span, MAX_GUARD), 1) // unit) * unit
    fill = float("nan") if tensor.dtype.is_floating_point else -1
    storage = torch.full((2 * guard + misalign + span,), fill, dtype=tensor.dtype, device=tensor.device)
    view = storage.as_strided(tensor.shape, strides, storage_offset=guard + misalign)
    once = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in strides)
    view[once].copy_(tensor[once])
    return view


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _strides(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """The strides of a (batch, seqlen, heads, head_dim) tensor of ``shape`` in the per-tensor ``layout``."""
    batch, seqlen, heads, head_dim = shape
    if layout in ("contiguous", "unaligned-offset"):
        return _contiguous_strides(shape)
    if layout == "heads-major":
        return (heads * seqlen * head_dim, head_dim, seqlen * head_dim, 1)
    if layout == "padded-head-dim":
        return (seqlen * heads * (head_dim + 8), heads * (head_dim + 8), head_dim + 8, 1)
    if layout == "strided-seqlen":
        return (2 * seqlen * heads * head_dim, 2 * heads * head_dim, head_dim, 1)
    if layout == "outer-stride":
        return ((seqlen + _OUTER_GAP_ROWS) * heads * head_dim, heads * head_dim, head_dim, 1)
    raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")


def to_layout(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``tensor`` (batch, seqlen, heads, head_dim) in the memory layout ``layout``
    of :data:`LAYOUTS`, inside a NaN-guarded storage (:func:`guarded`)."""
    strides = _strides(tuple(tensor.shape), layout)
    return guarded(tensor, strides=strides, misalign=1 if layout == "unaligned-offset" else 0)


def _packed_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v sliced along the heads of one (batch, max seqlen, heads_q + 2 heads_kv, head_dim) storage."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    fused = torch.full((batch, max(seqlen_q, seqlen_k), heads_q + 2 * heads_kv, head_dim), math.nan,
                       dtype=q.dtype, device=q.device)
    fused[:, :seqlen_q, :heads_q] = q
    fused[:, :seqlen_k, heads_q : heads_q + heads_kv] = k
    fused[:, :seqlen_k, heads_q + heads_kv :] = v
    fused = guarded(fused)
    return (fused[:, :seqlen_q, :heads_q], fused[:, :seqlen_k, heads_q : heads_q + heads_kv],
            fused[:, :seqlen_k, heads_q + heads_kv :])


def _expanded(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """``tensor``'s first slice along ``dim`` broadcast over ``dim`` with stride 0, NaN-guarded."""
    first = tensor.narrow(dim, 0, 1)
    strides = list(_contiguous_strides(tuple(tensor.shape)))
    strides[dim] = 0
    if dim == 2:  # heads: the one head's rows are heads * head_dim apart no more
        strides[:2] = [tensor.shape[1] * tensor.shape[3], tensor.shape[3]]
    return guarded(first.expand(tensor.shape), strides=tuple(strides))


def arrange(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, layout: str) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout in ``layout`` (:data:`LAYOUTS` or :data:`JOINT_LAYOUTS`), each NaN-guarded; a joint
    layout leaves dout contiguous.  ``kv-expanded-*`` keep only the first batch element (head) of K and V."""
    if layout in LAYOUTS:
        return tuple(to_layout(tensor, layout) for tensor in (q, k, v, dout))
    rest = (to_layout(q, "contiguous"), to_layout(dout, "contiguous"))
    if layout == "packed-qkv":
        return (*_packed_qkv(q, k, v), rest[1])
    if layout in ("kv-expanded-batch", "kv-expanded-heads"):
        dim = 0 if layout == "kv-expanded-batch" else 2
        return rest[0], _expanded(k, dim), _expanded(v, dim), rest[1]
    raise ValueError(f"layout={layout!r} is not one of {LAYOUTS + JOINT_LAYOUTS}")


def in_layout(case: Case, layout: str) -> Case:
    """``case`` with q, k, v and dout in ``layout`` (:func:`arrange`), and the ``out`` that backward is
    handed in it too (``Case.out_layout``: a joint layout hands it contiguous)."""
    q, k, v, dout = arrange(case.q, case.k, case.v, case.dout, layout)
    return dataclasses.replace(case, q=q, k=k, v=v, dout=dout, out_layout=layout if layout in LAYOUTS else "contiguous")


def guarded_case(case: Case) -> Case:
    """``case`` as the property suite hands it to a kernel: every input (and backward's ``out``) in
    NaN-guarded storage; a case already laid out (``out_layout`` set) as it is, others contiguous."""
    return case if case.out_layout is not None else in_layout(case, "contiguous")
