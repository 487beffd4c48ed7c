"""The FA2 algorithm in plain PyTorch: the bundled targets ``reference``
(:data:`DEFERRED`) and ``reference-eager`` (:data:`EAGER`).

Forward, Dao 2023 (FlashAttention-2), Algorithm 1: for each query block
``Q_i`` (line 3), over the key blocks ``K_j, V_j`` that it can see (line 6)::

    S    = scale · Q_i K_j^T                                   (line 8)
    m'   = max(m, rowmax S),  P~ = exp(S - m'),  α = exp(m - m')
    ℓ'   = α ℓ + rowsum P~                                      (line 9)
    O'   = diag(α) O + P~ V_j          deferred: FA2           (line 10)
    O'   = diag(ℓ')^-1 (diag(α ℓ) O + P~ V_j)   eager: FA1
    O_i  = diag(ℓ)^-1 O  (deferred only),  L_i = m + log ℓ      (lines 12-13)

Backward, Algorithm 2: ``D = rowsum(dO ∘ O)`` (line 4); for each key block
(line 5), ``dK_j = dV_j = 0`` (line 7), and for each query block that sees it
(line 8)::

    S  = scale · Q_i K_j^T,  P = exp(S - L_i)                  (lines 10-11)
    dV_j += P^T dO_i                                            (line 12)
    dP = dO_i V_j^T,  dS = P ∘ (dP - D_i)                        (lines 13-14)
    dQ_i += dS K_j   (accumulated across key blocks)            (line 15)
    dK_j += dS^T Q_i                                            (line 16)

then ``dK_j`` and ``dV_j`` are written (line 18); ``dQ`` and ``dK`` carry the
factor ``scale`` once, when written.  The derivations and why the rescalings
are exact are in :mod:`kernels.online_softmax`.

Precision model (what a CUDA FA2 kernel rounds; ``acc`` is the accumulator
dtype, float32 by default and never narrower than the inputs):

- q, k, v, dout and out are read in their dtype; every matmul multiplies
  operands representable in that dtype and accumulates in ``acc`` (tensor-core
  MMA with float32 accumulation).
- Forward: S, m, P~, ℓ (lines 8-9) and O (line 10) in ``acc``; P~ is rounded to
  the input dtype before ``P~ V_j`` (line 10); O_i is rounded to the dtype once,
  after line 12; L_i is computed in ``acc`` and stored as float32 (line 13).
- Backward: D (line 4), S and P (lines 10-11), dP and dS (lines 13-14) in ``acc``;
  P is rounded to the dtype before ``P^T dO_i`` (line 12) and dS before
  ``dS K_j`` and ``dS^T Q_i`` (lines 15-16); dQ, dK_j, dV_j accumulate in ``acc``
  and are rounded once when written.  With GQA, the dK/dV of the query heads
  that share a kv head are summed in ``acc`` before that rounding.

Masks are bottom-right aligned (:func:`core.contract.visible_mask`); key
blocks a query block cannot see are skipped, as a kernel's loop bounds do.  A
row that sees no key gets ``out = 0``, ``lse = -inf``, ``dq = 0``: the
reference point ``m = -inf`` is replaced by 0 so that ``exp(-inf - (-inf))``
never occurs.  Outputs are allocated with ``torch.empty`` and every element
is written, so an unwritten element shows under memory poisoning.

The small ``_``-prefixed methods are the steps that ``tests/mutants.py``
replaces, one per documented bug.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

import torch

from fa2_verify.core.contract import (
    DTYPES, UNBOUNDED, Capabilities, KernelTarget, dtype_name, heads_first, visible_mask,
)
from fa2_verify.core.errors import UsageError

RESCALINGS = ("deferred", "eager")
NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class Tiles:
    """The block grid over a (seqlen_q, seqlen_k) mask.

    ``seen[i][j]``: query block ``i`` sees some key of key block ``j``;
    ``full[i][j]``: it sees every one (the tile needs no masking).
    """

    visible: torch.Tensor
    block_q: int
    block_k: int
    num_q: int
    num_k: int
    seen: list[list[bool]]
    full: list[list[bool]]

    @classmethod
    def build(cls, visible: torch.Tensor, block_q: int, block_k: int) -> "Tiles":
        seqlen_q, seqlen_k = visible.shape
        num_q, num_k = -(-seqlen_q // block_q), -(-seqlen_k // block_k)
        pad = (0, num_k * block_k - seqlen_k, 0, num_q * block_q - seqlen_q)
        shape = (num_q, block_q, num_k, block_k)
        seen = torch.nn.functional.pad(visible, pad, value=False).reshape(shape).any(dim=3).any(dim=1)
        full = torch.nn.functional.pad(visible, pad, value=True).reshape(shape).all(dim=3).all(dim=1)
        return cls(visible, block_q, block_k, num_q, num_k, seen.tolist(), full.tolist())

    def rows(self, i: int) -> slice:
        return slice(i * self.block_q, min((i + 1) * self.block_q, self.visible.shape[0]))

    def cols(self, j: int) -> slice:
        return slice(j * self.block_k, min((j + 1) * self.block_k, self.visible.shape[1]))

    def key_blocks(self, i: int) -> Iterator[int]:
        return (j for j in range(self.num_k) if self.seen[i][j])

    def query_blocks(self, j: int) -> Iterator[int]:
        return (i for i in range(self.num_q) if self.seen[i][j])

    def masked(self, s: torch.Tensor, i: int, j: int, fill: float = NEG_INF) -> torch.Tensor:
        """``s`` with ``fill`` (``-inf``) where the tile's mask hides a key."""
        if self.full[i][j]:
            return s
        return s.masked_fill(~self.visible[self.rows(i), self.cols(j)], fill)


def _accumulated(x: torch.Tensor, dtype: torch.dtype, heads: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` heads first (:func:`core.contract.heads_first`), in ``dtype``, optionally at the heads ``heads``."""
    x = heads_first(x)
    if heads is not None:
        x = x[:, heads]
    return x.to(dtype)


def _check_inputs(**tensors: torch.Tensor) -> None:
    """Shapes, dtypes and devices of the contract's tensors; a UsageError otherwise."""
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise UsageError(f"{name} is a {type(tensor).__name__}: pass a torch.Tensor")
        if tensor.device != q.device:
            raise UsageError(f"{name}.device={tensor.device} differs from q.device={q.device}: put all tensors on one device")
    for name in ("q", "k", "v"):
        if tensors[name].dim() != 4:
            raise UsageError(f"{name}.shape={tuple(tensors[name].shape)}: pass (batch, seqlen, heads, head_dim)")
        if tensors[name].dtype not in DTYPES.values() or tensors[name].dtype != q.dtype:
            raise UsageError(f"{name}.dtype={dtype_name(tensors[name].dtype)}: q, k, v must share one of {', '.join(DTYPES)}")
    batch, _, heads_q, head_dim = q.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim:
        raise UsageError(
            f"k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}: both must be (batch={batch}, seqlen_k, heads_kv, head_dim={head_dim})"
        )
    if heads_q % k.shape[2]:
        raise UsageError(f"heads_kv={k.shape[2]} does not divide heads_q={heads_q}: use a divisor of heads_q")
    for name in ("out", "dout"):
        if name in tensors and (tensors[name].shape != q.shape or tensors[name].dtype != q.dtype):
            raise UsageError(f"{name}.shape={tuple(tensors[name].shape)}: must match q ({tuple(q.shape)}, {dtype_name(q.dtype)})")
    if "lse" in tensors and tensors["lse"].shape != (batch, heads_q, q.shape[1]):
        raise UsageError(f"lse.shape={tuple(tensors['lse'].shape)}: must be (batch, heads_q, seqlen_q)={(batch, heads_q, q.shape[1])}")


class TiledAttention:
    """FA2 forward and backward, tiled as on a GPU, in plain PyTorch.

    ``block_q``/``block_k`` are the query/key tile sizes (``B_r``/``B_c`` in the
    paper), ``accumulate`` the narrowest accumulator dtype (the inputs' dtype is
    used when wider), and ``rescaling`` is ``"deferred"`` (FA2) or ``"eager"``
    (FA1).  Vectorised over batch and heads; Python loops run over tiles only.
    """

    def __init__(
        self,
        *,
        block_q: int = 32,
        block_k: int = 16,
        accumulate: torch.dtype = torch.float32,
        rescaling: str = "deferred",
    ) -> None:
        for name, value in (("block_q", block_q), ("block_k", block_k)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"{name}={value!r} is not a tile size: use a positive integer")
        if accumulate not in DTYPES.values():
            raise UsageError(f"accumulate={accumulate!r} is not a float dtype: use one of torch.{', torch.'.join(DTYPES)}")
        if rescaling not in RESCALINGS:
            raise UsageError(f"rescaling={rescaling!r} is not known: use one of {', '.join(RESCALINGS)}")
        self.block_q = block_q
        self.block_k = block_k
        self.accumulate = accumulate
        self.rescaling = rescaling
        self.capabilities = Capabilities(
            dtypes={"cpu": tuple(DTYPES), "cuda": tuple(DTYPES)},
            head_dims=tuple(range(1, 513)),
            causal=True,
            window=True,
            gqa=True,
            backward=True,
            deterministic_backward=True,
            varlen=False,
            unaligned_inputs=True,
            notes=(
                "lse is float32 (the contract), so the float64 backward is accurate to about 2^-24 * |lse|",
                "plain PyTorch, looping over tiles: meant for seqlen up to a few thousand",
            ),
        )

    def config(self) -> dict[str, Any]:
        return {
            "algorithm": "FlashAttention-2, tiled (plain PyTorch)",
            "rescaling": self.rescaling,
            "block_q": self.block_q,
            "block_k": self.block_k,
            "accumulate": dtype_name(self.accumulate),
        }

    def __repr__(self) -> str:
        settings = ", ".join(f"{key}={value!r}" for key, value in self.config().items() if key != "algorithm")
        return f"{type(self).__name__}({settings})"

    def _accumulator_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.promote_types(self.accumulate, dtype)

    def _visible(self, seqlen_q: int, seqlen_k: int, *, causal: bool, window_size, device) -> torch.Tensor:
        return visible_mask(seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=device)

    def _kv_heads(self, heads_q: int, heads_kv: int, device) -> torch.Tensor:
        """The kv head each query head reads: ``h // (heads_q // heads_kv)``."""
        return torch.arange(heads_q, device=device) // (heads_q // heads_kv)

    def _forward_keys(self, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor):
        """The keys, values and mask the forward tiles over."""
        return k, v, visible

    def _written_query_blocks(self, tiles: Tiles) -> range:
        """The query blocks whose out, lse and dq rows are written."""
        return range(tiles.num_q)

    def _initial_max(self) -> float:
        """The running max before the first key block (Algorithm 1, line 5): -inf."""
        return NEG_INF

    def _masked_score(self) -> float:
        """The score a key hidden by the mask gets, forward and backward: -inf."""
        return NEG_INF

    def _guard_max(self, m: torch.Tensor) -> torch.Tensor:
        """The reference point for exp: ``m``, or 0 where no key was visible yet."""
        return m.masked_fill(m == NEG_INF, 0.0)

    def _probability_max(self, m_old: torch.Tensor, m_new: torch.Tensor) -> torch.Tensor:
        """The running max that P~ is taken against (line 9): the updated one."""
        return m_new

    def _rescale_factor(self, m_old: torch.Tensor, m_new: torch.Tensor) -> torch.Tensor:
        """``α = exp(m_old - m_new)`` (line 9), by which ``ℓ`` and ``O`` are rescaled."""
        return torch.exp(m_old - self._guard_max(m_new))

    def _rescale_accumulator(self, o: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        """``diag(factor) O`` (line 10)."""
        return o * factor.unsqueeze(-1)

    def _lse(self, m: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
        """``L = m + log ℓ`` (line 13), natural log; -inf where ``ℓ = 0``."""
        return torch.where(l > 0, m + torch.log(l), NEG_INF)

    def _delta(self, dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``D = rowsum(dO ∘ O)`` (Algorithm 2, line 4)."""
        return (dout * out).sum(dim=-1)

    def _score_gradient(self, p: torch.Tensor, dp: torch.Tensor, delta: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``dS = P ∘ (dP - D)`` (line 14) from the ``acc`` precision ``P``, rounded to ``dtype``."""
        return (p * (dp - delta)).to(dtype)

    def _key_gradient(self, ds: torch.Tensor, q_i: torch.Tensor) -> torch.Tensor:
        """``dS^T Q_i``, one query block's term of ``dK_j`` (line 16)."""
        return ds.transpose(-1, -2) @ q_i

    def _add_dq(self, dq: torch.Tensor, rows: slice, update: torch.Tensor, key_block: int, num_key_blocks: int) -> None:
        """``dQ_i += dS K_j`` (line 15), the accumulation across key blocks."""
        dq[:, :, rows] += update

    def _finish_dq(self, dq: torch.Tensor, softmax_scale: float) -> torch.Tensor:
        return dq * softmax_scale

    def _reduce_heads(self, grad: torch.Tensor, kv_heads: torch.Tensor, heads_kv: int) -> torch.Tensor:
        """Sum the per-query-head dK/dV onto their kv heads (a matmul: deterministic)."""
        onehot = torch.nn.functional.one_hot(kv_heads, heads_kv).to(grad.dtype)
        return torch.einsum("bhkd,hg->bgkd", grad, onehot)

    @torch.no_grad()
    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        """``(out, lse)`` by Algorithm 1; see the module docstring for what is rounded where."""
        _check_inputs(q=q, k=k, v=v)
        batch, seqlen_q, heads_q, head_dim = q.shape
        acc = self._accumulator_dtype(q.dtype)
        kv_heads = self._kv_heads(heads_q, k.shape[2], q.device)
        visible = self._visible(seqlen_q, k.shape[1], causal=causal, window_size=window_size, device=q.device)
        qh = _accumulated(q, acc)
        kh, vh, visible = self._forward_keys(_accumulated(k, acc, kv_heads), _accumulated(v, acc, kv_heads), visible)
        tiles = Tiles.build(visible, self.block_q, self.block_k)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
        for i in self._written_query_blocks(tiles):
            rows = tiles.rows(i)
            out_i, lse_i = self._forward_query_block(qh[:, :, rows], kh, vh, tiles, i, softmax_scale, q.dtype)
            out[:, rows] = out_i.transpose(1, 2).to(q.dtype)
            lse[:, :, rows] = lse_i.to(torch.float32)
        return out, lse

    def _forward_query_block(self, q_i, kh, vh, tiles: Tiles, i: int, softmax_scale: float, dtype: torch.dtype):
        """Lines 5-13 for one query block: returns (O_i in acc, L_i in acc)."""
        batch, heads, rows, head_dim = q_i.shape
        m = torch.full((batch, heads, rows), self._initial_max(), dtype=q_i.dtype, device=q_i.device)
        l = torch.zeros_like(m)
        o = torch.zeros_like(q_i)
        for j in tiles.key_blocks(i):
            cols = tiles.cols(j)
            s = tiles.masked((q_i @ kh[:, :, cols].transpose(-1, -2)) * softmax_scale, i, j, self._masked_score())
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = self._rescale_factor(m, m_new)
            p = torch.exp(s - self._guard_max(self._probability_max(m, m_new)).unsqueeze(-1))
            l_new = alpha * l + p.sum(dim=-1)
            pv = p.to(dtype).to(q_i.dtype) @ vh[:, :, cols]
            if self.rescaling == "deferred":
                o = self._rescale_accumulator(o, alpha) + pv
            else:
                l_safe = l_new.masked_fill(l_new == 0, 1.0)
                o = self._rescale_accumulator(o, alpha * l / l_safe) + pv / l_safe.unsqueeze(-1)
            m, l = m_new, l_new
        if self.rescaling == "deferred":
            o = o / l.masked_fill(l == 0, 1.0).unsqueeze(-1)
        return o, self._lse(m, l)

    @torch.no_grad()
    def backward(
        self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False
    ):
        """``(dq, dk, dv)`` by Algorithm 2.  Always deterministic: the loops are sequential."""
        _check_inputs(q=q, k=k, v=v, out=out, dout=dout, lse=lse)
        seqlen_q, heads_q = q.shape[1], q.shape[2]
        heads_kv = k.shape[2]
        acc = self._accumulator_dtype(q.dtype)
        kv_heads = self._kv_heads(heads_q, heads_kv, q.device)
        tiles = Tiles.build(
            self._visible(seqlen_q, k.shape[1], causal=causal, window_size=window_size, device=q.device),
            self.block_q,
            self.block_k,
        )
        qh, doh = _accumulated(q, acc), _accumulated(dout, acc)
        kh, vh = _accumulated(k, acc, kv_heads), _accumulated(v, acc, kv_heads)
        delta = self._delta(doh, _accumulated(out, acc))
        lse_h = lse.to(acc)
        lse_h = lse_h.masked_fill(lse_h == NEG_INF, math.inf)
        dq_acc = torch.zeros_like(qh)
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        for j in range(tiles.num_k):
            cols = tiles.cols(j)
            k_j, v_j = kh[:, :, cols], vh[:, :, cols]
            dk_j, dv_j = torch.zeros_like(k_j), torch.zeros_like(v_j)
            for i in tiles.query_blocks(j):
                rows = tiles.rows(i)
                q_i, do_i = qh[:, :, rows], doh[:, :, rows]
                s = tiles.masked((q_i @ k_j.transpose(-1, -2)) * softmax_scale, i, j, self._masked_score())
                p = torch.exp(s - lse_h[:, :, rows].unsqueeze(-1))
                dv_j += p.to(q.dtype).to(acc).transpose(-1, -2) @ do_i
                dp = do_i @ v_j.transpose(-1, -2)
                ds = self._score_gradient(p, dp, delta[:, :, rows].unsqueeze(-1), q.dtype).to(acc)
                self._add_dq(dq_acc, rows, ds @ k_j, j, tiles.num_k)
                dk_j += self._key_gradient(ds, q_i)
            dk[:, cols] = (self._reduce_heads(dk_j, kv_heads, heads_kv) * softmax_scale).transpose(1, 2).to(k.dtype)
            dv[:, cols] = self._reduce_heads(dv_j, kv_heads, heads_kv).transpose(1, 2).to(v.dtype)
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        for i in self._written_query_blocks(tiles):
            rows = tiles.rows(i)
            dq[:, rows] = self._finish_dq(dq_acc[:, :, rows], softmax_scale).transpose(1, 2).to(q.dtype)
        return dq, dk, dv


#: ``reference``: FA2 with deferred rescaling.
DEFERRED: KernelTarget = TiledAttention(rescaling="deferred")
#: ``reference-eager``: FA1's eager rescaling, otherwise identical.
EAGER: KernelTarget = TiledAttention(rescaling="eager")
