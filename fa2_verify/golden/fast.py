"""The fast golden: attention in float64 with error-free transformations, in torch on the case's device.

The formulas are those of :mod:`golden.mp` (Dao 2023, "FlashAttention-2",
Algorithm 1 forward and Algorithm 2 backward), evaluated per head and per
block of query rows so that each step's error is the float64 rounding of a
well-conditioned quantity; short sequences take a chunk of (batch, kv head)
pairs at once (:func:`pair_chunks`), each pair's arithmetic unchanged.  One implementation serves both devices: the
tensors of :class:`golden.inputs.HeadMajorInputs` live on CUDA when the kernel's
inputs do (cuBLAS float64 products), else on the CPU.  A block of query rows
only computes the keys its rows see (a causal or sliding-window mask skips
the rest), so no ``seqlen_q x seqlen_k`` buffer exists for a whole head; its
rows are as many as keep ``rows x keys`` within ``BLOCK_ELEMENTS`` while the
cost per visible score falls (:func:`blocks`, :func:`core.row_blocks.plan`), so a causal head's early blocks,
over few keys, hold many rows and a long head takes few kernel launches.  The
keys seen by every row of a block need no mask; only the column bands beside
them are masked (:class:`core.row_blocks.BlockMask`), and every step below is a full pass over
the block only where its arithmetic needs one:

1. ``S' = Q (sign K)^T`` as a pair ``hi + lo`` by :func:`golden.eft.dd_matmul`
   (its leading product is exact); ``|scale|`` is applied only
   after the row maximum ``m'_i`` (at the pivot key ``p(i)``) is subtracted,
   ``x_ij = |scale| (S'_ij - m'_i)``, so a large logit costs no accuracy.
   ``S'`` is renormalised (``hi = fl(S')``) before the maximum is taken,
   so the pivot's ``x`` is a rounding error of ``S'`` and no more.
2. ``E = exp(x)`` (masked entries 0), ``l_i = sum_j E_ij``, ``P = E / l``,
   ``LSE_i = |scale| m'_i + log l_i`` kept as a double-double, with
   ``log l_i = log1p(expm1(x_{i,p(i)}) + sum_{j != p(i)} E_ij)``: when one
   key dominates a row whose scores are all tiny, ``LSE_i`` is as tiny as
   they are and ``log`` of a rounded ``l_i ~ 1`` would keep only its
   absolute ``2**-53``, not its relative accuracy.
3. ``O = P V`` by :func:`dd_matmul`.
4. ``dP = dO V^T`` by :func:`dd_matmul`.  With ``r_i = dP_{i,p(i)}`` and
   ``sum_j P_ij = 1``,

       D_i - r_i   = sum_j P_ij (dP_ij - r_i)          (the "offset" b_i)
       dP_ij - D_i = (dP_ij - r_i) - b_i

   ``dP_ij - r_i`` is formed from the pairs before rounding (exactly 0 at the
   pivot), so ``dS`` keeps its relative accuracy even when the softmax is so
   peaked that ``dP_{i,p(i)} - D_i`` is 1e-20 of ``D_i``, where
   ``D = rowsum(dO o O)`` followed by a subtraction would keep no digit.
   ``D_i = r_i + b_i`` is returned as the row's delta.
5. ``dS = P o (dP - D)``; ``dQ = scale dS K``, ``dK = scale dS^T Q`` and
   ``dV = P^T dO`` by :func:`dd_matmul`, the GQA group's query heads and the
   row blocks accumulated in double-double before the single final rounding.

Every entry of ``P`` and ``dS`` therefore carries a relative error of a few
``2**-53`` (times ``|x_ij|`` for ``P``), and every product with them adds at
most ``~k 2**-(53 + beta)`` of its leading magnitudes (:func:`dd_matmul`), so
an output's error is a few float64 roundings of the magnitude of the terms
it sums.  This module claims no bound of its own: :mod:`golden.certify`
measures the error on sampled rows of every case served, against reference rows checked against mpmath.
"""

from __future__ import annotations

import dataclasses

import torch

from fa2_verify.core import row_blocks, triton_passes
from fa2_verify.golden.eft import Columns, dd_matmul, two_prod, two_sum
from fa2_verify.golden.inputs import HeadMajorInputs

#: Query rows are processed in blocks of at most this many scores (or one row) per device
#: type: 8 MiB of float64 per temporary on the CPU (temporaries stay in the
#: allocator's reused heap instead of fresh pages), 256 MiB on CUDA (large
#: enough for cuBLAS to run near its float64 peak; about a dozen temporaries
#: live at once, so a block holds about 3 GiB).  dK and dV accumulate the
#: blocks in double-double.
BLOCK_ELEMENTS = {"cpu": 2**20, "cuda": 2**25}


@dataclasses.dataclass(frozen=True)
class FastResult:
    """Outputs head-major as in :class:`golden.inputs.HeadMajorInputs`, rounded once to float64, on its device.

    For the certification of dK and dV (:mod:`golden.certify`): ``lse_dd`` is
    ``(hi, lo)`` of LSE, ``pivot`` the key index ``p(i)`` of each row's largest
    score and ``offset`` the row's ``b_i = D_i - dP_{i,p(i)}``.
    """

    out: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor | None
    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None
    lse_dd: tuple[torch.Tensor, torch.Tensor]
    pivot: torch.Tensor
    offset: torch.Tensor | None


@dataclasses.dataclass(frozen=True)
class _Block:
    """Query rows ``rows`` over keys ``keys``; ``mask``: the column bands of keys that some row does not see
    (:class:`core.row_blocks.BlockMask`, none when every row sees every one of those keys); ``empty``: the rows
    that see no key of the block; ``first``, ``last``: the keys each row sees (absolute), on the golden's
    device."""

    rows: slice
    keys: slice
    mask: row_blocks.BlockMask
    empty: torch.Tensor
    first: torch.Tensor
    last: torch.Tensor


def blocks(problem: HeadMajorInputs) -> list[_Block]:
    """The row blocks of one head, rows that see no key skipped, each over the span of keys its rows see
    (:func:`core.row_blocks.plan` within ``BLOCK_ELEMENTS`` scores), with its mask, built once for every pair."""
    plan = row_blocks.plan(problem.first, problem.last, BLOCK_ELEMENTS[problem.device.type],
                           row_blocks.overhead_elements(problem.device))
    first, last = problem.device_ranges
    first_host, last_host = torch.from_numpy(problem.first), torch.from_numpy(problem.last)
    result = []
    for plan_rows in plan:
        rows = slice(plan_rows.start, plan_rows.stop)
        keys = slice(int(problem.first[rows.start]), int(problem.last[rows.stop - 1]) + 1)
        mask = row_blocks.BlockMask.of(rows, keys, first, last, first_host, last_host)
        result.append(_Block(rows, keys, mask, first[rows] > last[rows], first[rows], last[rows]))
    return result


def pairs_per_chunk(seqlen_q: int, seqlen_k: int, head_dim: int, device: torch.device | str) -> int:
    """Pairs whose ``seqlen_q x max(seqlen_k, head_dim)`` elements fit ``BLOCK_ELEMENTS`` of ``device``, at least 1."""
    per_pair = max(1, seqlen_q * max(seqlen_k, head_dim, 1))
    return max(1, BLOCK_ELEMENTS[torch.device(device).type] // per_pair)


def pair_chunks(problem: HeadMajorInputs) -> list[tuple[slice, slice]]:
    """``(batches, kv heads)`` slices of the (batch, kv head) pairs evaluated at once, in increasing order.

    A chunk holds :func:`pairs_per_chunk` pairs at most (the (rows x head_dim) tensors outgrow the score ones
    when keys are fewer than head_dim): whole batches of all kv heads when that is at least ``heads_kv`` pairs, else kv heads of one
    batch; one pair when one head's rows already fill the budget (:func:`blocks` then splits its rows).
    """
    pairs = pairs_per_chunk(problem.seqlen_q, problem.seqlen_k, problem.head_dim, problem.device)
    if pairs >= problem.heads_kv:
        step = pairs // problem.heads_kv
        return [(slice(b, min(b + step, problem.batch)), slice(0, problem.heads_kv))
                for b in range(0, problem.batch, step)]
    return [(slice(b, b + 1), slice(g, min(g + pairs, problem.heads_kv)))
            for b in range(problem.batch) for g in range(0, problem.heads_kv, pairs)]


def attention(problem: HeadMajorInputs, fused: bool | None = None) -> FastResult:
    """Forward (and backward when ``problem.dout`` is given) for every head, in blocks of query rows.

    The (batch, kv head) pairs of a chunk (:func:`pair_chunks`) are evaluated at once, every tensor of a
    block gaining two leading dimensions (batches, kv heads); within a pair the query heads of its group
    and their row blocks run in increasing order, as the double-double sums of dK and dV expect.  With
    ``fused`` (by default on CUDA where they build, :func:`uses_passes`) a block's elementwise work runs in
    :mod:`golden.passes`' Triton passes, the blocks they do not serve in torch.
    """
    fused = uses_passes(problem.device) if fused is None else fused
    forward_step, backward_step, accumulate = _forward, _backward, _accumulate
    if fused:
        from fa2_verify.golden import passes

        forward_step, backward_step, accumulate = _forward_fused, _backward_fused, passes.accumulate
    backward = problem.dout is not None
    rows = problem.q.shape[:3]
    device = problem.device
    out = torch.zeros(problem.q.shape, dtype=torch.float64, device=device)
    lse_hi = torch.full(rows, -torch.inf, dtype=torch.float64, device=device)
    lse_lo = torch.zeros(rows, dtype=torch.float64, device=device)
    pivot = torch.zeros(rows, dtype=torch.int64, device=device)
    if backward:
        dq, delta, offset = torch.zeros_like(out), torch.zeros_like(lse_lo), torch.zeros_like(lse_lo)
        dk, dv = torch.zeros_like(problem.k), torch.zeros_like(problem.v)
    plan = blocks(problem)
    group = problem.group
    for b, g in pair_chunks(problem):
        k, v = problem.k[b, g], problem.v[b, g]
        # the keys' side of the products of every row block, split once (eft.Columns)
        scores = Columns.of((k if problem.scale >= 0 else -k).mT)
        values = Columns.of(v.mT) if backward else None
        dk_sum, dv_sum = _zeros_dd(k), _zeros_dd(v)
        for member in range(group):
            # query head g * group + member of each kv head g of the chunk
            h = slice(g.start * group + member, g.stop * group, group)
            for block in plan:
                rows_, keys = block.rows, block.keys
                q = problem.q[b, h, rows_]
                head = forward_step(q, scores, v[..., keys, :], block, problem.scale)
                out[b, h, rows_], pivot[b, h, rows_] = head.out, head.pivot + keys.start
                lse_hi[b, h, rows_], lse_lo[b, h, rows_] = head.lse_hi, head.lse_lo
                if not backward:
                    continue
                grads = backward_step(problem.dout[b, h, rows_], q, k[..., keys, :], values, keys, head,
                                      problem.scale)
                dq[b, h, rows_], delta[b, h, rows_], offset[b, h, rows_] = grads.dq, grads.delta, grads.offset
                accumulate(dk_sum, grads.dk_sum, keys)
                accumulate(dv_sum, grads.dv, keys)
        if backward:
            dk[b, g] = _times(dk_sum, problem.scale)
            dv[b, g] = dv_sum[0] + dv_sum[1]
    lse = lse_hi + lse_lo
    if not backward:
        return FastResult(out, lse, None, None, None, None, (lse_hi, lse_lo), pivot, None)
    return FastResult(out, lse, delta, dq, dk, dv, (lse_hi, lse_lo), pivot, offset)


def uses_passes(device: torch.device) -> bool:
    """Whether :func:`attention` takes :mod:`golden.passes` by default on ``device``: on CUDA where Triton builds
    them (:mod:`core.triton_passes`)."""
    if not triton_passes.serve_by_default(device):
        return False
    from fa2_verify.golden import passes

    return passes.compiles(device)


@dataclasses.dataclass(frozen=True)
class _Forward:
    """A block's forward; ``key_max``, from :mod:`golden.passes` only: each key's largest ``P`` per matrix."""

    out: torch.Tensor
    p: torch.Tensor
    pivot: torch.Tensor
    empty: torch.Tensor
    lse_hi: torch.Tensor
    lse_lo: torch.Tensor
    key_max: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class _Backward:
    dq: torch.Tensor
    dk_sum: tuple[torch.Tensor, torch.Tensor]
    dv: tuple[torch.Tensor, torch.Tensor]
    delta: torch.Tensor
    offset: torch.Tensor


def _forward(q: torch.Tensor, scores: Columns, v: torch.Tensor, block: _Block, scale: float) -> _Forward:
    """Steps 1-3 for one block: ``q`` (..., rows, head_dim), ``scores`` the pairs' ``(sign K)^T`` (..., head_dim,
    seqlen_k) split once, ``v`` (..., keys, head_dim) with the same leading (pair) dimensions; ``block``'s keys,
    mask and empty rows shared by every pair."""
    magnitude = abs(scale)
    empty = block.empty
    s_hi, s_lo = two_sum(*scores.matmul(q, block.keys))
    block.mask.mask_(s_hi, -torch.inf)
    pivot = torch.argmax(s_hi, dim=-1)
    at = pivot[..., None]
    row_max = torch.where(empty, 0.0, s_hi.gather(-1, at).squeeze(-1))
    # hidden entries stay -inf (s_lo is finite), unless the scale is 0: -inf * 0 is NaN
    logits = s_hi.sub_(row_max[..., None]).add_(s_lo).mul_(magnitude)
    del s_lo
    if magnitude == 0.0:
        block.mask.mask_(logits, -torch.inf)
    at_pivot = torch.where(empty, 0.0, logits.gather(-1, at).squeeze(-1))
    e = logits.exp_()
    e.scatter_(-1, at, 0.0)
    excess = e.sum(dim=-1) + torch.expm1(at_pivot)
    e.scatter_(-1, at, torch.where(empty, 0.0, torch.exp(at_pivot))[..., None])
    p = e.div_((1.0 + excess)[..., None])
    out_hi, out_lo = dd_matmul(p, v)
    return _Forward(out_hi + out_lo, p, pivot, empty, *_lse(row_max, magnitude, excess, empty))


def _lse(row_max: torch.Tensor, magnitude: float, excess: torch.Tensor,
         empty: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2's ``LSE_i = |scale| m'_i + log1p(excess_i)`` as ``(hi, lo)`` (-inf and 0 on empty rows)."""
    max_hi, max_lo = two_prod(row_max, magnitude)
    lse_hi, sum_lo = two_sum(max_hi, torch.log1p(excess))
    return torch.where(empty, -torch.inf, lse_hi), torch.where(empty, 0.0, max_lo + sum_lo)


def _forward_fused(q: torch.Tensor, scores: Columns, v: torch.Tensor, block: _Block, scale: float) -> _Forward:
    """:func:`_forward` with its elementwise work in :mod:`golden.passes` (A to C); the torch code where
    ``P V`` would take :func:`golden.eft.dd_matmul`'s two paths at once, or the scale is 0."""
    from fa2_verify.golden import passes

    magnitude = abs(scale)
    values = Columns.of(v)
    if magnitude == 0.0 or values.bits is None:
        return _forward(q, scores, v, block, scale)
    empty = block.empty
    hi, lo = scores.matmul(q, block.keys)
    key_start = block.keys.start
    pivot, largest = passes.pivots(hi, lo, block.first, block.last, key_start)
    row_max = torch.where(empty, 0.0, largest)
    at = pivot[..., None]
    at_pivot = torch.where(empty, 0.0, lo.gather(-1, at).squeeze(-1) * magnitude)
    others, e_max = passes.exponentials(hi, lo, block.first, block.last, key_start, row_max, pivot, magnitude)
    del lo
    e = hi
    at_value = torch.where(empty, 0.0, torch.exp(at_pivot))
    e.scatter_(-1, at, at_value[..., None])
    excess = others + torch.expm1(at_pivot)
    denominator = 1.0 + excess
    sigma = values.sigma(torch.maximum(e_max, at_value) / denominator)  # of P's row maxima
    if sigma is None:  # P's row maxima lie in [1 / (keys + 1), 2] or are 0: only for non-finite scores
        return _forward(q, scores, v, block, scale)
    leading, rest, key_max = passes.probabilities(e, denominator, sigma)
    out_hi, out_lo = values.split_matmul(leading, rest)
    return _Forward(out_hi + out_lo, e, pivot, empty, *_lse(row_max, magnitude, excess, empty), key_max)


def _backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, values: Columns, keys: slice, head: _Forward, scale: float
) -> _Backward:
    """Steps 4-5 for one block over ``keys``, ``values`` the pairs' ``V^T`` split once; ``dk_sum`` is ``dS^T Q``
    before the scale."""
    dp_hi, dp_lo = values.matmul(dout, keys)
    at = head.pivot[..., None]
    anchor_hi = torch.where(head.empty, 0.0, dp_hi.gather(-1, at).squeeze(-1))
    anchor_lo = torch.where(head.empty, 0.0, dp_lo.gather(-1, at).squeeze(-1))
    shifted = dp_hi.sub_(anchor_hi[..., None]).add_(dp_lo.sub_(anchor_lo[..., None]))
    del dp_lo
    offset = torch.matmul(head.p[..., None, :], shifted[..., :, None])[..., 0, 0]  # row-wise dot, no temporary
    ds = shifted.sub_(offset[..., None]).mul_(head.p)
    delta_hi, delta_lo = two_sum(anchor_hi, offset)
    dq = _times(dd_matmul(ds, k), scale)
    return _Backward(dq, dd_matmul(ds.mT, q), dd_matmul(head.p.mT, dout), delta_hi + (delta_lo + anchor_lo), offset)


def _backward_fused(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, values: Columns, keys: slice, head: _Forward, scale: float
) -> _Backward:
    """:func:`_backward` with its elementwise work in :mod:`golden.passes` (D to F); the torch code after a torch
    forward, or where a product would take :func:`golden.eft.dd_matmul`'s two paths at once or a slice's
    ``sigma`` leaves float64's range."""
    from fa2_verify.golden import passes

    sides = {"dq": Columns.of(k), "dk": Columns.of(q), "dv": Columns.of(dout)}  # the b of each product
    if head.key_max is None or any(side.bits is None for side in sides.values()):
        return _backward(dout, q, k, values, keys, head, scale)
    dp_hi, dp_lo = values.matmul(dout, keys)
    at = head.pivot[..., None]
    anchor_hi = torch.where(head.empty, 0.0, dp_hi.gather(-1, at).squeeze(-1))
    anchor_lo = torch.where(head.empty, 0.0, dp_lo.gather(-1, at).squeeze(-1))
    offset = passes.shifted(dp_hi, dp_lo, head.p, anchor_hi, anchor_lo)
    del dp_lo
    row_max, key_max = passes.gradients(dp_hi, head.p, offset)  # dP_hi is dS now
    peaks = {"dq": row_max, "dk": key_max, "dv": head.key_max}
    sigmas = {name: side.sigma(peaks[name]) for name, side in sides.items()}
    if any(sigma is None for sigma in sigmas.values()):
        return _backward(dout, q, k, values, keys, head, scale)
    dq = _times(sides["dq"].split_matmul(*passes.split(dp_hi, sigmas["dq"], False)), scale)
    leading, rest = passes.split(dp_hi, sigmas["dk"], True)
    del dp_hi  # at most four blocks live: P, dS and a split
    dk_sum = sides["dk"].split_matmul(leading.mT, rest.mT)
    del leading, rest
    leading, rest = passes.split(head.p, sigmas["dv"], True)
    dv = sides["dv"].split_matmul(leading.mT, rest.mT)
    delta_hi, delta_lo = two_sum(anchor_hi, offset)
    return _Backward(dq, dk_sum, dv, delta_hi + (delta_lo + anchor_lo), offset)


def _zeros_dd(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros_like(like), torch.zeros_like(like)


def _accumulate(total: tuple[torch.Tensor, torch.Tensor], term: tuple[torch.Tensor, torch.Tensor], rows: slice) -> None:
    """Double-double ``total[..., rows, :] += term``, in place."""
    hi, err = two_sum(total[0][..., rows, :], term[0])
    total[0][..., rows, :] = hi
    total[1][..., rows, :] += err + term[1]


def _times(pair: tuple[torch.Tensor, torch.Tensor], scale: float) -> torch.Tensor:
    """``fl(scale * (hi + lo))`` with one rounding error of the product."""
    hi, lo = pair
    product, err = two_prod(hi, scale)
    return product + (err + lo * scale)
