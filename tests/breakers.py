"""Kernels broken in exactly the way one property checks, beside tests/mutants.py's catalog.

Each is the reference kernel (``kernels.reference.DEFERRED``) with one
documented deviation; the property declarations name them as their
``breaker`` (``tests.breakers:NAME``), and ``tests/test_mutants_caught.py``
checks that each property catches its breaker.  :data:`RANDOM_ORDER_DQ`,
:class:`GqaRandomOrderDkDv` and :data:`VARLEN_BY_LOOP` are correct kernels:
the positive controls of the dQ spread bound, of the declared GQA dK/dV
order (the test varies its declaration), and of the varlen property.
:class:`DriftingOrderDq` is the race of ``fa2-verify race`` (tests/test_race.py):
broken when it declares a deterministic backward, correct when it does not.
:class:`SmallHeadDimsFailToCompile` wraps any kernel with a kernel error at a
declared shape (docs/properties.md, "Kernel errors").
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fa2_verify.core.contract import UNBOUNDED, visible_mask
from fa2_verify.kernels.reference import DEFERRED
from tests import mutants


class _Broken:
    """The reference kernel with one output altered after the fact; subclasses say how."""

    capabilities = DEFERRED.capabilities

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out, lse = DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        return self.alter_forward(q, k, v, out, lse)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        dq, dk, dv = DEFERRED.backward(
            dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal, window_size=window_size, deterministic=deterministic
        )
        return self.alter_backward(dq, dk, dv)

    def alter_forward(self, q, k, v, out, lse):
        return out, lse

    def alter_backward(self, dq, dk, dv):
        return dq, dk, dv


def _noise(tensor: torch.Tensor, relative: float) -> torch.Tensor:
    """Fresh random noise on every call: a nondeterministic kernel."""
    return (tensor.double() * (1 + relative * torch.randn(tensor.shape, dtype=torch.float64))).to(tensor.dtype)


class FirstKeyLeak(_Broken):
    """The first key's value leaks into every output row: depends on key order."""

    def alter_forward(self, q, k, v, out, lse):
        group = q.shape[2] // k.shape[2]
        leak = v[:, :1].repeat_interleave(group, dim=2) if k.shape[1] else torch.zeros_like(out[:, :1])
        return out + 2**-4 * leak, lse


class LevelDependentOut(_Broken):
    """The output depends on the absolute level of the scores (through the LSE)."""

    def alter_forward(self, q, k, v, out, lse):
        level = torch.tanh(lse.nan_to_num(posinf=0.0, neginf=0.0)).permute(0, 2, 1).unsqueeze(-1)
        return out + (2**-4 * level).to(out.dtype), lse


class BatchLeak(_Broken):
    """Batch element b reads a little of batch element b + 1."""

    def alter_forward(self, q, k, v, out, lse):
        return out + 2**-4 * out.roll(1, dims=0), lse


class CausalPathShift(_Broken):
    """``causal=True`` runs with the diagonal one key too far right; windows are right."""

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        if causal:
            return DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, window_size=(window_size[0], 1))
        return DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, window_size=window_size)


class StrideBlind(_Broken):
    """Reads every input as if it were contiguous, whatever its strides."""

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        q, k, v = (torch.as_strided(t, t.shape, torch.empty(t.shape).stride(), t.storage_offset()) for t in (q, k, v))
        return DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)


class NoisyForward(_Broken):
    """Forward results vary from call to call (a race in the output write)."""

    def alter_forward(self, q, k, v, out, lse):
        return _noise(out, 2**-6), lse


class NoisyDkDv(_Broken):
    """dK and dV vary from call to call, in every mode."""

    def alter_backward(self, dq, dk, dv):
        return dq, _noise(dk, 2**-6), _noise(dv, 2**-6)


class NoisyDq(_Broken):
    """dQ varies by far more than any order of float32 atomic adds can explain."""

    def alter_backward(self, dq, dk, dv):
        return _noise(dq, 2**-6), dk, dv


class VarlenByLoop(_Broken):
    """Varlen entry points that run the reference on each packed sequence; ``overrun``
    extra keys past a sequence's end leak in from the next sequence (a cu_seqlens bug)."""

    capabilities = dataclasses.replace(DEFERRED.capabilities, varlen=True)

    def __init__(self, overrun: int = 0) -> None:
        self.overrun = overrun

    def _spans(self, cu_seqlens_q, cu_seqlens_k, total_k):
        for index in range(len(cu_seqlens_q) - 1):
            q0, q1 = int(cu_seqlens_q[index]), int(cu_seqlens_q[index + 1])
            k0, k1 = int(cu_seqlens_k[index]), int(cu_seqlens_k[index + 1])
            yield slice(q0, q1), slice(k0, min(k1 + self.overrun, total_k))

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32)
        for rows, keys in self._spans(cu_seqlens_q, cu_seqlens_k, k.shape[0]):
            o, l = DEFERRED.forward(q[None, rows], k[None, keys], v[None, keys], softmax_scale=softmax_scale, causal=causal, window_size=window_size)
            out[rows], lse[:, rows] = o[0], l[0]
        return out, lse

    def backward_varlen(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for rows, keys in self._spans(cu_seqlens_q, cu_seqlens_k, k.shape[0]):
            grads = DEFERRED.backward(
                dout[None, rows], q[None, rows], k[None, keys], v[None, keys], out[None, rows], lse[None, :, rows],
                softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            )
            dq[rows] = grads[0][0]
            dk[keys] += grads[1][0]
            dv[keys] += grads[2][0]
        return dq, dk, dv


class RandomOrderDq(_Broken):
    """A correct atomic dQ: per key block of 16, ``c_b = scale * dS_b K_b`` in float32,
    summed in a fresh random order on every call (as atomic adds land)."""

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        dq, dk, dv = super().backward(
            dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal, window_size=window_size
        )
        group = q.shape[2] // k.shape[2]
        keys, values = (t.double().repeat_interleave(group, dim=2) for t in (k, v))
        visible = visible_mask(q.shape[1], k.shape[1], causal=causal, window_size=window_size)
        logits = softmax_scale * torch.einsum("bihc,bjhc->bhij", q.double(), keys)
        finite_lse = torch.where(torch.isfinite(lse), lse.double(), torch.full_like(lse.double(), math.inf))
        p = torch.exp(logits - finite_lse.unsqueeze(-1)).masked_fill(~visible, 0.0)
        dp = torch.einsum("bihc,bjhc->bhij", dout.double(), values)
        delta = (dout.double() * out.double()).sum(-1).permute(0, 2, 1).unsqueeze(-1)
        ds = (p * (dp - delta)).float()
        blocks = list(range(0, k.shape[1], 16))
        accumulator = torch.zeros(q.shape, dtype=torch.float32)
        for start in (blocks[i] for i in self.block_order(len(blocks))):
            block = slice(start, start + 16)
            accumulator += softmax_scale * torch.einsum("bhij,bjhc->bihc", ds[..., block], keys[:, block].float())
        return accumulator.to(dq.dtype), dk, dv

    def block_order(self, count: int) -> list[int]:
        """The order in which this call adds the ``count`` key blocks' contributions: a fresh random one."""
        return torch.randperm(count).tolist()


class DriftingOrderDq(RandomOrderDq):
    """dQ of float32 key-block contributions (blocks of 16) added in a fixed order, except on every
    ``period``-th call of the process (a per-call counter), which adds them in reverse, in either backward
    mode: a race that shows once in ``period`` calls.  Reordering changes only float32 rounding, within
    the atomic-dQ bound; with ``declares_deterministic`` the kernel also declares a deterministic backward,
    a bitwise promise its ``deterministic=True`` dQ breaks (FA3's flag dropped in flash-attn PR #1766)."""

    def __init__(self, period: int, declares_deterministic: bool) -> None:
        self.period, self.calls = period, 0
        self.capabilities = dataclasses.replace(DEFERRED.capabilities, deterministic_backward=declares_deterministic)

    def block_order(self, count: int) -> list[int]:
        self.calls += 1
        order = list(range(count))
        return order[::-1] if self.calls % self.period == 0 else order


class GqaRandomOrderDkDv(_Broken):
    """A correct GQA backward in FlashAttention-4's manner: each query head's dK_h, dV_h in float32,
    summed over the group in a fresh random order on every call (as atomic adds land); it declares
    ``gqa_dkv_reproducible=False``."""

    capabilities = dataclasses.replace(DEFERRED.capabilities, gqa_dkv_reproducible=False)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        group = q.shape[2] // k.shape[2]
        dq, dk, dv = DEFERRED.backward(
            dout, q, *(t.repeat_interleave(group, dim=2) for t in (k, v)), out, lse,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        )  # fmt: skip

        def summed(per_head: torch.Tensor) -> torch.Tensor:
            heads = per_head.float().unflatten(2, (k.shape[2], group))
            total = torch.zeros_like(heads[:, :, :, 0])
            for member in torch.randperm(group).tolist():
                total += heads[:, :, :, member]
            return total.to(k.dtype)

        return dq, summed(dk), summed(dv)


class CompilationError(Exception):
    """Stands in for ``triton.compiler.errors.CompilationError``."""


class SmallHeadDimsFailToCompile:
    """``kernel``, except that its forward raises :class:`CompilationError` for a head dim below
    :attr:`SMALLEST`, which it still declares (as a Triton kernel whose ``tl.dot`` needs 16 columns):
    a kernel error at a declared shape, beside whatever ``kernel`` itself gets wrong."""

    SMALLEST = 9

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.capabilities = kernel.capabilities

    def forward(self, q, k, v, **options):
        if q.shape[-1] < self.SMALLEST:
            raise CompilationError(f"at 12:8: tl.dot needs K >= 16, got head_dim {q.shape[-1]}")
        return self.kernel.forward(q, k, v, **options)

    def backward(self, *args, **options):
        return self.kernel.backward(*args, **options)


FIRST_KEY_LEAK = FirstKeyLeak()
LEVEL_DEPENDENT_OUT = LevelDependentOut()
BATCH_LEAK = BatchLeak()
CAUSAL_PATH_SHIFT = CausalPathShift()
STRIDE_BLIND = StrideBlind()
NOISY_FORWARD = NoisyForward()
NOISY_DK_DV = NoisyDkDv()
NOISY_DQ = NoisyDq()
VARLEN_OVERRUN = VarlenByLoop(overrun=1)
VARLEN_BY_LOOP = VarlenByLoop()
RANDOM_ORDER_DQ = RandomOrderDq()
#: A race once in 8 calls: declaring a deterministic backward (broken) and not (correct).
DRIFTING_DQ_DECLARED_DETERMINISTIC = DriftingOrderDq(period=8, declares_deterministic=True)
DRIFTING_DQ = DriftingOrderDq(period=8, declares_deterministic=False)
SMALL_HEAD_DIMS_FAIL = SmallHeadDimsFailToCompile(DEFERRED)
SMALL_HEAD_DIMS_FAIL_LSE_BASE2 = SmallHeadDimsFailToCompile(mutants.LSE_BASE2)
