"""Mutant kernels: the reference kernel with one realistic bug each.

Every mutant is :class:`kernels.reference.TiledAttention` (deferred rescaling,
the same tiles as ``reference``, except :class:`LargeTileStaleMax`'s 128 x 128)
with one of its documented steps replaced; a :class:`VarlenMutant` also has varlen
entry points, one step of which is replaced.
They implement the kernel contract and claim the reference's capabilities, so
any check that passes the reference and misses a mutant has a blind spot.
Load one as ``tests.mutants:NAME`` (with the repository root on ``sys.path``);
:data:`MUTANTS` maps every name to its kernel.

:data:`SCALE_MUTANTS` are wrong only at production scale and right at every
shape of the fixed case set: a correct kernel (``triton`` on a GPU, whose
speed the scale set needs, ``reference`` on the CPU) behind one emulated
deviation that only appears past a size limit (:class:`ScaleMutant`).
``fa2-verify run --cases scale`` on a GPU is what catches them
(``lab/device/device-scale.sh``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any

import torch

from fa2_verify.core.contract import UNBOUNDED, Capabilities, diagonal_shift, effective_window, visible_mask
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.kernels.reference import DEFERRED, NEG_INF, Tiles, TiledAttention
from fa2_verify.verify.registry import LoadedKernel, load_kernel


class Mutant(TiledAttention):
    """A reference kernel with the tiles of ``reference``; ``config()`` names the bug."""

    def __init__(self) -> None:
        super().__init__(block_q=DEFERRED.block_q, block_k=DEFERRED.block_k, accumulate=DEFERRED.accumulate)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "mutant": type(self).__name__}


class LseBase2(Mutant):
    """Wrong log base: the LSE is written as ``log2 Σ exp(s)`` (base-2 exponent
    bookkeeping, as in kernels that use exp2, not converted back to natural log)."""

    def _lse(self, m, l):
        return super()._lse(m, l) / math.log(2.0)


class CausalShift(Mutant):
    """Mask off by one: the right edge of the causal/window diagonal is one key
    too far (``j <= i + seqlen_k - seqlen_q + right + 1``), so each query sees one future key."""

    def _visible(self, seqlen_q, seqlen_k, *, causal, window_size, device):
        left, right = effective_window(causal, window_size)
        shifted = (left, right + 1 if right != UNBOUNDED else right)
        return visible_mask(seqlen_q, seqlen_k, window_size=shifted, device=device)


class TopLeftCausal(Mutant):
    """Wrong mask alignment: the causal/window diagonal is top-left aligned
    (query ``i`` sees keys ``i - left..i + right``, flash-attn < 2.1 and PyTorch's
    ``is_causal``) instead of bottom-right; differs whenever seqlen_q != seqlen_k."""

    def _visible(self, seqlen_q, seqlen_k, *, causal, window_size, device):
        left, right = effective_window(causal, window_size)
        i = torch.arange(seqlen_q, device=device).unsqueeze(1)
        j = torch.arange(seqlen_k, device=device).unsqueeze(0)
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
        if left != UNBOUNDED:
            visible &= j >= i - left
        if right != UNBOUNDED:
            visible &= j <= i + right
        return visible


class SkipRescale(Mutant):
    """Missing rescale: the output accumulator is not multiplied by
    ``exp(m_old - m_new)`` when the running max rises (Algorithm 1, line 10),
    while ℓ is; wrong whenever a later key block raises a row's max."""

    def _rescale_accumulator(self, o, factor):
        return o


class SkipSmallRescale(Mutant):
    """A "negligible" rescale skipped: when the running max rises by less than 2^-12,
    ``α = exp(m_old - m_new)`` is taken as 1 for both ``O`` and ℓ (line 9) while ``P~``
    uses the new max, so the earlier keys' weights are too large by a factor up to e^(2^-12)."""

    def _rescale_factor(self, m_old, m_new):
        factor = super()._rescale_factor(m_old, m_new)
        return torch.where(m_new - m_old < 2.0**-12, torch.ones_like(factor), factor)


class MaxFromZero(Mutant):
    """Running max started at 0 instead of -inf (Algorithm 1, line 5), as a kernel that zero-fills its
    statistics does: exact while a row's max is at least 0, but a row whose scores all lie far below 0 is
    exponentiated against 0, so its weights underflow (below -87 in float32) and the row reads 0."""

    def _initial_max(self) -> float:
        return 0.0


class MaxFromSentinel(Mutant):
    """A finite "-inf" (FlashInfer's ``math::inf = 5e4``, flashinfer #4267, #4451, #4452): the running max
    starts at -5e4 (Algorithm 1, line 5) and keys hidden by the mask score -5e4.  A row whose scores all
    lie below -5e4 is exponentiated against -5e4: its weights underflow and it reads 0; a row without keys
    in a query block that sees keys weighs each hidden key e^0: its out is their mean and its LSE finite."""

    SENTINEL = -5e4

    def _initial_max(self) -> float:
        return self.SENTINEL

    def _masked_score(self) -> float:
        return self.SENTINEL


class StaleMax(Mutant):
    """Stale running max: a block's probabilities are exponentiated against the
    max from before this block's update (``P~ = exp(S - m_old)``, line 9) while
    the accumulators are rescaled to the new max; the first visible block uses its own max."""

    def _probability_max(self, m_old, m_new):
        return torch.where(m_old == NEG_INF, m_new, m_old)


class WindowOffByOne(Mutant):
    """Window edge off by one: the left edge admits one key too many
    (``j >= i + seqlen_k - seqlen_q - left - 1``)."""

    def _visible(self, seqlen_q, seqlen_k, *, causal, window_size, device):
        left, right = effective_window(causal, window_size)
        widened = (left + 1 if left != UNBOUNDED else left, right)
        return visible_mask(seqlen_q, seqlen_k, window_size=widened, device=device)


class WindowLeftExclusive(Mutant):
    """Exclusive left window edge: the key ``left`` keys before the diagonal is dropped
    (``j > i + seqlen_k - seqlen_q - left``), as in a kernel that takes the inclusive bound for an exclusive
    one and loses one in-window key per step (SGLang PR #32087).  WINDOW_OFF_BY_ONE moves the same edge
    the other way (one key too many); here a ``(0, right)`` window loses the diagonal itself."""

    def _visible(self, seqlen_q, seqlen_k, *, causal, window_size, device):
        visible = super()._visible(seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=device)
        left = effective_window(causal, window_size)[0]
        if left == UNBOUNDED:
            return visible
        diagonal = torch.arange(seqlen_q, device=device).unsqueeze(1) + diagonal_shift(seqlen_q, seqlen_k)
        return visible & (torch.arange(seqlen_k, device=device).unsqueeze(0) != diagonal - left)


class WindowMinusOneAsEdge(Mutant):
    """-1 read as a band edge, not as "unbounded", once a window has a finite side: both sides are taken
    literally (``i + shift + 1 <= j`` for ``left = -1``, ``j <= i + shift - 1`` for ``right = -1``), so
    ``(-1, 0)`` and ``(0, -1)`` are empty bands and the rows read 0 (TransformerEngine #3528:
    FlashAttention-4 returned zeros for the ``(-1, 0)`` it was passed).  No window and causal are right."""

    def _visible(self, seqlen_q, seqlen_k, *, causal, window_size, device):
        if tuple(window_size) == (UNBOUNDED, UNBOUNDED):
            return super()._visible(seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=device)
        left, right = effective_window(causal, window_size)
        diagonal = torch.arange(seqlen_q, device=device).unsqueeze(1) + diagonal_shift(seqlen_q, seqlen_k)
        j = torch.arange(seqlen_k, device=device).unsqueeze(0)
        return (j >= diagonal - left) & (j <= diagonal + right)


class GqaWrongHead(Mutant):
    """Wrong GQA head mapping: query head ``h`` reads kv head ``h % heads_kv``
    instead of ``h // (heads_q // heads_kv)`` (forward and backward alike)."""

    def _kv_heads(self, heads_q, heads_kv, device):
        return torch.arange(heads_q, device=device) % heads_kv


class TailBlockUnwritten(Mutant):
    """Grid too small: the last query block, when partial (seqlen_q not a
    multiple of block_q), is never written; out, lse and dq keep whatever the
    allocator held there (NaN under memory poisoning)."""

    def _written_query_blocks(self, tiles: Tiles) -> range:
        partial = tiles.visible.shape[0] % tiles.block_q != 0
        return range(tiles.num_q - 1 if partial else tiles.num_q)


class TailUnmasked(Mutant):
    """Missing bounds check: the last key block is read in full; the padding
    keys past seqlen_k read as zeros and are visible to every query (forward)."""

    def _forward_keys(self, k, v, visible):
        seqlen_k = k.shape[2]
        padding = -seqlen_k % self.block_k
        pad_rows = (0, 0, 0, padding)
        visible = torch.nn.functional.pad(visible, (0, padding), value=True)
        return torch.nn.functional.pad(k, pad_rows), torch.nn.functional.pad(v, pad_rows), visible


class BwdTailUnmasked(Mutant):
    """Missing bounds check in the backward (cuDNN's Hopper backward, pytorch #196678, cudnn-frontend
    #1072): the last key block is read in full, its padding past seqlen_k zeros that score ``q . 0 = 0``,
    visible to every query.  With an ordinary LSE that changes no output (``exp(0 - L)`` is finite and
    meets only zero keys and values); once a row's ``L < -ln(FLT_MAX) = -88.7`` (float32 accumulators;
    sooner where dS is rounded to float16), ``exp(0 - L)`` overflows and ``dS K`` multiplies inf by 0: NaN in dq."""

    _padding = 0

    def _visible(self, seqlen_q, seqlen_k, *, causal, window_size, device):
        visible = super()._visible(seqlen_q, seqlen_k - self._padding, causal=causal, window_size=window_size, device=device)
        return torch.nn.functional.pad(visible, (0, self._padding), value=True)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        seqlen_k = k.shape[1]
        self._padding = -seqlen_k % self.block_k
        keys = (0, 0, 0, 0, 0, self._padding)
        try:
            dq, dk, dv = super().backward(
                dout, q, torch.nn.functional.pad(k, keys), torch.nn.functional.pad(v, keys), out, lse,
                softmax_scale=softmax_scale, causal=causal, window_size=window_size, deterministic=deterministic,
            )
        finally:
            self._padding = 0
        return dq, dk[:, :seqlen_k].contiguous(), dv[:, :seqlen_k].contiguous()


class AccInInputDtype(Mutant):
    """Low-precision accumulation: S, the softmax statistics, O, and all
    backward accumulators are kept in the input dtype (float16/bfloat16)
    instead of float32."""

    def _accumulator_dtype(self, dtype):
        return dtype


class DeltaFromRounded(Mutant):
    """Wrong ``D`` (Algorithm 2, line 4): ``D = rowsum(dO)``, the factor O
    dropped, so ``dS = P ∘ (dP - D)`` subtracts the wrong row term (dq, dk wrong)."""

    def _delta(self, dout, out):
        return dout.sum(dim=-1)


class DqMissingScale(Mutant):
    """Missing chain-rule factor: dq is written without the softmax scale
    (``dQ = dS K`` instead of ``scale · dS K``)."""

    def _finish_dq(self, dq, softmax_scale):
        return dq


class DkDvGqaNotSummed(Mutant):
    """Missing GQA reduction: dK/dV of a kv head come from the first query
    head of its group only, not the sum over the group."""

    def _reduce_heads(self, grad, kv_heads, heads_kv):
        first = [int(torch.nonzero(kv_heads == g)[0]) for g in range(heads_kv)]
        return grad[:, first]


class DkChunkOffset(Mutant):
    """Head dim split into chunks of 128 columns, and the second chunk of ``dK_j += dS^T Q_i``
    (line 16) reads Q at the first chunk's columns (its column offset never advanced):
    dK is wrong only for head_dim > 128."""

    chunk = 128

    def _key_gradient(self, ds, q_i):
        update = super()._key_gradient(ds, q_i)
        head_dim = q_i.shape[-1]
        if head_dim > self.chunk:
            update[..., self.chunk :] = super()._key_gradient(ds, q_i[..., : head_dim - self.chunk])
        return update


class DqLostUpdate(Mutant):
    """Lost update to dq (a dropped atomic add): the last key block's
    contribution ``dS K_j`` never reaches dQ (Algorithm 2, line 15)."""

    def _add_dq(self, dq, rows, update, key_block, num_key_blocks):
        if key_block != num_key_blocks - 1:
            super()._add_dq(dq, rows, update, key_block, num_key_blocks)


class DsFlushSubnormal(Mutant):
    """No subnormals in dS: every ``|dS_ij|`` below the input dtype's smallest normal
    (float16 ``2^-14``) is flushed to zero before ``dS K`` and ``dS^T Q`` (lines 15-16),
    instead of rounded with gradual underflow (an error up to ``2^-25``)."""

    def _score_gradient(self, p, dp, delta, dtype):
        ds = super()._score_gradient(p, dp, delta, dtype)
        return ds.masked_fill(ds.abs() < torch.finfo(dtype).smallest_normal, 0.0)


class EmptyRowNan(Mutant):
    """No guard for ``m = -inf``: a row with no visible key so far computes
    ``exp(-inf - (-inf)) = NaN``, so fully masked rows (and rows whose first
    tile is fully masked) become NaN."""

    def _guard_max(self, m):
        return m


class OutRewrittenByBackward(Mutant):
    """Forward results repaired in place: forward returns ``1.5 * out``, and
    backward writes the correct O into the ``out`` it is handed before using it
    (a backward that recomputes O into the caller's buffer), so a check that
    reads the forward's out after backward sees the right values."""

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out, lse = super().forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        return 1.5 * out, lse

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        masking = {"softmax_scale": softmax_scale, "causal": causal, "window_size": window_size}
        out.copy_(super().forward(q, k, v, **masking)[0])
        return super().backward(dout, q, k, v, out, lse, deterministic=deterministic, **masking)


class BackwardExits(Mutant):
    """Exits the process: backward computes the gradients, then calls
    ``sys.exit(0)`` (a launch wrapper that treats a failed check as fatal and
    exits with status 0), so a harness that lets ``SystemExit`` through ends
    with status 0 and nothing reported."""

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        super().backward(
            dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal, window_size=window_size, deterministic=deterministic
        )
        sys.exit(0)


class CausalOsExits(Mutant):
    """Ends the process: a launch wrapper whose causal path was not compiled in calls ``os._exit(0)``
    on every causal forward (as a C++ ``exit(0)`` after printing "not built"), skipping every ``finally``
    and handler, so a harness that does not stand in for ``os._exit`` ends with status 0, nothing reported."""

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        if causal:
            os._exit(0)
        return super().forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)


class DecodeIgnoresWindow(Mutant):
    """Decoding path without the window: with ``seqlen_q == 1`` the single query sees every key,
    its sliding window (left edge ``seqlen_k - 1 - left``) and causal mask dropped; longer queries are right."""

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        if q.shape[1] == 1:
            causal, window_size = False, (UNBOUNDED, UNBOUNDED)
        return super().forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)


class DeterministicDqDropsLastBlock(Mutant):
    """Deterministic mode only: with ``deterministic=True`` dQ is reduced over key blocks by a separate
    path that never adds the last key block's ``dS K_j`` (Algorithm 2, line 15); the default mode is right."""

    _deterministic = False

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        self._deterministic = deterministic
        try:
            return super().backward(
                dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                deterministic=deterministic,
            )
        finally:
            self._deterministic = False

    def _add_dq(self, dq, rows, update, key_block, num_key_blocks):
        if not (self._deterministic and key_block == num_key_blocks - 1 and num_key_blocks > 1):
            super()._add_dq(dq, rows, update, key_block, num_key_blocks)


class LargeTileStaleMax(Mutant):
    """:class:`StaleMax`'s bug (``P~ = exp(S - m_old)``) in a kernel with production tiles of 128 x 128:
    it shows only where a query row's visible keys span more than one 128-key tile."""

    def __init__(self) -> None:
        TiledAttention.__init__(self, block_q=128, block_k=128, accumulate=DEFERRED.accumulate)

    def _probability_max(self, m_old, m_new):
        return torch.where(m_old == NEG_INF, m_new, m_old)


class SplitKvLseMax(Mutant):
    """Split-KV (flash-decoding) combine: for ``seqlen_q <= 16`` and ``seqlen_k > 128`` the keys are split
    into chunks of 128 and the outputs combined correctly, but the LSE written is ``max_s lse_s`` over
    the chunks instead of ``log Σ_s exp(lse_s)``."""

    split = 128

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out, lse = super().forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        if seqlen_q > 16 or seqlen_k <= self.split:
            return out, lse
        visible = self._visible(seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=q.device)
        keys = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2).double()
        scores = (softmax_scale * torch.einsum("bihc,bjhc->bhij", q.double(), keys)).masked_fill(~visible, NEG_INF)
        chunks = [torch.logsumexp(scores[..., j : j + self.split], -1) for j in range(0, seqlen_k, self.split)]
        return out, torch.stack(chunks, -1).amax(-1).to(torch.float32)


class SplitPartialsInFloat8(Mutant):
    """Over-declared split-KV: the output is stored through float8 (e4m3, three mantissa bits, 2^-4
    relative) as a split's partial, while ``config()`` declares a million key splits in the input dtype
    (``partial_sums.out_splits``, docs/error-model.md eq. 2b).  Taken at its word, the declaration's
    ``2 gamma_S`` (0.13 for float32 accumulation) would cover float8; a row that sees ``n_i`` keys fills at
    most ``n_i`` splits, and the error model counts no more."""

    SPLITS = 10**6

    def config(self) -> dict[str, Any]:
        declared = {"out_splits": self.SPLITS}
        return {**super().config(), "partial_sums": {"cpu": declared, "cuda": declared}}

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out, lse = super().forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        return out.to(torch.float8_e4m3fn).to(out.dtype), lse


class VarlenMutant(Mutant):
    """A varlen kernel: the varlen entry points of :mod:`core.contract` run each packed sequence
    (``cu_seqlens``) through this kernel's padded path; subclasses replace one step of the packing."""

    def __init__(self) -> None:
        super().__init__()
        self.capabilities = dataclasses.replace(self.capabilities, varlen=True)

    def _packed_q(self, q: torch.Tensor) -> torch.Tensor:
        """The packed queries as the kernel reads them."""
        return q

    def _add_varlen_dq(self, deterministic: bool) -> None:
        """Set up the dQ accumulation of a varlen backward in mode ``deterministic``."""

    @staticmethod
    def _spans(cu_seqlens_q, cu_seqlens_k):
        bounds = zip(cu_seqlens_q.tolist(), cu_seqlens_q.tolist()[1:], cu_seqlens_k.tolist(), cu_seqlens_k.tolist()[1:])
        return [(slice(q0, q1), slice(k0, k1)) for q0, q1, k0, k1 in bounds]

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale,
                       causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        q = self._packed_q(q)
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
        for rows, keys in self._spans(cu_seqlens_q, cu_seqlens_k):
            o, l = self.forward(q[None, rows], k[None, keys], v[None, keys], softmax_scale=softmax_scale, causal=causal,
                                window_size=window_size)
            out[rows], lse[:, rows] = o[0], l[0]
        return out, lse

    def backward_varlen(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                        softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        self._add_varlen_dq(deterministic)
        try:
            for rows, keys in self._spans(cu_seqlens_q, cu_seqlens_k):
                grads = self.backward(dout[None, rows], q[None, rows], k[None, keys], v[None, keys], out[None, rows],
                                      lse[None, :, rows], softmax_scale=softmax_scale, causal=causal, window_size=window_size)
                dq[rows], dk[keys], dv[keys] = grads[0][0], grads[1][0], grads[2][0]
        finally:
            self._add_varlen_dq(False)
        return dq, dk, dv


class VarlenDeterministicDqDropsLastBlock(VarlenMutant):
    """Varlen deterministic mode only: ``backward_varlen(deterministic=True)`` reduces each sequence's dQ
    over key blocks by a path that never adds the last key block's ``dS K_j`` (Algorithm 2, line 15);
    the default varlen mode and the padded deterministic backward are right."""

    _drop_last = False

    def _add_varlen_dq(self, deterministic):
        self._drop_last = deterministic

    def _add_dq(self, dq, rows, update, key_block, num_key_blocks):
        if not (self._drop_last and key_block == num_key_blocks - 1 and num_key_blocks > 1):
            super()._add_dq(dq, rows, update, key_block, num_key_blocks)


class VarlenQAssumedContiguous(VarlenMutant):
    """``forward_varlen`` reads q with the strides of a contiguous (total_q, heads, head_dim) tensor whatever
    its strides: q sliced from a packed qkv tensor, or with padding rows, is read from the wrong addresses."""

    def _packed_q(self, q):
        return torch.as_strided(q, q.shape, torch.empty(q.shape).stride(), q.storage_offset())


class VarlenReadsPadding(VarlenMutant):
    """``forward_varlen`` reads each sequence's last key tile of V in full, past ``cu_seqlens_k[i + 1]`` up to
    the tile's end, and multiplies those rows by ``P = 0``: inside the batch they are the next sequence's
    keys (numbers, so the product is 0), but past the last sequence they are the packed batch's padding
    (vLLM #30887, V tiles read outside what a row sees), and padding holding NaN makes the output NaN."""

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, *args, **options):
        out, lse = super().forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *args, **options)
        for rows, keys in self._spans(cu_seqlens_q, cu_seqlens_k):
            past = -(keys.stop - keys.start) % self.block_k
            if past and keys.stop > keys.start and rows.stop > rows.start:
                tail = _read_storage(v, (1, past, *v.shape[1:]), (0, *v.stride()), v.storage_offset() + keys.stop * v.stride(0))
                out[rows] = _plus_zero_times(out[None, rows], tail)[0]
        return out, lse



def _read_storage(tensor: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> torch.Tensor:
    """What a kernel reads from ``tensor``'s storage through ``shape`` and ``strides`` from element ``offset``,
    as pointer arithmetic reads it: the storage's elements where they exist, 0 past either end of the
    storage (memory past an allocation, which a GPU reads without faulting, taken as zeros)."""
    flat = tensor.new_empty(0).set_(tensor.untyped_storage())
    index = torch.full(shape, offset, dtype=torch.int64, device=tensor.device)
    for dim, (size, stride) in enumerate(zip(shape, strides)):
        index += (torch.arange(size, device=tensor.device) * stride).view([-1 if d == dim else 1 for d in range(len(shape))])
    inside = (index >= 0) & (index < flat.numel())
    return torch.where(inside, flat[index.clamp(0, max(flat.numel() - 1, 0))], torch.zeros((), dtype=tensor.dtype))


def _contiguous_view(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` read from its storage offset with the strides of a contiguous tensor of its shape."""
    return _read_storage(tensor, tuple(tensor.shape), torch.empty(tensor.shape, device="meta").stride(), tensor.storage_offset())


def _plus_zero_times(out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``out + P V_past`` with ``P = 0`` for the key rows ``rows`` (batch, keys, heads_kv, head_dim) a tile
    read past the visible keys: exact on finite rows, NaN where a row holds NaN (``0 * NaN``)."""
    group = out.shape[2] // rows.shape[2]
    zeros = torch.zeros(out.shape[0], out.shape[2], out.shape[1], rows.shape[1], dtype=torch.float32)
    past = torch.einsum("bhij,bjhd->bihd", zeros, rows.repeat_interleave(group, dim=2).to(torch.float32))
    return (out.to(torch.float32) + past).to(out.dtype)


class DoutOutStridesFromShape(Mutant):
    """The backward walks dO and out with the strides of a contiguous (batch, seqlen, heads, head_dim) tensor,
    computed from their shapes, whatever their strides: a dO or out that is a view with a larger outer
    stride (flash-attn #2611, a dO view past 2^31; FlagGems #5235, rows walked by the wrong stride) or with
    heads outermost is read from the wrong addresses."""

    def backward(self, dout, q, k, v, out, lse, **options):
        return super().backward(_contiguous_view(dout), q, k, v, _contiguous_view(out), lse, **options)


class KvBatchStrideFromShape(Mutant):
    """K and V are read from their storage with the batch stride ``seqlen_k * heads_kv * head_dim`` that a
    dense tensor would have: a K/V broadcast over batch with stride 0 (PyTorch #191937, errors of 19.5 in
    its memory-efficient kernel for shared-KV GQA) is read past its one copy for every batch element but
    the first, as is any K/V whose batch stride is not the dense one."""

    @staticmethod
    def _dense_batch(t):
        strides = (t.shape[1] * t.shape[2] * t.shape[3], *t.stride()[1:])
        return _read_storage(t, tuple(t.shape), strides, t.storage_offset())

    def forward(self, q, k, v, **options):
        return super().forward(q, self._dense_batch(k), self._dense_batch(v), **options)

    def backward(self, dout, q, k, v, out, lse, **options):
        return super().backward(dout, q, self._dense_batch(k), self._dense_batch(v), out, lse, **options)


class PointerRoundedTo16Bytes(Mutant):
    """The forward loads q, k and v from their data pointers rounded down to 16 bytes (a kernel issuing
    128-bit loads from what it assumes is an aligned base): a tensor at a storage offset that is not a
    multiple of 16 bytes is read shifted by the remainder."""

    @staticmethod
    def _aligned_down(t):
        per_16 = max(1, 16 // t.element_size())
        return _read_storage(t, tuple(t.shape), t.stride(), t.storage_offset() // per_16 * per_16)

    def forward(self, q, k, v, **options):
        return super().forward(*(self._aligned_down(t) for t in (q, k, v)), **options)


class VPastSeqlenTimesZero(Mutant):
    """The forward's last key tile reads V in full, past ``seqlen_k`` up to the tile's end, and multiplies
    those rows by their ``P = 0`` instead of not loading them (FlashAttention-3/4, V rows past
    ``seqused_k``, flash-attn #2374): exact while the memory there holds numbers, NaN where it holds NaN."""

    def forward(self, q, k, v, **options):
        out, lse = super().forward(q, k, v, **options)
        seqlen_k = k.shape[1]
        past = -seqlen_k % self.block_k
        if not (past and seqlen_k):
            return out, lse
        rows = _read_storage(v, (v.shape[0], past, *v.shape[2:]), v.stride(), v.storage_offset() + seqlen_k * v.stride(1))
        return _plus_zero_times(out, rows), lse



LSE_BASE2 = LseBase2()
CAUSAL_SHIFT = CausalShift()
TOP_LEFT_CAUSAL = TopLeftCausal()
SKIP_RESCALE = SkipRescale()
SKIP_SMALL_RESCALE = SkipSmallRescale()
STALE_MAX = StaleMax()
MAX_FROM_SENTINEL = MaxFromSentinel()
WINDOW_OFF_BY_ONE = WindowOffByOne()
WINDOW_LEFT_EXCLUSIVE = WindowLeftExclusive()
WINDOW_MINUS_ONE_AS_EDGE = WindowMinusOneAsEdge()
GQA_WRONG_HEAD = GqaWrongHead()
TAIL_BLOCK_UNWRITTEN = TailBlockUnwritten()
TAIL_UNMASKED = TailUnmasked()
BWD_TAIL_UNMASKED = BwdTailUnmasked()
ACC_IN_INPUT_DTYPE = AccInInputDtype()
DELTA_FROM_ROUNDED = DeltaFromRounded()
DQ_MISSING_SCALE = DqMissingScale()
DK_DV_GQA_NOT_SUMMED = DkDvGqaNotSummed()
DK_CHUNK_OFFSET = DkChunkOffset()
DQ_LOST_UPDATE = DqLostUpdate()
DS_FLUSH_SUBNORMAL = DsFlushSubnormal()
EMPTY_ROW_NAN = EmptyRowNan()
MAX_FROM_ZERO = MaxFromZero()
OUT_REWRITTEN_BY_BACKWARD = OutRewrittenByBackward()
BACKWARD_EXITS = BackwardExits()
CAUSAL_OS_EXITS = CausalOsExits()
DECODE_IGNORES_WINDOW = DecodeIgnoresWindow()
DETERMINISTIC_DQ_DROPS_LAST_BLOCK = DeterministicDqDropsLastBlock()
LARGE_TILE_STALE_MAX = LargeTileStaleMax()
SPLIT_KV_LSE_MAX = SplitKvLseMax()
SPLIT_PARTIALS_IN_FLOAT8 = SplitPartialsInFloat8()
VARLEN_DETERMINISTIC_DQ_DROPS_LAST_BLOCK = VarlenDeterministicDqDropsLastBlock()
VARLEN_Q_ASSUMED_CONTIGUOUS = VarlenQAssumedContiguous()
DOUT_OUT_STRIDES_FROM_SHAPE = DoutOutStridesFromShape()
KV_BATCH_STRIDE_FROM_SHAPE = KvBatchStrideFromShape()
POINTER_ROUNDED_TO_16_BYTES = PointerRoundedTo16Bytes()
V_PAST_SEQLEN_TIMES_ZERO = VPastSeqlenTimesZero()
VARLEN_READS_PADDING = VarlenReadsPadding()

#: name -> mutant kernel; ``tests.mutants:NAME`` loads the same object.
MUTANTS: dict[str, Mutant] = {
    name: kernel for name, kernel in globals().items() if name.isupper() and isinstance(kernel, Mutant)
}


class ScaleMutant:
    """A correct kernel per device (:data:`BASES`) with one deviation past a size limit.

    Capabilities are the base kernels': the reference's on the CPU, the
    triton kernel's on CUDA.
    """

    #: device type -> the bundled kernel the mutant deviates from.
    BASES = {"cpu": "reference", "cuda": "triton"}

    def base(self, device: torch.device) -> LoadedKernel:
        return load_kernel(self.BASES[device.type])

    @property
    def capabilities(self) -> Capabilities:
        cpu, cuda = (load_kernel(self.BASES[device]).capabilities for device in ("cpu", "cuda"))
        dtypes = {"cpu": cpu.dtypes["cpu"], **({"cuda": cuda.dtypes["cuda"]} if "cuda" in cuda.dtypes else {})}
        return Capabilities(
            dtypes=dtypes,
            head_dims=cpu.head_dims,
            device_head_dims={"cuda": cuda.head_dims},
            deterministic_backward=True,
        )

    def config(self) -> dict[str, Any]:
        return {"mutant": type(self).__name__, "bases": dict(self.BASES)}


class KeysPastLimitIgnored(ScaleMutant):
    """Keys at index ``key_limit`` (65,536) and beyond are never visited, as
    in a kernel whose key-block loop bound or key index is held in 16 bits:
    the outputs are those of the keys below the limit under the same
    bottom-right aligned mask, and ``dk``/``dv`` of the ignored keys are 0."""

    def __init__(self, key_limit: int = 1 << 16) -> None:
        self.key_limit = key_limit

    def _visited_window(self, seqlen_k: int, causal: bool, window_size: tuple[int, int]) -> tuple[int, int]:
        """The window that, over the first ``key_limit`` keys, keeps each query's diagonal where it was.

        Cutting ``seqlen_k`` to the limit moves the bottom-right diagonal
        left by ``shift = seqlen_k - key_limit``; widening the right edge and
        narrowing the left edge by ``shift`` puts every visible key back.
        """
        shift = seqlen_k - self.key_limit
        left, right = effective_window(causal, window_size)
        if left != UNBOUNDED and left < shift:
            raise UnsupportedCase(f"{type(self).__name__}: a left window of {left} cannot be kept past {shift} cut keys")
        return (UNBOUNDED if left == UNBOUNDED else left - shift, UNBOUNDED if right == UNBOUNDED else right + shift)

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        base = self.base(q.device)
        if k.shape[1] <= self.key_limit:
            return base.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        window = self._visited_window(k.shape[1], causal, window_size)
        kept = slice(0, self.key_limit)
        return base.forward(q, k[:, kept], v[:, kept], softmax_scale=softmax_scale, causal=False, window_size=window)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED),
                 deterministic=False):
        base = self.base(q.device)
        masking = {"softmax_scale": softmax_scale, "deterministic": deterministic}
        if k.shape[1] <= self.key_limit:
            return base.backward(dout, q, k, v, out, lse, causal=causal, window_size=window_size, **masking)
        window = self._visited_window(k.shape[1], causal, window_size)
        kept, ignored = slice(0, self.key_limit), slice(self.key_limit, None)
        dq, dk, dv = base.backward(dout, q, k[:, kept], v[:, kept], out, lse, causal=False, window_size=window, **masking)
        return dq, torch.cat([dk, torch.zeros_like(k[:, ignored])], 1), torch.cat([dv, torch.zeros_like(v[:, ignored])], 1)


class BatchOffsetWrap(ScaleMutant):
    """The element offset of q's batch ``b``, ``b * seqlen_q * heads_q * head_dim``,
    is computed in a signed ``offset_bits``-bit (32-bit) integer: past 2^31
    elements it wraps negative, and the kernel reads that batch's queries
    from the wrapped address (emulated as the same offset modulo q's size),
    in the forward and the backward alike."""

    def __init__(self, offset_bits: int = 32) -> None:
        self.offset_bits = offset_bits

    def _read_q(self, q: torch.Tensor) -> torch.Tensor:
        """q as the kernel reads it: each batch from its offset wrapped to ``offset_bits`` bits."""
        limit, modulus = 1 << (self.offset_bits - 1), 1 << self.offset_bits
        stride = q[0].numel()
        if (q.shape[0] - 1) * stride < limit:
            return q
        flat = q.reshape(-1)
        batches = []
        for b in range(q.shape[0]):
            wrapped = (b * stride + limit) % modulus - limit
            start = wrapped % flat.numel()
            read = flat[start : start + stride]
            if wrapped != b * stride and len(read) < stride:
                read = torch.cat([read, flat[: stride - len(read)]])
            batches.append(read.reshape(q.shape[1:]))
        return torch.stack(batches)

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        return self.base(q.device).forward(
            self._read_q(q), k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size
        )

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED),
                 deterministic=False):
        return self.base(q.device).backward(
            dout, self._read_q(q), k, v, out, lse, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, deterministic=deterministic,
        )


class StaleLastQueryTile(ScaleMutant):
    """From ``min_seqlen_q`` (131,072) query rows on, the last query tile of ``tile`` (64) rows is
    never stored: its ``out`` and ``lse`` rows keep what the tile before it wrote at the same offsets,
    as in a kernel whose grid stops one query block short once the block count passes a 16-bit
    limit and whose output buffer is reused.  The backward is the base's, on those outputs."""

    def __init__(self, min_seqlen_q: int = 1 << 17, tile: int = 64) -> None:
        self.min_seqlen_q, self.tile = min_seqlen_q, tile

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out, lse = self.base(q.device).forward(
            q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size
        )
        seqlen_q = q.shape[1]
        if seqlen_q < self.min_seqlen_q or seqlen_q <= self.tile:
            return out, lse
        last = (seqlen_q - 1) // self.tile * self.tile
        stale = slice(last, seqlen_q)
        previous = slice(last - self.tile, seqlen_q - self.tile)
        out, lse = out.clone(), lse.clone()
        out[:, stale], lse[:, :, stale] = out[:, previous], lse[:, :, previous]
        return out, lse

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED),
                 deterministic=False):
        return self.base(q.device).backward(
            dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            deterministic=deterministic,
        )


KEYS_PAST_65536_IGNORED = KeysPastLimitIgnored()
BATCH_OFFSET_INT32_WRAP = BatchOffsetWrap()
LAST_QUERY_TILE_STALE = StaleLastQueryTile()

#: name -> scale mutant; ``tests.mutants:NAME`` loads the same object.
SCALE_MUTANTS: dict[str, ScaleMutant] = {
    "KEYS_PAST_65536_IGNORED": KEYS_PAST_65536_IGNORED,
    "BATCH_OFFSET_INT32_WRAP": BATCH_OFFSET_INT32_WRAP,
    "LAST_QUERY_TILE_STALE": LAST_QUERY_TILE_STALE,
}
