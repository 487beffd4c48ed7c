"""Argument checks for the Triton FA2 entry points (no Triton import needed).

Each bad argument raises a :class:`~core.errors.UsageError` naming it, its
value and the fix; a valid call outside the kernel's capabilities raises
:class:`~core.errors.UnsupportedCase` with the reason the contract's
``Capabilities.unsupported_reason`` gives.  The checks return a
:class:`Problem`: the call as a case record (:class:`~core.case.CaseSpec`)
with what a launch adds, its device and packing.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import DTYPES, UNBOUNDED, dtype_name, effective_window
from fa2_verify.kernels.triton_fa2 import environment
from fa2_verify.core.errors import UnsupportedCase, UsageError


@dataclasses.dataclass(frozen=True)
class Problem(CaseSpec):
    """One call: a :class:`~core.case.CaseSpec` of its sizes, dtype, mask and scale, plus the launch's ``device``.

    For varlen, ``batch`` counts sequences and the seqlens are the maxima;
    ``cu_seqlens_*`` are the int32 offsets on the call's device.
    """

    device: torch.device = torch.device("cpu")
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None

    @property
    def left(self) -> int:
        return effective_window(self.causal, self.window_size)[0]

    @property
    def right(self) -> int:
        return effective_window(self.causal, self.window_size)[1]

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def block_d(self) -> int:
        """head_dim padded to the next power of two (at least 32)."""
        return max(32, 1 << (self.head_dim - 1).bit_length())

    def describe(self, entry: str) -> str:
        """A key naming the call shape, used to record the configuration chosen."""
        layout = "varlen" if self.varlen else "dense"
        return (
            f"{entry} {layout} {self.dtype} head_dim={self.head_dim} batch={self.batch} "
            f"seqlen_q={self.seqlen_q} seqlen_k={self.seqlen_k} heads_q={self.heads_q} heads_kv={self.heads_kv} "
            f"window=({self.left},{self.right})"
        )


def _require_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise UsageError(f"{name}={type(value).__name__} is not a tensor: pass a torch.Tensor")
    return value


def _check_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    if tensor.ndim != ndim:
        raise UsageError(f"{name}.shape={tuple(tensor.shape)} has {tensor.ndim} dims: expected {layout}")


def _check_window(window_size) -> tuple[int, int]:
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in window_size)
    ):
        raise UsageError(f"window_size={window_size!r} is not a pair of ints: use (left, right), -1 for unbounded")
    if any(w < UNBOUNDED for w in window_size):
        raise UsageError(f"window_size={tuple(window_size)} has a bound below -1: use -1 for unbounded")
    return int(window_size[0]), int(window_size[1])


def _check_scale(softmax_scale) -> float:
    if not isinstance(softmax_scale, numbers.Real) or isinstance(softmax_scale, bool):
        raise UsageError(f"softmax_scale={softmax_scale!r} is not a number: pass a float such as 1/sqrt(head_dim)")
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale < 0:
        raise UnsupportedCase(f"softmax_scale={scale} is not supported: the triton kernel needs a finite scale >= 0")
    return scale


def _check_support(problem: Problem) -> Problem:
    """``problem`` if this kernel runs it here, else :class:`UnsupportedCase` with the reason."""
    env = environment.current()
    reason = env.unavailable_reason()
    if reason is not None:
        raise UnsupportedCase(f"triton kernel: {reason}")
    device = problem.device.type
    reason = problem.unsupported_reason(env.capabilities, device) or env.capabilities.unsupported_reason(
        device=device, dtype=problem.dtype, head_dim=problem.head_dim, varlen=problem.varlen
    )
    if reason is not None:
        hint = "; cpu needs TRITON_INTERPRET=1 before importing kernels.triton_fa2" if reason.startswith("device=") else ""
        raise UnsupportedCase(f"triton kernel: {reason}{hint}")
    return problem


def _dtype_of(q: torch.Tensor) -> str:
    """q's dtype name; one the contract does not name (e.g. an integer dtype) is unsupported."""
    name = dtype_name(q.dtype)
    if name not in DTYPES:
        raise UnsupportedCase(f"triton kernel: dtype={name} is not supported: the contract's dtypes are {', '.join(DTYPES)}")
    return name


def _check_same(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> None:
    first_name, first = names[0], tensors[0]
    for name, tensor in zip(names[1:], tensors[1:]):
        if tensor.dtype != first.dtype:
            raise UsageError(f"{name}.dtype={dtype_name(tensor.dtype)} differs from {first_name}.dtype="
                             f"{dtype_name(first.dtype)}: pass them in one dtype")
        if tensor.device != first.device:
            raise UsageError(f"{name}.device={tensor.device} differs from {first_name}.device={first.device}: "
                             "move them to one device")


def _check_heads(heads_q: int, heads_kv: int, v_shape, k_shape) -> None:
    if tuple(v_shape) != tuple(k_shape):
        raise UsageError(f"v.shape={tuple(v_shape)} differs from k.shape={tuple(k_shape)}: they must match")
    if heads_kv == 0 or heads_q % heads_kv:
        raise UsageError(f"heads_q={heads_q} is not a multiple of heads_kv={heads_kv}: use GQA groups that divide")


def check_forward(q, k, v, *, softmax_scale, causal, window_size) -> Problem:
    """Dense layout: q (batch, seqlen_q, heads_q, head_dim), k/v (batch, seqlen_k, heads_kv, head_dim)."""
    layout = "(batch, seqlen, heads, head_dim)"
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        _check_ndim(name, _require_tensor(name, tensor), 4, layout)
    _check_same(("q", "k", "v"), (q, k, v))
    batch, seqlen_q, heads_q, head_dim = q.shape
    _check_heads(heads_q, k.shape[2], v.shape, k.shape)
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise UsageError(f"k.shape={tuple(k.shape)} does not match q.shape={tuple(q.shape)} in batch or head_dim")
    return _check_support(
        Problem(batch=batch, seqlen_q=seqlen_q, seqlen_k=k.shape[1], heads_q=heads_q, heads_kv=k.shape[2],
                head_dim=head_dim, dtype=_dtype_of(q), causal=bool(causal), window_size=_check_window(window_size),
                softmax_scale=_check_scale(softmax_scale), backward=False, device=q.device)
    )


def _check_cu_seqlens(name: str, cu: torch.Tensor, total: int, max_seqlen, device: torch.device) -> torch.Tensor:
    _require_tensor(name, cu)
    if cu.dtype != torch.int32 or cu.ndim != 1 or cu.numel() < 1:
        raise UsageError(f"{name} has dtype={dtype_name(cu.dtype)}, shape={tuple(cu.shape)}: "
                         "pass a 1-d int32 tensor of batch+1 offsets")
    if cu.device != device:
        raise UsageError(f"{name}.device={cu.device} differs from q.device={device}: move it to one device")
    host = cu.cpu()
    lengths = host[1:] - host[:-1]
    if int(host[0]) != 0 or bool((lengths < 0).any()) or int(host[-1]) != total:
        raise UsageError(f"{name}={host.tolist()} is not 0 = c_0 <= c_1 <= ... <= c_batch = {total}: "
                         "pass cumulative sequence lengths")
    longest = int(lengths.max()) if lengths.numel() else 0
    if not isinstance(max_seqlen, numbers.Integral) or max_seqlen < longest:
        name_max = name.replace("cu_seqlens", "max_seqlen")
        raise UsageError(f"{name_max}={max_seqlen!r} is below the longest sequence ({longest}): pass an int >= it")
    return cu


def check_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                         softmax_scale, causal, window_size) -> Problem:
    """Packed layout: q (total_q, heads_q, head_dim), k/v (total_k, heads_kv, head_dim)."""
    layout = "(total_tokens, heads, head_dim)"
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        _check_ndim(name, _require_tensor(name, tensor), 3, layout)
    _check_same(("q", "k", "v"), (q, k, v))
    total_q, heads_q, head_dim = q.shape
    _check_heads(heads_q, k.shape[1], v.shape, k.shape)
    if k.shape[2] != head_dim:
        raise UsageError(f"k.shape={tuple(k.shape)} does not match q.shape={tuple(q.shape)} in head_dim")
    cu_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q, q.device)
    cu_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, q.device)
    if cu_q.numel() != cu_k.numel():
        raise UsageError(f"cu_seqlens_q has {cu_q.numel()} offsets and cu_seqlens_k {cu_k.numel()}: "
                         "pass one offset per sequence boundary in both")
    return _check_support(
        Problem(batch=cu_q.numel() - 1, seqlen_q=int(max_seqlen_q), seqlen_k=int(max_seqlen_k),
                heads_q=heads_q, heads_kv=k.shape[1], head_dim=head_dim, dtype=_dtype_of(q), causal=bool(causal),
                window_size=_check_window(window_size), softmax_scale=_check_scale(softmax_scale), backward=False,
                device=q.device, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    )


def check_backward_extras(problem: Problem, q: torch.Tensor, dout, out, lse) -> None:
    """dout and out like q; lse float32 (batch, heads_q, seqlen_q) dense or (heads_q, total_q) varlen."""
    for name, tensor in (("dout", dout), ("out", out)):
        _require_tensor(name, tensor)
        if tuple(tensor.shape) != tuple(q.shape):
            raise UsageError(f"{name}.shape={tuple(tensor.shape)} differs from q.shape={tuple(q.shape)}: they must match")
    _check_same(("q", "dout", "out"), (q, dout, out))
    _require_tensor("lse", lse)
    expected: tuple[int, ...]
    if problem.varlen:
        expected = (problem.heads_q, q.shape[0])
    else:
        expected = (problem.batch, problem.heads_q, problem.seqlen_q)
    if tuple(lse.shape) != expected or lse.dtype != torch.float32:
        raise UsageError(f"lse has shape={tuple(lse.shape)}, dtype={dtype_name(lse.dtype)}: expected float32 {expected}")
    if lse.device != q.device:
        raise UsageError(f"lse.device={lse.device} differs from q.device={q.device}: move it to one device")
