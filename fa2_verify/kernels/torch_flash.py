"""``torch-flash``: PyTorch's built-in flash attention kernels behind the kernel contract.

CUDA: ``aten::_flash_attention_forward`` / ``aten::_flash_attention_backward``,
PyTorch's vendored FlashAttention-2 (flash-attn 2.5.x), called directly in the
contract's (batch, seqlen, heads, head_dim) layout.  This op takes flash-attn's
own ``window_size_left/right`` with bottom-right aligned causal masks, reads kv
head ``h // (heads_q // heads_kv)`` natively (GQA/MQA, dK/dV summed by the
kernel) and returns the natural-log LSE as float32 (batch, heads_q, seqlen_q):
all of the contract maps one to one.  (``_scaled_dot_product_flash_attention``
is not used: its ``is_causal`` is top-left aligned and it has no window.)
A row that sees no key gets ``out = 0`` and ``lse = +inf`` (flash-attn's
convention, allowed by the contract); the backward is handed ``+inf`` for any
infinite LSE.  ``deterministic=True`` runs the backward under
``torch.use_deterministic_algorithms(True)``, which selects FA2's
deterministic dQ accumulation; the previous setting is restored.

CPU: ``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward,
which work in (batch, heads, seqlen, head_dim) (the adapter passes transposed
views), support GQA natively, and accept an additive ``attn_mask`` of q's dtype
(not a bool mask).  Its ``is_causal`` is top-left aligned, so it is used only
when that equals the contract's mask (causal, no left window, seqlen_q ==
seqlen_k); every other causal or windowed call passes the bottom-right mask of
:func:`core.contract.visible_mask` as 0/-inf.  It returns the LSE in
float32 (float64 for float64 inputs); the adapter returns float32.  For
float16/bfloat16 inputs that LSE is accurate to only about 1e-5 relative
(measured with torch 2.13), far from float32's 6e-8; the adapter passes it
through and the verification reports it.  For a row that sees no key it writes ``out = 0`` and ``lse = 0``: the adapter reports
``-inf`` there and hands the kernel its own 0 back in the backward (with
``-inf`` its backward computes ``exp(-inf - (-inf)) = NaN``).
Its backward accumulates dQ, dK and dV in the input dtype across blocks
(:data:`CPU_Q_SPLIT`), declared to the error model by ``config()["partial_sums"]``.

What the contract cannot express in :class:`~core.contract.Capabilities`
(listed in its notes) raises :class:`~core.errors.UnsupportedCase`:
seqlen_q = 0 or seqlen_k = 0 on CPU (the kernel kills the process with
SIGFPE), and on CUDA a head_dim that is not a multiple of 8 or exceeds 256,
a GPU older than sm80, a PyTorch build without flash attention, or a window
the op cannot apply: flash-attn replaces an unbounded right bound facing a
bounded left one with ``seqlen_k`` (:func:`cuda_op_window`), which is not
unbounded once ``seqlen_q > seqlen_k + 1``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import torch
import torch.nn.attention

from fa2_verify.core.contract import (
    DTYPES,
    UNBOUNDED,
    Capabilities,
    dtype_name,
    effective_window,
    heads_first,
    visible_mask,
    visible_ranges,
)
from fa2_verify.core.errors import UnsupportedCase

CUDA_HEAD_DIM_MULTIPLE = 8
CUDA_MAX_HEAD_DIM = 256
CUDA_MIN_CAPABILITY = (8, 0)

#: PyTorch's CPU backward (``FlashAttentionKernel.cpp``) adds each block's
#: ``P^T dO``, ``dS^T Q`` and ``dS K`` into dV, dK and dQ stored in the input
#: dtype (its GEMMs take ``beta = 1`` on the output tensors), so the partial sums
#: are rounded after every query block of ``q_split_size`` rows, per query head,
#: and after every key block of ``kv_split_size`` keys (docs/error-model.md,
#: eqs. 7b to 9b).  ``[from_seqlen_q, q_split_size]``, as its dispatch picks them:
CPU_Q_SPLIT = [[0, 32], [192, 64], [768, 256]]
CPU_KV_SPLIT = 512


@contextlib.contextmanager
def _deterministic_algorithms(enabled: bool) -> Iterator[None]:
    """``torch.use_deterministic_algorithms(True)`` within the block if ``enabled``; restored after."""
    if not enabled:
        yield
        return
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)


#: Head dims of PyTorch's CUDA flash kernel: multiples of 8 up to 256.
CUDA_HEAD_DIMS: tuple[int, ...] = tuple(range(CUDA_HEAD_DIM_MULTIPLE, CUDA_MAX_HEAD_DIM + 1, CUDA_HEAD_DIM_MULTIPLE))


def cuda_unsupported_reason(device: torch.device) -> str | None:
    """Why PyTorch's CUDA flash kernel cannot run on ``device``, or None."""
    if not torch.backends.cuda.is_flash_attention_available():
        return "this PyTorch build has no CUDA flash attention (torch.backends.cuda.is_flash_attention_available() is False)"
    capability = torch.cuda.get_device_capability(device)
    if capability < CUDA_MIN_CAPABILITY:
        return f"PyTorch's CUDA flash kernel needs sm80 or newer; {device} is sm{capability[0]}{capability[1]}"
    return None


def cuda_op_window(seqlen_q: int, seqlen_k: int, window: tuple[int, int]) -> tuple[int, int]:
    """The (left, right) window the CUDA op applies when handed ``window`` (-1 unbounded).

    flash-attn's ``mha_fwd``/``mha_bwd`` (vendored in PyTorch as
    ``flash_api.cpp``) first turn a bound of ``seqlen_k`` or more into -1, then
    (``set_params_fprop``) replace a -1 facing a bounded side with ``seqlen_k``.
    A left bound of ``seqlen_k`` hides nothing, but a right bound of
    ``seqlen_k`` does when ``seqlen_q > seqlen_k + 1``: with bottom-right
    alignment query ``i`` then sees only keys ``j <= i + 2 seqlen_k - seqlen_q``.
    (And a right bound of ``seqlen_k`` or more becomes unbounded, which shows
    keys a finite bound would hide.)
    """
    left, right = (UNBOUNDED if bound >= seqlen_k else bound for bound in window)
    if left < 0 and right >= 0:
        left = seqlen_k
    if left >= 0 and right < 0:
        right = seqlen_k
    return left, right


def cuda_window_unsupported_reason(seqlen_q: int, seqlen_k: int, window: tuple[int, int]) -> str | None:
    """Why the CUDA op cannot apply the contract's ``window`` at these lengths, or None."""
    applied = cuda_op_window(seqlen_q, seqlen_k, window)
    first, last = visible_ranges(seqlen_q, seqlen_k, window_size=window)
    applied_first, applied_last = visible_ranges(seqlen_q, seqlen_k, window_size=applied)
    both_empty = (first > last) & (applied_first > applied_last)
    if bool((both_empty | ((first == applied_first) & (last == applied_last))).all()):
        return None
    return (
        f"window_size={window} with seqlen_q={seqlen_q}, seqlen_k={seqlen_k}: PyTorch's CUDA flash kernel applies "
        f"window {applied} instead (flash-attn reads an unbounded or >= seqlen_k right bound as seqlen_k), "
        "and that mask differs from the contract's"
    )


def cpu_unsupported_reason(seqlen_q: int, seqlen_k: int) -> str | None:
    """Why PyTorch's CPU flash kernel cannot run these lengths, or None."""
    if seqlen_q == 0 or seqlen_k == 0:
        return (
            f"seqlen_q={seqlen_q}, seqlen_k={seqlen_k}: PyTorch's CPU flash kernel crashes the "
            "process (SIGFPE) on an empty sequence"
        )
    return None


def cuda_forward(q, k, v, *, softmax_scale: float, window: tuple[int, int], causal: bool):
    """``aten::_flash_attention_forward`` in contract layout: ``(out, lse)``."""
    left, right = window
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        q, k, v, None, None, q.shape[1], k.shape[1], 0.0, causal, False,
        scale=softmax_scale, window_size_left=left, window_size_right=right,
    )  # fmt: skip
    return out, lse


def cuda_backward(dout, q, k, v, out, lse, *, softmax_scale: float, window: tuple[int, int], causal: bool):
    """``aten::_flash_attention_backward``; without dropout the RNG state is never read."""
    left, right = window
    rng_state = torch.empty(0, dtype=torch.int64, device=q.device)
    lse = lse.to(torch.float32).masked_fill(lse.isinf(), math.inf).contiguous()
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        dout.contiguous(), q, k, v, out, lse, None, None, q.shape[1], k.shape[1], 0.0, causal,
        rng_state, rng_state, scale=softmax_scale, window_size_left=left, window_size_right=right,
    )  # fmt: skip
    return dq, dk, dv


class _CpuMask:
    """How a contract mask is passed to the CPU kernel: native ``is_causal`` or an additive mask."""

    def __init__(self, seqlen_q: int, seqlen_k: int, window: tuple[int, int], dtype: torch.dtype) -> None:
        visible = visible_mask(seqlen_q, seqlen_k, window_size=window)
        self.empty_rows = ~visible.any(dim=1)
        self.is_causal = window == (UNBOUNDED, 0) and seqlen_q == seqlen_k
        unmasked = window == (UNBOUNDED, UNBOUNDED) or self.is_causal
        self.attn_mask = None if unmasked else torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, -math.inf)


def cpu_forward(q, k, v, *, softmax_scale: float, window: tuple[int, int]):
    mask = _CpuMask(q.shape[1], k.shape[1], window, q.dtype)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        *map(heads_first, (q, k, v)), 0.0, mask.is_causal, attn_mask=mask.attn_mask, scale=softmax_scale
    )
    return heads_first(out), lse.to(torch.float32).masked_fill(mask.empty_rows, -math.inf)


def cpu_backward(dout, q, k, v, out, lse, *, softmax_scale: float, window: tuple[int, int]):
    mask = _CpuMask(q.shape[1], k.shape[1], window, q.dtype)
    lse = lse.to(torch.promote_types(q.dtype, torch.float32)).masked_fill(mask.empty_rows, 0.0)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *map(heads_first, (dout, q, k, v, out)), lse, 0.0, mask.is_causal, attn_mask=mask.attn_mask, scale=softmax_scale
    )
    return heads_first(dq), heads_first(dk), heads_first(dv)


class TorchFlash:
    """The ``torch-flash`` target (see the module docstring for the mapping)."""

    capabilities = Capabilities(
        dtypes={"cpu": tuple(DTYPES), "cuda": ("float16", "bfloat16")},
        head_dims=tuple(range(1, 513)),
        causal=True,
        window=True,
        gqa=True,
        backward=True,
        deterministic_backward=True,
        varlen=False,
        device_head_dims={"cuda": CUDA_HEAD_DIMS},
        notes=(
            f"cuda: head_dim must be a multiple of {CUDA_HEAD_DIM_MULTIPLE} up to {CUDA_MAX_HEAD_DIM}, "
            "and the GPU sm80 or newer",
            "cuda: a window with a left bound and an unbounded (or >= seqlen_k) right bound is unsupported when "
            "seqlen_q > seqlen_k + 1 (flash-attn applies right = seqlen_k there)",
            "cpu: seqlen_q=0 or seqlen_k=0 is unsupported (PyTorch's CPU kernel crashes the process on it)",
            "cpu: PyTorch writes lse=0 for a row that sees no key; the adapter reports -inf",
            "cpu: lse is computed in float64 for float64 inputs and returned as float32 (the contract)",
        ),
    )

    def config(self) -> dict[str, Any]:
        current_impl = getattr(torch.nn.attention, "current_flash_attention_impl", lambda: None)()
        return {
            "torch": torch.__version__,
            "cpu_op": "aten::_scaled_dot_product_flash_attention_for_cpu",
            "cuda_op": "aten::_flash_attention_forward",
            "cuda_flash_impl": current_impl or "FA2 (built in)",
            "partial_sums": {"cpu": {"dkv_rows": CPU_Q_SPLIT, "dq_keys": CPU_KV_SPLIT}},
        }

    def _require_supported(self, q: torch.Tensor, k: torch.Tensor, causal: bool, window_size) -> tuple[int, int]:
        """The effective window; raises UnsupportedCase for a case this target cannot run."""
        reason = self.capabilities.unsupported_reason(
            device=str(q.device),
            dtype=dtype_name(q.dtype),
            head_dim=q.shape[-1],
            causal=causal,
            window_size=window_size,
            heads_q=q.shape[2],
            heads_kv=k.shape[2],
        )
        if reason is None and q.device.type == "cuda":
            reason = cuda_unsupported_reason(q.device) or cuda_window_unsupported_reason(
                q.shape[1], k.shape[1], effective_window(causal, window_size)
            )
        if reason is None and q.device.type == "cpu":
            reason = cpu_unsupported_reason(q.shape[1], k.shape[1])
        if reason is not None:
            raise UnsupportedCase(f"torch-flash: {reason}")
        return effective_window(causal, window_size)

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        window = self._require_supported(q, k, causal, window_size)
        if q.device.type == "cuda":
            return cuda_forward(q, k, v, softmax_scale=softmax_scale, window=window, causal=causal)
        return cpu_forward(q, k, v, softmax_scale=softmax_scale, window=window)

    def backward(
        self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False
    ):
        window = self._require_supported(q, k, causal, window_size)
        if q.device.type == "cuda":
            with _deterministic_algorithms(deterministic):
                return cuda_backward(dout, q, k, v, out, lse, softmax_scale=softmax_scale, window=window, causal=causal)
        return cpu_backward(dout, q, k, v, out, lse, softmax_scale=softmax_scale, window=window)


KERNEL = TorchFlash()
