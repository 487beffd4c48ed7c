"""Correct kernels with legitimately different numerics: positive controls for the error model.

Each is :class:`kernels.reference.TiledAttention` with one documented step done
the way another correct FA2 implementation does it, within the model kernel of
docs/error-model.md.  A check that fails one of them raises a false alarm
(docs/properties.md, "Correct kernels of other numerics").

:class:`Variant` combines the roundings and orders a production kernel may
use: P kept in float32 (``p_round=False``), base-2 exponentials (``exp2``),
keys in ``splits`` flash-decoding splits combined by their LSEs (each split's
O stored in the input dtype with ``partial_in_dtype``, declared as
``out_splits``, eq. 2b), the head dim in ``score_chunks`` partial products, a
float64 backward, dQ added in the input dtype per key block and GQA dK/dV
added in the input dtype head by head (both declared as ``partial_sums``, eq.
7b to 9b), eager rescaling, other tiles.  ``tests/test_variants.py`` checks
that each computes attention (it agrees with the reference in float64);
``lab/false-alarms.sh`` runs the property suite against all of :data:`NAMES`.
"""

from __future__ import annotations

import math

import torch

from fa2_verify.core.contract import UNBOUNDED
from fa2_verify.kernels.reference import DEFERRED, NEG_INF, Tiles, TiledAttention, _accumulated, _check_inputs


class RoundedProbabilityScoreGradient(TiledAttention):
    """``dS = fl_T(P) ∘ (dP - D)``: the backward forms dS from ``P`` rounded to the input
    dtype (with its subnormals), the copy it made for ``dV = P^T dO``, as PyTorch's
    memory-efficient backward does (docs/error-model.md, equation (6))."""

    def __init__(self) -> None:
        super().__init__(block_q=DEFERRED.block_q, block_k=DEFERRED.block_k, accumulate=DEFERRED.accumulate)

    def _score_gradient(self, p: torch.Tensor, dp: torch.Tensor, delta: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return super()._score_gradient(p.to(dtype).to(p.dtype), dp, delta, dtype)


ROUNDED_P_DS = RoundedProbabilityScoreGradient()


LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


class Variant(TiledAttention):
    """:class:`TiledAttention` with the numerics its keyword arguments name (module docstring)."""

    def __init__(self, *, p_round=True, exp2=False, splits=1, partial_in_dtype=False, score_chunks=1,
                 backward_f64=False, gqa_per_head_dtype=False, dq_dtype_per_block=False, **kw):
        super().__init__(**kw)
        self.p_round, self.exp2, self.splits, self.partial_in_dtype = p_round, exp2, splits, partial_in_dtype
        self.score_chunks, self.backward_f64 = score_chunks, backward_f64
        self.gqa_per_head_dtype, self.dq_dtype_per_block = gqa_per_head_dtype, dq_dtype_per_block

    def config(self):
        c = super().config()
        c.update(p_round=self.p_round, exp2=self.exp2, splits=self.splits, partial_in_dtype=self.partial_in_dtype,
                 score_chunks=self.score_chunks, backward_f64=self.backward_f64)
        ps = {}
        if self.gqa_per_head_dtype:
            ps["dkv_rows"] = 1 << 30
        if self.dq_dtype_per_block:
            ps["dq_keys"] = self.block_k
        if self.splits > 1 and self.partial_in_dtype:
            ps["out_splits"] = self.splits
        if ps:
            c["partial_sums"] = {"cpu": ps, "cuda": ps}
        return c

    def _scores(self, q_i, k_j):
        """q_i k_j^T; with score_chunks > 1, head_dim split in chunks whose partial products are summed pairwise."""
        if self.score_chunks == 1:
            return q_i @ k_j.transpose(-1, -2)
        parts = [a @ b.transpose(-1, -2) for a, b in zip(q_i.tensor_split(self.score_chunks, -1),
                                                          k_j.tensor_split(self.score_chunks, -1))]
        while len(parts) > 1:
            parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        return parts[0]

    def _logits(self, q_i, k_j, softmax_scale):
        if self.exp2:
            return self._scores(q_i, k_j) * (softmax_scale * LOG2E)
        return self._scores(q_i, k_j) * softmax_scale

    def _exp(self, x):
        return torch.exp2(x) if self.exp2 else torch.exp(x)

    def _p(self, p, dtype):
        return p.to(dtype).to(p.dtype) if self.p_round else p

    def _partial(self, q_i, kh, vh, tiles, i, softmax_scale, dtype, blocks):
        """Online softmax over key blocks `blocks`: (O normalized, lse natural log), both in acc."""
        batch, heads, rows, _ = q_i.shape
        m = torch.full((batch, heads, rows), NEG_INF, dtype=q_i.dtype)
        l = torch.zeros_like(m)
        o = torch.zeros_like(q_i)
        for j in blocks:
            cols = tiles.cols(j)
            s = tiles.masked(self._logits(q_i, kh[:, :, cols], softmax_scale), i, j)
            m_new = torch.maximum(m, s.amax(dim=-1))
            mg = self._guard_max(m_new)
            alpha = self._exp(m - mg)
            p = self._exp(s - mg.unsqueeze(-1))
            l_new = alpha * l + p.sum(dim=-1)
            pv = self._p(p, dtype) @ vh[:, :, cols]
            if self.rescaling == "deferred":
                o = o * alpha.unsqueeze(-1) + pv
            else:
                l_safe = l_new.masked_fill(l_new == 0, 1.0)
                o = o * (alpha * l / l_safe).unsqueeze(-1) + pv / l_safe.unsqueeze(-1)
            m, l = m_new, l_new
        if self.rescaling == "deferred":
            o = o / l.masked_fill(l == 0, 1.0).unsqueeze(-1)
        if self.exp2:
            lse = torch.where(l > 0, (m + torch.log2(l)) * LN2, NEG_INF)
        else:
            lse = torch.where(l > 0, m + torch.log(l), NEG_INF)
        return o, lse

    def _forward_query_block(self, q_i, kh, vh, tiles, i, softmax_scale, dtype):
        blocks = list(tiles.key_blocks(i))
        if self.splits == 1:
            return self._partial(q_i, kh, vh, tiles, i, softmax_scale, dtype, blocks)
        parts = [self._partial(q_i, kh, vh, tiles, i, softmax_scale, dtype, list(chunk))
                 for chunk in _chunks(blocks, self.splits)]
        if self.partial_in_dtype:
            parts = [(o.to(dtype).to(o.dtype), lse) for o, lse in parts]
        lses = torch.stack([lse for _, lse in parts])
        lmax = lses.amax(0)
        lmax_g = lmax.masked_fill(lmax == NEG_INF, 0.0)
        weights = torch.exp(lses - lmax_g)
        total = weights.sum(0)
        lse = torch.where(total > 0, lmax_g + torch.log(total), NEG_INF)
        w = weights / total.masked_fill(total == 0, 1.0)
        o = sum(w_s.unsqueeze(-1) * o_s for w_s, (o_s, _) in zip(w, parts))
        return o, lse

    @torch.no_grad()
    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED),
                 deterministic=False):
        _check_inputs(q=q, k=k, v=v, out=out, dout=dout, lse=lse)
        seqlen_q, heads_q = q.shape[1], q.shape[2]
        heads_kv = k.shape[2]
        acc = torch.float64 if self.backward_f64 else self._accumulator_dtype(q.dtype)
        kv_heads = self._kv_heads(heads_q, heads_kv, q.device)
        tiles = Tiles.build(self._visible(seqlen_q, k.shape[1], causal=causal, window_size=window_size, device=q.device),
                            self.block_q, self.block_k)
        qh, doh = _accumulated(q, acc), _accumulated(dout, acc)
        kh, vh = _accumulated(k, acc, kv_heads), _accumulated(v, acc, kv_heads)
        delta = (doh * _accumulated(out, acc)).sum(-1)
        lse_h = lse.to(acc)
        lse_h = lse_h.masked_fill(lse_h == NEG_INF, math.inf)
        if self.exp2:
            lse_h = lse_h * LOG2E
        rnd = (lambda x: x) if self.backward_f64 else (lambda x: x.to(q.dtype).to(acc))
        dq_acc = torch.zeros_like(qh)
        dq_low = torch.zeros(qh.shape, dtype=q.dtype)
        dk = torch.empty(k.shape, dtype=k.dtype)
        dv = torch.empty(v.shape, dtype=v.dtype)
        for j in range(tiles.num_k):
            cols = tiles.cols(j)
            k_j, v_j = kh[:, :, cols], vh[:, :, cols]
            dk_j, dv_j = torch.zeros_like(k_j), torch.zeros_like(v_j)
            for i in tiles.query_blocks(j):
                rows = tiles.rows(i)
                q_i, do_i = qh[:, :, rows], doh[:, :, rows]
                s = tiles.masked(self._logits(q_i, k_j, softmax_scale), i, j)
                p = self._exp(s - lse_h[:, :, rows].unsqueeze(-1))
                pr = p if self.backward_f64 else self._p(p, q.dtype)
                dv_j += pr.transpose(-1, -2) @ do_i
                dp = do_i @ v_j.transpose(-1, -2)
                ds = rnd(p * (dp - delta[:, :, rows].unsqueeze(-1)))
                if self.dq_dtype_per_block:
                    dq_low[:, :, rows] += (ds @ k_j).to(q.dtype)
                else:
                    dq_acc[:, :, rows] += ds @ k_j
                dk_j += ds.transpose(-1, -2) @ q_i
            dk[:, cols] = self._heads(dk_j * softmax_scale, kv_heads, heads_kv, k.dtype)
            dv[:, cols] = self._heads(dv_j, kv_heads, heads_kv, v.dtype)
        if self.dq_dtype_per_block:
            dq_acc = dq_low.to(acc)
        return (dq_acc * softmax_scale).transpose(1, 2).to(q.dtype), dk, dv

    def _heads(self, grad, kv_heads, heads_kv, dtype):
        """Sum per-query-head grads onto kv heads: in acc (FA2), or each head rounded to dtype and added in dtype."""
        if not self.gqa_per_head_dtype:
            return self._reduce_heads(grad, kv_heads, heads_kv).transpose(1, 2).to(dtype)
        group = grad.shape[1] // heads_kv
        total = torch.zeros((grad.shape[0], heads_kv) + grad.shape[2:], dtype=dtype)
        for member in range(group):
            total += grad.unflatten(1, (heads_kv, group))[:, :, member].to(dtype)
        return total.transpose(1, 2)


def _chunks(items, n):
    size = -(-len(items) // n) if items else 1
    return [items[a:a + size] for a in range(0, len(items), size)] or [[]]


P_FP32 = Variant(p_round=False)
EXP2 = Variant(exp2=True)
SPLIT_KV3 = Variant(splits=3)
SPLIT_KV3_LOWPREC = Variant(splits=3, partial_in_dtype=True)
EAGER_16 = Variant(rescaling="eager", block_q=16, block_k=16)
ONE_BLOCK = Variant(block_q=1024, block_k=4096)
DQ_DTYPE_PER_BLOCK = Variant(dq_dtype_per_block=True)
GQA_PER_HEAD_DTYPE = Variant(gqa_per_head_dtype=True)
BACKWARD_F64 = Variant(backward_f64=True)
SCORE_CHUNKS = Variant(score_chunks=4)
ALL_FP32_P_EXP2_SPLIT = Variant(p_round=False, exp2=True, splits=2)

#: Every kernel above, by name (``--fa2-kernel tests.variants:NAME``).
NAMES: tuple[str, ...] = ("ROUNDED_P_DS", "P_FP32", "EXP2", "SPLIT_KV3", "SPLIT_KV3_LOWPREC", "EAGER_16", "ONE_BLOCK",
                          "DQ_DTYPE_PER_BLOCK", "GQA_PER_HEAD_DTYPE", "BACKWARD_F64", "SCORE_CHUNKS",
                          "ALL_FP32_P_EXP2_SPLIT")
