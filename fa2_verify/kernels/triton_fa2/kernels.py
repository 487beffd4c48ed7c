"""Triton kernels of FlashAttention-2 (Dao 2023, Algorithms 1 and 2).

Nothing here is called directly: :mod:`kernels.triton_fa2.launch` checks the
arguments, allocates the outputs and launches.  Importing this module compiles
nothing; Triton compiles each variant on its first launch.

Notation.  ``c = softmax_scale * LOG2E`` folds the softmax scale into the
base-2 exponent, so ``exp(scale * s - lse) = exp2(c * s - lse * LOG2E)``; the
kernels keep row maxima and log-sum-exps in that log2 domain and convert the
stored LSE back to the natural log.  Masks are bottom-right aligned: with
``shift = seqlen_k - seqlen_q``, query ``i`` sees key ``j`` iff
``i + shift - left <= j <= i + shift + right`` (an absent bound arrives as
``NO_BOUND``, which bounds nothing) and ``j < seqlen_k``.  The head dim is a
runtime value masked within the padded ``BLOCK_D``; :mod:`.plans` computes
every argument, and the package docstring lists what is compile-time.

Forward, one program per (query tile of BLOCK_M rows, query head, batch)::

    m = -inf; l = 0; acc = 0                       # row max (log2), row sum, unnormalised out
    for each key tile K_j, V_j the rows can see:   # Algorithm 1, lines 6-10
        s = q @ K_j^T                              # masked to -inf outside the window
        m_new = max(m, c * rowmax(s))
        p = exp2(c * s - m_new)
        alpha = exp2(m - m_new)                    # rescale what was accumulated so far
        l = alpha * l + rowsum(p);  acc = alpha * acc + p @ V_j;  m = m_new
    out = acc / l                                  # deferred normalisation, line 12
    lse = (m + log2 l) * LN2                       # natural log, line 13
    # a row that sees no key: l = 0 -> out = 0, lse = +inf

Backward.  ``delta_i = rowsum(dout_i * out_i)`` first (preprocess), then one
program per (key tile of BLOCK_N keys, kv head, batch)::

    dk = dv = 0
    for each query head h of the kv head's group, each query tile Q_i it is seen by:   # Algorithm 2
        p^T = exp2(c * (k @ Q_i^T) - lse_i * LOG2E)      # recomputed from the LSE, lines 11-13
        dv += p^T @ dO_i                                 # line 16
        dp^T = v @ dO_i^T                                # line 17
        ds^T = p^T * (dp^T - delta_i)                    # line 19
        dk += ds^T @ Q_i                                 # line 21
        dq_i += scale * ds @ k   (fp32 atomic add)       # line 20, skipped when deterministic
    dk *= scale

and, for a deterministic backward, a separate dQ pass with one program per
query tile, looping over key tiles in a fixed order::

    dq = scale * sum_j (p_ij * (dO_i @ V_j^T - delta_i)) @ K_j

Every loop over tiles is split in three ranges (:func:`_tile_ranges`): the
tiles cut by the mask or the sequence end, which are masked, and the tiles
every row sees whole, which skip the mask arithmetic.  Tiles are loaded with
pointers and masks, or (``USE_TMA``) through TMA tensor descriptors made in
the kernel and bounded by each sequence and head_dim (:func:`_source`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fa2_verify.kernels.triton_fa2 import plans
from fa2_verify.core.triton_passes import interpret_requested

#: The interpret mode these kernels were decorated under (see environment.py).
INTERPRET: bool = interpret_requested()

#: Integer arguments Triton must not specialize on.  By default it compiles a
#: variant for each integer argument that equals 1 or is a multiple of 16.  For
#: sequence lengths, the GQA group, the window bounds, the head dim and the
#: strides that buys nothing, because they only bound masks and loops or offset
#: pointers, but it multiplies the compiles of a property run that draws a new
#: shape for every example.  The alignment that vectorized loads need is given
#: instead by the constexpr units the head dim and each tensor's strides are
#: counted in (``HEAD_DIM_UNIT``, ``*_UNIT``; :mod:`.plans`).
_STRIDES = tuple(f"stride_{tensor}{axis}" for tensor in ("q", "k", "v", "o", "do", "dq", "dk", "dv") for axis in "bsh")
_SIZE_ARGS = ("seqlen_q", "seqlen_k", "group", "left", "right", "head_dim_units", "stride_lb", "stride_lh") + _STRIDES
#: The backward keeps ``group`` specialized: its key-tile programs loop over the
#: group's query heads, and a group of 1 known at compile time is what lets that
#: loop pipeline well (fwd+bwd fell from 1.21x to 0.83x of PyTorch's without it).
_BACKWARD_SIZE_ARGS = tuple(name for name in _SIZE_ARGS if name != "group")

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
NEG_INF: tl.constexpr = tl.constexpr(float("-inf"))
POS_INF: tl.constexpr = tl.constexpr(float("inf"))
#: A window bound that bounds nothing (:data:`.plans.NO_BOUND`): "no left/right bound" is a runtime value.
NO_BOUND: tl.constexpr = tl.constexpr(plans.NO_BOUND)
#: Head dims are counted in this many columns (:data:`.plans.HEAD_DIM_UNIT`).
HEAD_DIM_UNIT: tl.constexpr = tl.constexpr(plans.HEAD_DIM_UNIT)


# --------------------------------------------------------------------------- shared helpers


@triton.jit
def _tile_ranges(first, last, extent, lower_offset, upper_offset, HAS_LOWER: tl.constexpr, BLOCK: tl.constexpr):
    """Tiles of ``t in [0, extent)`` seen from anchors ``a in [first, last]``.

    ``t`` is seen from ``a`` iff ``a + lower_offset <= t <= a + upper_offset``
    (an offset built from :data:`NO_BOUND` bounds nothing).  Returns
    ``(lo, mid_lo, mid_hi, hi)``: tiles from ``lo`` to ``hi`` hold every ``t``
    seen from some anchor; tiles in ``[mid_lo, mid_hi)`` are whole, inside
    ``extent``, and seen from every anchor, so they need no mask.  ``lo``,
    ``mid_lo`` and ``mid_hi`` are multiples of BLOCK (or equal ``hi``).

    Without a lower bound (``HAS_LOWER`` false, known at compile time) ``lo``
    and ``mid_lo`` are 0, so the first masked range is empty and compiles
    away: the one compile-time mask fact kept, because that leading loop
    costs code and registers in every unbounded and causal program.
    """
    lo = 0
    full_lo = 0
    if HAS_LOWER:
        lo = tl.maximum(first + lower_offset, 0)
        full_lo = tl.maximum(last + lower_offset, 0)
    hi = tl.minimum(tl.maximum(last + upper_offset + 1, 0), extent)
    full_hi = tl.minimum(tl.maximum(first + upper_offset + 1, 0), extent)
    lo = lo // BLOCK * BLOCK
    hi = tl.maximum(hi, lo)
    full_lo = (full_lo + BLOCK - 1) // BLOCK * BLOCK
    full_hi = full_hi // BLOCK * BLOCK
    mid_lo = tl.minimum(full_lo, hi)
    mid_hi = tl.maximum(tl.minimum(full_hi, hi), mid_lo)
    return lo, mid_lo, mid_hi, hi


@triton.jit
def _visible(rows, cols, seqlen_q, seqlen_k, shift, left, right, CHECK_ROWS: tl.constexpr):
    """Bool tile: query ``rows`` sees key ``cols`` (rows past the end only when CHECK_ROWS).

    ``rows`` and ``cols`` come expanded to the tile's orientation: ``rows[:, None], cols[None, :]``
    for a (query, key) tile, ``rows[None, :], cols[:, None]`` for the backward's transposed one,
    which so gets its mask in the layout of its own scores rather than through a transpose.
    """
    diagonal = rows + shift
    visible = (cols < seqlen_k) & (cols >= diagonal - left) & (cols <= diagonal + right)
    if CHECK_ROWS:
        visible = visible & (rows < seqlen_q)
    return visible


@triton.jit
def _head_dim(head_dim_units, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr):
    """The head dim: BLOCK_D itself when EVEN_D (known at compile time, so every column mask folds
    away as in an unpadded kernel), else the runtime ``head_dim_units * HEAD_DIM_UNIT``."""
    if EVEN_D:
        head_dim = BLOCK_D
    else:
        head_dim = head_dim_units * HEAD_DIM_UNIT
    return head_dim


@triton.jit
def _sequence(cu_seqlens, b, seqlen, VARLEN: tl.constexpr):
    """(start row, length) of sequence ``b``: packed via ``cu_seqlens`` or dense."""
    if VARLEN:
        start = tl.load(cu_seqlens + b)
        length = tl.load(cu_seqlens + b + 1) - start
    else:
        start = tl.full([], 0, tl.int32)
        length = seqlen
    return start, length


@triton.jit
def _query_tile_start(seqlen_q, longest_first, BLOCK_M: tl.constexpr):
    """First row of this program's query tile (program axis 0), or -1 past the sequence's last tile.

    With ``longest_first`` (a right bound, as in causal masks) the tiles run in reverse,
    so the programs with the most visible keys start first and the tail is short.
    """
    pid_m = tl.program_id(0)
    num_tiles = tl.cdiv(seqlen_q, BLOCK_M)
    tile = tl.where(longest_first, num_tiles - 1 - pid_m, pid_m)
    return tl.where(pid_m < num_tiles, tile * BLOCK_M, -1)


@triton.jit
def _head_base(X, b, start, h, stride_b, stride_row, stride_h):
    """Pointer to row ``start`` of head ``h`` of batch ``b`` in a (batch, rows, heads, head_dim) tensor (int64 offsets)."""
    return X + b.to(tl.int64) * stride_b + start.to(tl.int64) * stride_row + h.to(tl.int64) * stride_h


@triton.jit
def _row_stats_base(X, b, start, h, stride_b, stride_h):
    """Pointer to row ``start`` of head ``h`` of batch ``b`` in a (batch, heads, rows) fp32 row statistic (LSE, delta)."""
    return X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + start


@triton.jit
def _load_tile(base, rows, stride_row, offs_d, extent, head_dim, CHECK_ROWS: tl.constexpr):
    """A (rows, BLOCK_D) tile; rows >= extent and columns >= head_dim read as 0.

    ``head_dim`` is a multiple of :data:`HEAD_DIM_UNIT` that Triton can see, so the
    column mask is constant over whole 16-byte vectors and the loads stay vectorized.
    """
    ptrs = base + rows[:, None].to(tl.int64) * stride_row + offs_d[None, :]
    if CHECK_ROWS:
        tile = tl.load(ptrs, mask=(rows[:, None] < extent) & (offs_d[None, :] < head_dim), other=0.0)
    else:
        tile = tl.load(ptrs, mask=offs_d[None, :] < head_dim, other=0.0)
    return tile


@triton.jit
def _source(base, extent, stride_row, head_dim, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """Where (rows, head_dim) tiles come from: a TMA tensor descriptor bounded by
    (extent, head_dim), which zero-fills what lies outside, or the base pointer."""
    if USE_TMA:
        source = tl.make_tensor_descriptor(base, shape=[tl.maximum(extent, 1), head_dim], strides=[stride_row, 1],
                                           block_shape=[BLOCK_ROWS, BLOCK_D])
    else:
        source = base
    return source


@triton.jit
def _tile(source, start, rows, stride_row, offs_d, extent, head_dim, CHECK_ROWS: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows ``start + arange`` of a :func:`_source` (the rows are ``rows`` for pointer loads)."""
    if USE_TMA:
        tile = source.load([start, 0])
    else:
        tile = _load_tile(source, rows, stride_row, offs_d, extent, head_dim, CHECK_ROWS)
    return tile


@triton.jit
def _query_program(Q, cu_seqlens_q, cu_seqlens_k, stride_qb, stride_qs, stride_qh,
                   seqlen_q, seqlen_k, group, right, head_dim,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, VARLEN: tl.constexpr, USE_TMA: tl.constexpr):
    """The query side of a program over (query tile, query head, batch), shared by the forward and the dQ pass.

    Returns ``(b, h, h_kv, q_start, sq, k_start, sk, m0, rows, offs_d, q)``: the batch, the query head and
    its kv head, where this batch's query and key rows start and how many there are, the first row of the
    tile (-1 past the sequence's last tile: the caller returns) with its rows and columns, and the q tile.
    """
    h = tl.program_id(1)
    b = tl.program_id(2)
    h_kv = h // group
    q_start, sq = _sequence(cu_seqlens_q, b, seqlen_q, VARLEN)
    k_start, sk = _sequence(cu_seqlens_k, b, seqlen_k, VARLEN)
    m0 = _query_tile_start(sq, right < NO_BOUND, BLOCK_M)
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = _head_base(Q, b, q_start, h, stride_qb, stride_qs, stride_qh)
    if USE_TMA:
        q = tl.zeros([BLOCK_M, BLOCK_D], dtype=Q.dtype.element_ty)
        if m0 >= 0:  # a descriptor load must not start past the rows
            q = _source(q_base, sq, stride_qs, head_dim, BLOCK_M, BLOCK_D, USE_TMA).load([m0, 0])
    else:  # a program past the last tile loads nothing: its rows start at m0 = -1, so an extent of m0 masks all
        q = _load_tile(q_base, rows, stride_qs, offs_d, tl.where(m0 < 0, m0, sq), head_dim, True)
    return b, h, h_kv, q_start, sq, k_start, sk, m0, rows, offs_d, q


# --------------------------------------------------------------------------- forward


@triton.jit
def _forward_tiles(acc, m_i, l_i, q, k_src, v_src, stride_ks, stride_vs,
                   rows, offs_n, offs_d, start, end,
                   seqlen_q, seqlen_k, shift, left, right, qk_scale, head_dim,
                   BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr):
    """Algorithm 1, lines 6-10, over key tiles ``[start, end)``."""
    for n0 in tl.range(start, end, BLOCK_N):
        cols = n0 + offs_n
        # Stage 1: scores s = q k^T (fp32 accumulate).
        k = _tile(k_src, n0, cols, stride_ks, offs_d, seqlen_k, head_dim, MASKED, USE_TMA)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        # Stage 2: online softmax in the log2 domain.
        if MASKED:
            visible = _visible(rows[:, None], cols[None, :], seqlen_q, seqlen_k, shift, left, right, False)
            s = tl.where(visible, s * qk_scale, NEG_INF)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == NEG_INF, 0.0, m_new)  # a row with nothing seen yet
            p = tl.math.exp2(s - m_use[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_use = m_new
            p = tl.math.exp2(s * qk_scale - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        # Stage 3: rescale the accumulator and add p v.
        v = _tile(v_src, n0, cols, stride_vs, offs_d, seqlen_k, head_dim, MASKED, USE_TMA)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=_SIZE_ARGS)
def forward_kernel(
    # pointers
    Q, K, V, Out, Lse, cu_seqlens_q, cu_seqlens_k,
    # strides in units of the tensor's *_UNIT elements; the head_dim stride is 1
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    # sizes and mask (a bound of NO_BOUND bounds nothing); head_dim in units of HEAD_DIM_UNIT
    seqlen_q, seqlen_k, group, qk_scale, left, right, head_dim_units,
    # compile-time constants
    BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr, HAS_LEFT: tl.constexpr,
    Q_UNIT: tl.constexpr, K_UNIT: tl.constexpr, V_UNIT: tl.constexpr, O_UNIT: tl.constexpr,
):
    """out, lse for one (query tile, head, batch); grid (tiles, heads_q, batch)."""
    head_dim = _head_dim(head_dim_units, BLOCK_D, EVEN_D)
    stride_qb, stride_qs, stride_qh = stride_qb * Q_UNIT, stride_qs * Q_UNIT, stride_qh * Q_UNIT
    stride_kb, stride_ks, stride_kh = stride_kb * K_UNIT, stride_ks * K_UNIT, stride_kh * K_UNIT
    stride_vb, stride_vs, stride_vh = stride_vb * V_UNIT, stride_vs * V_UNIT, stride_vh * V_UNIT
    stride_ob, stride_os, stride_oh = stride_ob * O_UNIT, stride_os * O_UNIT, stride_oh * O_UNIT
    b, h, h_kv, q_start, sq, k_start, sk, m0, rows, offs_d, q = _query_program(
        Q, cu_seqlens_q, cu_seqlens_k, stride_qb, stride_qs, stride_qh, seqlen_q, seqlen_k, group, right, head_dim,
        BLOCK_M, BLOCK_D, VARLEN, USE_TMA)
    if m0 < 0:
        return
    shift = sk - sq
    offs_n = tl.arange(0, BLOCK_N)
    k_base = _head_base(K, b, k_start, h_kv, stride_kb, stride_ks, stride_kh)
    v_base = _head_base(V, b, k_start, h_kv, stride_vb, stride_vs, stride_vh)

    # Stage 0: the key tiles these rows see, split into masked / whole / masked.
    row_last = tl.minimum(m0 + BLOCK_M, sq) - 1
    lo, mid_lo, mid_hi, hi = _tile_ranges(m0, row_last, sk, shift - left, shift + right, HAS_LEFT, BLOCK_N)

    k_src = _source(k_base, sk, stride_ks, head_dim, BLOCK_N, BLOCK_D, USE_TMA)
    v_src = _source(v_base, sk, stride_vs, head_dim, BLOCK_N, BLOCK_D, USE_TMA)
    m_i = tl.full([BLOCK_M], NEG_INF, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, m_i, l_i = _forward_tiles(acc, m_i, l_i, q, k_src, v_src, stride_ks, stride_vs,
                                   rows, offs_n, offs_d, lo, mid_lo, sq, sk, shift, left, right, qk_scale, head_dim,
                                   BLOCK_N, True, DOT_PRECISION, USE_TMA)
    acc, m_i, l_i = _forward_tiles(acc, m_i, l_i, q, k_src, v_src, stride_ks, stride_vs,
                                   rows, offs_n, offs_d, mid_lo, mid_hi, sq, sk, shift, left, right, qk_scale, head_dim,
                                   BLOCK_N, False, DOT_PRECISION, USE_TMA)
    acc, m_i, l_i = _forward_tiles(acc, m_i, l_i, q, k_src, v_src, stride_ks, stride_vs,
                                   rows, offs_n, offs_d, mid_hi, hi, sq, sk, shift, left, right, qk_scale, head_dim,
                                   BLOCK_N, True, DOT_PRECISION, USE_TMA)

    # Stage 4: deferred normalisation; rows that saw no key give 0 and lse = +inf.
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    inv_l = tl.where(seen, 1.0 / l_safe, 0.0)
    out = acc * inv_l[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2, POS_INF)
    o_base = _head_base(Out, b, q_start, h, stride_ob, stride_os, stride_oh)
    if USE_TMA:
        o_src = _source(o_base, sq, stride_os, head_dim, BLOCK_M, BLOCK_D, USE_TMA)
        o_src.store([m0, 0], out.to(Out.dtype.element_ty))
    else:
        o_ptrs = o_base + rows[:, None].to(tl.int64) * stride_os + offs_d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows[:, None] < sq) & (offs_d[None, :] < head_dim))
    l_ptrs = _row_stats_base(Lse, b, q_start, h, stride_lb, stride_lh) + rows
    tl.store(l_ptrs, lse, mask=rows < sq)


# --------------------------------------------------------------------------- backward


@triton.jit(do_not_specialize=_SIZE_ARGS)
def backward_preprocess_kernel(
    Out, DO, Delta, cu_seqlens_q,
    stride_ob, stride_os, stride_oh,
    stride_dob, stride_dos, stride_doh,
    stride_lb, stride_lh,
    seqlen_q, head_dim_units,
    BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr,
    O_UNIT: tl.constexpr, DO_UNIT: tl.constexpr,
):
    """delta = rowsum(dout * out) in fp32 (Algorithm 2, line 4); grid (tiles, heads_q, batch)."""
    head_dim = _head_dim(head_dim_units, BLOCK_D, EVEN_D)
    stride_ob, stride_os, stride_oh = stride_ob * O_UNIT, stride_os * O_UNIT, stride_oh * O_UNIT
    stride_dob, stride_dos, stride_doh = stride_dob * DO_UNIT, stride_dos * DO_UNIT, stride_doh * DO_UNIT
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_start, sq = _sequence(cu_seqlens_q, b, seqlen_q, VARLEN)
    if pid_m * BLOCK_M >= sq:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o_base = _head_base(Out, b, q_start, h, stride_ob, stride_os, stride_oh)
    do_base = _head_base(DO, b, q_start, h, stride_dob, stride_dos, stride_doh)
    out = _load_tile(o_base, rows, stride_os, offs_d, sq, head_dim, True).to(tl.float32)
    dout = _load_tile(do_base, rows, stride_dos, offs_d, sq, head_dim, True).to(tl.float32)
    delta = tl.sum(out * dout, 1)
    tl.store(_row_stats_base(Delta, b, q_start, h, stride_lb, stride_lh) + rows, delta, mask=rows < sq)


@triton.jit
def _backward_kv_tiles(dk, dv, k, v, q_src, do_src, lse_base, delta_base, dq_base,
                       stride_qs, stride_dos, stride_dqs,
                       cols, offs_m, offs_d, start, end,
                       seqlen_q, seqlen_k, shift, left, right, qk_scale, softmax_scale, head_dim,
                       BLOCK_M: tl.constexpr, MASKED: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr):
    """Algorithm 2, lines 8-21, for one key tile over query tiles ``[start, end)``."""
    for m0 in tl.range(start, end, BLOCK_M):
        rows = m0 + offs_m
        # Stage 1: recompute p^T from the stored LSE (log2 domain).
        q = _tile(q_src, m0, rows, stride_qs, offs_d, seqlen_q, head_dim, MASKED, USE_TMA)
        if MASKED:
            lse2 = tl.load(lse_base + rows, mask=rows < seqlen_q, other=POS_INF) * LOG2E
        else:
            lse2 = tl.load(lse_base + rows) * LOG2E
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:
            visible_t = _visible(rows[None, :], cols[:, None], seqlen_q, seqlen_k, shift, left, right, True)
            p_t = tl.where(visible_t, p_t, 0.0)
        # Stage 2: dv += p^T dO.
        dout = _tile(do_src, m0, rows, stride_dos, offs_d, seqlen_q, head_dim, MASKED, USE_TMA)
        dv = tl.dot(p_t.to(dout.dtype), dout, dv, input_precision=DOT_PRECISION)
        # Stage 3: ds^T = p^T (dp^T - delta), dk += ds^T q.
        if MASKED:
            delta = tl.load(delta_base + rows, mask=rows < seqlen_q, other=0.0)
        else:
            delta = tl.load(delta_base + rows)
        dp_t = tl.dot(v, tl.trans(dout), input_precision=DOT_PRECISION)
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk, input_precision=DOT_PRECISION)
        # Stage 4: dq += scale * ds k, accumulated across key tiles by fp32 atomics.
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION) * softmax_scale
            dq_ptrs = dq_base + rows[:, None].to(tl.int64) * stride_dqs + offs_d[None, :]
            if MASKED:
                tl.atomic_add(dq_ptrs, dq, mask=(rows[:, None] < seqlen_q) & (offs_d[None, :] < head_dim),
                              sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq, mask=offs_d[None, :] < head_dim, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=_BACKWARD_SIZE_ARGS)
def backward_kv_kernel(
    # pointers
    Q, K, V, DO, Lse, Delta, DQacc, DK, DV, cu_seqlens_q, cu_seqlens_k,
    # strides in units of the tensor's *_UNIT elements; the head_dim stride is 1
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    stride_lb, stride_lh,
    # sizes and mask (a bound of NO_BOUND bounds nothing); head_dim in units of HEAD_DIM_UNIT
    seqlen_q, seqlen_k, group, qk_scale, softmax_scale, left, right, head_dim_units,
    # compile-time constants
    BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    Q_UNIT: tl.constexpr, K_UNIT: tl.constexpr, V_UNIT: tl.constexpr, DO_UNIT: tl.constexpr,
    DQ_UNIT: tl.constexpr, DK_UNIT: tl.constexpr, DV_UNIT: tl.constexpr,
):
    """dk, dv (and atomic dq) for one (key tile, kv head, batch); grid (tiles, heads_kv, batch)."""
    head_dim = _head_dim(head_dim_units, BLOCK_D, EVEN_D)
    stride_qb, stride_qs, stride_qh = stride_qb * Q_UNIT, stride_qs * Q_UNIT, stride_qh * Q_UNIT
    stride_kb, stride_ks, stride_kh = stride_kb * K_UNIT, stride_ks * K_UNIT, stride_kh * K_UNIT
    stride_vb, stride_vs, stride_vh = stride_vb * V_UNIT, stride_vs * V_UNIT, stride_vh * V_UNIT
    stride_dob, stride_dos, stride_doh = stride_dob * DO_UNIT, stride_dos * DO_UNIT, stride_doh * DO_UNIT
    stride_dqb, stride_dqs, stride_dqh = stride_dqb * DQ_UNIT, stride_dqs * DQ_UNIT, stride_dqh * DQ_UNIT
    stride_dkb, stride_dks, stride_dkh = stride_dkb * DK_UNIT, stride_dks * DK_UNIT, stride_dkh * DK_UNIT
    stride_dvb, stride_dvs, stride_dvh = stride_dvb * DV_UNIT, stride_dvs * DV_UNIT, stride_dvh * DV_UNIT
    pid_n = tl.program_id(0)
    h_kv = tl.program_id(1)
    b = tl.program_id(2)
    q_start, sq = _sequence(cu_seqlens_q, b, seqlen_q, VARLEN)
    k_start, sk = _sequence(cu_seqlens_k, b, seqlen_k, VARLEN)
    n0 = pid_n * BLOCK_N
    if n0 >= sk:
        return
    shift = sk - sq

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    cols = n0 + offs_n
    k_base = _head_base(K, b, k_start, h_kv, stride_kb, stride_ks, stride_kh)
    v_base = _head_base(V, b, k_start, h_kv, stride_vb, stride_vs, stride_vh)
    k = _load_tile(k_base, cols, stride_ks, offs_d, sk, head_dim, True)
    v = _load_tile(v_base, cols, stride_vs, offs_d, sk, head_dim, True)

    # Stage 0: the query tiles that see this key tile; a partial key tile is masked throughout.
    col_last = tl.minimum(n0 + BLOCK_N, sk) - 1
    lo, mid_lo, mid_hi, hi = _tile_ranges(n0, col_last, sq, -shift - right, -shift + left, HAS_RIGHT, BLOCK_M)
    if n0 + BLOCK_N > sk:
        mid_lo = hi
        mid_hi = hi

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for g in range(group):
        h = h_kv * group + g
        q_base = _head_base(Q, b, q_start, h, stride_qb, stride_qs, stride_qh)
        do_base = _head_base(DO, b, q_start, h, stride_dob, stride_dos, stride_doh)
        dq_base = _head_base(DQacc, b, q_start, h, stride_dqb, stride_dqs, stride_dqh)
        lse_base = _row_stats_base(Lse, b, q_start, h, stride_lb, stride_lh)
        delta_base = _row_stats_base(Delta, b, q_start, h, stride_lb, stride_lh)
        q_src = _source(q_base, sq, stride_qs, head_dim, BLOCK_M, BLOCK_D, USE_TMA)
        do_src = _source(do_base, sq, stride_dos, head_dim, BLOCK_M, BLOCK_D, USE_TMA)
        dk, dv = _backward_kv_tiles(dk, dv, k, v, q_src, do_src, lse_base, delta_base, dq_base,
                                    stride_qs, stride_dos, stride_dqs, cols, offs_m, offs_d, lo, mid_lo,
                                    sq, sk, shift, left, right, qk_scale, softmax_scale, head_dim,
                                    BLOCK_M, True, ATOMIC_DQ, DOT_PRECISION, USE_TMA)
        dk, dv = _backward_kv_tiles(dk, dv, k, v, q_src, do_src, lse_base, delta_base, dq_base,
                                    stride_qs, stride_dos, stride_dqs, cols, offs_m, offs_d, mid_lo, mid_hi,
                                    sq, sk, shift, left, right, qk_scale, softmax_scale, head_dim,
                                    BLOCK_M, False, ATOMIC_DQ, DOT_PRECISION, USE_TMA)
        dk, dv = _backward_kv_tiles(dk, dv, k, v, q_src, do_src, lse_base, delta_base, dq_base,
                                    stride_qs, stride_dos, stride_dqs, cols, offs_m, offs_d, mid_hi, hi,
                                    sq, sk, shift, left, right, qk_scale, softmax_scale, head_dim,
                                    BLOCK_M, True, ATOMIC_DQ, DOT_PRECISION, USE_TMA)

    # Stage 5: write dk (scaled) and dv.
    store_mask = (cols[:, None] < sk) & (offs_d[None, :] < head_dim)
    dk_ptrs = (_head_base(DK, b, k_start, h_kv, stride_dkb, stride_dks, stride_dkh)
               + cols[:, None].to(tl.int64) * stride_dks + offs_d[None, :])
    tl.store(dk_ptrs, (dk * softmax_scale).to(DK.dtype.element_ty), mask=store_mask)
    dv_ptrs = (_head_base(DV, b, k_start, h_kv, stride_dvb, stride_dvs, stride_dvh)
               + cols[:, None].to(tl.int64) * stride_dvs + offs_d[None, :])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=store_mask)


@triton.jit
def _backward_dq_tiles(dq, q, dout, lse2, delta, k_src, v_src, stride_ks, stride_vs,
                       rows, offs_n, offs_d, start, end,
                       seqlen_q, seqlen_k, shift, left, right, qk_scale, head_dim,
                       BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       USE_TMA: tl.constexpr):
    """dq += ds k over key tiles ``[start, end)`` in ascending order (deterministic)."""
    for n0 in tl.range(start, end, BLOCK_N):
        cols = n0 + offs_n
        k = _tile(k_src, n0, cols, stride_ks, offs_d, seqlen_k, head_dim, MASKED, USE_TMA)
        v = _tile(v_src, n0, cols, stride_vs, offs_d, seqlen_k, head_dim, MASKED, USE_TMA)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            visible = _visible(rows[:, None], cols[None, :], seqlen_q, seqlen_k, shift, left, right, False)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(dout, tl.trans(v), input_precision=DOT_PRECISION)
        ds = (p * (dp - delta[:, None])).to(k.dtype)
        dq = tl.dot(ds, k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit(do_not_specialize=_BACKWARD_SIZE_ARGS)
def backward_dq_kernel(
    # pointers
    Q, K, V, DO, Lse, Delta, DQ, cu_seqlens_q, cu_seqlens_k,
    # strides in units of the tensor's *_UNIT elements; the head_dim stride is 1
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
    stride_lb, stride_lh,
    # sizes and mask (a bound of NO_BOUND bounds nothing); head_dim in units of HEAD_DIM_UNIT
    seqlen_q, seqlen_k, group, qk_scale, softmax_scale, left, right, head_dim_units,
    # compile-time constants
    BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr, HAS_LEFT: tl.constexpr,
    Q_UNIT: tl.constexpr, K_UNIT: tl.constexpr, V_UNIT: tl.constexpr, DO_UNIT: tl.constexpr, DQ_UNIT: tl.constexpr,
):
    """dq for one (query tile, head, batch), no atomics; grid (tiles, heads_q, batch)."""
    head_dim = _head_dim(head_dim_units, BLOCK_D, EVEN_D)
    stride_qb, stride_qs, stride_qh = stride_qb * Q_UNIT, stride_qs * Q_UNIT, stride_qh * Q_UNIT
    stride_kb, stride_ks, stride_kh = stride_kb * K_UNIT, stride_ks * K_UNIT, stride_kh * K_UNIT
    stride_vb, stride_vs, stride_vh = stride_vb * V_UNIT, stride_vs * V_UNIT, stride_vh * V_UNIT
    stride_dob, stride_dos, stride_doh = stride_dob * DO_UNIT, stride_dos * DO_UNIT, stride_doh * DO_UNIT
    stride_dqb, stride_dqs, stride_dqh = stride_dqb * DQ_UNIT, stride_dqs * DQ_UNIT, stride_dqh * DQ_UNIT
    b, h, h_kv, q_start, sq, k_start, sk, m0, rows, offs_d, q = _query_program(
        Q, cu_seqlens_q, cu_seqlens_k, stride_qb, stride_qs, stride_qh, seqlen_q, seqlen_k, group, right, head_dim,
        BLOCK_M, BLOCK_D, VARLEN, USE_TMA)
    if m0 < 0:
        return
    shift = sk - sq
    offs_n = tl.arange(0, BLOCK_N)
    do_base = _head_base(DO, b, q_start, h, stride_dob, stride_dos, stride_doh)
    k_base = _head_base(K, b, k_start, h_kv, stride_kb, stride_ks, stride_kh)
    v_base = _head_base(V, b, k_start, h_kv, stride_vb, stride_vs, stride_vh)
    lse_row = _row_stats_base(Lse, b, q_start, h, stride_lb, stride_lh) + rows
    delta_row = _row_stats_base(Delta, b, q_start, h, stride_lb, stride_lh) + rows

    do_src = _source(do_base, sq, stride_dos, head_dim, BLOCK_M, BLOCK_D, USE_TMA)
    k_src = _source(k_base, sk, stride_ks, head_dim, BLOCK_N, BLOCK_D, USE_TMA)
    v_src = _source(v_base, sk, stride_vs, head_dim, BLOCK_N, BLOCK_D, USE_TMA)
    dout = _tile(do_src, m0, rows, stride_dos, offs_d, sq, head_dim, True, USE_TMA)
    lse2 = tl.load(lse_row, mask=rows < sq, other=POS_INF) * LOG2E
    delta = tl.load(delta_row, mask=rows < sq, other=0.0)

    row_last = tl.minimum(m0 + BLOCK_M, sq) - 1
    lo, mid_lo, mid_hi, hi = _tile_ranges(m0, row_last, sk, shift - left, shift + right, HAS_LEFT, BLOCK_N)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _backward_dq_tiles(dq, q, dout, lse2, delta, k_src, v_src, stride_ks, stride_vs, rows, offs_n, offs_d,
                            lo, mid_lo, sq, sk, shift, left, right, qk_scale, head_dim,
                            BLOCK_N, True, DOT_PRECISION, USE_TMA)
    dq = _backward_dq_tiles(dq, q, dout, lse2, delta, k_src, v_src, stride_ks, stride_vs, rows, offs_n, offs_d,
                            mid_lo, mid_hi, sq, sk, shift, left, right, qk_scale, head_dim,
                            BLOCK_N, False, DOT_PRECISION, USE_TMA)
    dq = _backward_dq_tiles(dq, q, dout, lse2, delta, k_src, v_src, stride_ks, stride_vs, rows, offs_n, offs_d,
                            mid_hi, hi, sq, sk, shift, left, right, qk_scale, head_dim,
                            BLOCK_N, True, DOT_PRECISION, USE_TMA)

    dq_ptrs = (_head_base(DQ, b, q_start, h, stride_dqb, stride_dqs, stride_dqh)
               + rows[:, None].to(tl.int64) * stride_dqs + offs_d[None, :])
    tl.store(dq_ptrs, (dq * softmax_scale).to(DQ.dtype.element_ty),
             mask=(rows[:, None] < sq) & (offs_d[None, :] < head_dim))
