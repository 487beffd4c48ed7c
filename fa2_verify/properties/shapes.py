"""Shape strategies: batch, heads (MHA, GQA, MQA), sequence lengths, head dims.

Sequence lengths favour the sizes where tiled kernels break: 1 and 2, primes
(never a multiple of a tile), and every block size plus and minus one (a tail
tile of one row, or a full tile but one).  FA2 tiles queries into blocks of
B_r rows and keys into blocks of B_c columns (Algorithm 1, lines 3-4).  Past
256 tokens (the ``scale`` profile) they also favour the powers of two plus
and minus one up to 2^17 (65,535 to 65,537 among them: 16-bit indices and
grid limits) and any multiple of 64 or 128 plus or minus one (a long sequence
ending one row into, or one row short of, a tile).
Below 257 tokens a third of the pairs are unbalanced (:func:`unbalanced_pairs`):
one side up to 257 (past two tiles of 128) and the other short, as in
decoding (one query against many keys), within the same number of scores.
Lengths a kernel cannot run (its ``seqlen_multiple_of``, ``equal_seqlens``,
``min_seqlen``/``max_seqlen``) are never drawn: boundary lengths are rounded
to its multiple instead of being filtered away.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fa2_verify.core.contract import Capabilities, causal_prefix_keys, round_up
from fa2_verify.properties.validation import check_int, check_order
from fa2_verify.core.errors import UsageError

#: Tile sizes of common FA2 implementations (B_r and B_c in the FA2 paper).
BLOCK_SIZES: tuple[int, ...] = (16, 32, 64, 128)

#: Multiples of these, plus and minus one, are drawn past 256 tokens.
LONG_BLOCK_SIZES: tuple[int, ...] = (64, 128)

#: Powers of two plus and minus one, 256 to 2^17: index widths and grid limits (65,535 to 65,537).
LONG_LENGTHS: tuple[int, ...] = tuple(sorted({2**k + d for k in range(8, 18) for d in (-1, 0, 1)}))

#: The long side of :func:`unbalanced_pairs`: two tiles of the largest block plus one.
UNBALANCED_LENGTH = 2 * max(BLOCK_SIZES) + 1

#: Primes up to 256: lengths that are never a multiple of a tile.
PRIMES: tuple[int, ...] = tuple(n for n in range(2, 257) if all(n % p for p in range(2, int(n**0.5) + 1)))


def boundary_lengths(*, min_value: int, max_value: int, block_sizes: tuple[int, ...] = BLOCK_SIZES) -> list[int]:
    """The lengths in ``[min_value, max_value]`` that tiling bugs hide behind, smallest first."""
    special = {0, 1, 2, *PRIMES, *LONG_LENGTHS}
    for block in block_sizes:
        special.update((block - 1, block, block + 1))
    return sorted(n for n in special if min_value <= n <= max_value)


def block_multiples(*, min_value: int, max_value: int) -> st.SearchStrategy[int]:
    """``m * block + d`` in ``[min_value, max_value]`` for ``block`` in :data:`LONG_BLOCK_SIZES`, ``d`` in -1, 0, 1.

    Shrinks toward the smallest multiple of 64 minus one.
    """
    check_int("max_value", max_value, min_value=max(min_value, max(LONG_BLOCK_SIZES) + 1))
    blocks = st.sampled_from(LONG_BLOCK_SIZES)
    return blocks.flatmap(
        lambda block: st.builds(
            lambda multiple, offset: block * multiple + offset,
            st.integers(1, (max_value - 1) // block),
            st.sampled_from((-1, 0, 1)),
        )
    ).filter(lambda n: min_value <= n)


def seqlens(
    *, min_value: int = 1, max_value: int = 128, block_sizes: tuple[int, ...] = BLOCK_SIZES, multiple_of: int = 1
) -> st.SearchStrategy[int]:
    """A sequence length in ``[min_value, max_value]``, half the time a boundary length.

    Past 256 a third of the draws are :func:`block_multiples` instead.
    Shrinks toward ``min_value`` and the first boundary lengths.
    With ``multiple_of=m`` every length is a multiple of ``m``: each boundary
    length (and block multiple) is rounded up to the next multiple (down to the
    largest one where that passes ``max_value``), so a kernel that needs
    multiples still sees the lengths nearest the tiling edges, and none is
    filtered away.
    """
    check_int("min_value", min_value, min_value=0)
    check_int("max_value", max_value, min_value=max(min_value, 1))
    check_int("multiple_of", multiple_of, min_value=1)
    for block in block_sizes:
        check_int("block_sizes[]", block, min_value=1)
    low, high = round_up(min_value, multiple_of), max_value // multiple_of * multiple_of
    if low > high:
        raise UsageError(
            f"multiple_of={multiple_of}: no multiple of it lies in [min_value={min_value}, max_value={max_value}]: "
            "raise max_value"
        )

    def fit(n: int) -> int:
        return min(round_up(n, multiple_of), high)

    boundary = boundary_lengths(min_value=min_value, max_value=max_value, block_sizes=block_sizes)
    boundaries = st.sampled_from(sorted({fit(n) for n in boundary}))
    anywhere = st.integers(low // multiple_of, high // multiple_of).map(lambda steps: steps * multiple_of)
    if max_value <= 256:
        return st.one_of(boundaries, anywhere)
    return st.one_of(
        boundaries, block_multiples(min_value=min_value, max_value=max_value).map(fit), anywhere
    )


def _side_limit(capabilities: Capabilities, max_value: int, side: str | None) -> int:
    """``max_value`` within the kernel's ``max_seqlen``, raised to the kernel's shortest length on ``side``.

    The profile's limit bounds the cost of a case; a kernel whose shortest
    supported length lies beyond it (e.g. multiples of 128 under a 72-token
    CPU profile) is checked at that shortest length rather than not at all.
    """
    high = max_value if capabilities.max_seqlen is None else min(max_value, capabilities.max_seqlen)
    return max(high, capabilities.smallest_seqlen(side) or 0)


def unbalanced_pairs(*, min_value: int, max_value: int, capabilities: Capabilities) -> st.SearchStrategy[tuple[int, int]]:
    """``(short, long)`` or ``(long, short)``: one side up to :data:`UNBALANCED_LENGTH`, the other at most
    ``max_value`` and ``max_value**2 // long``, so a pair has no more score elements than ``(max_value, max_value)``.

    A profile whose lengths stay below two tiles of 128 never lets a kernel with
    128-row or 128-key tiles run a second tile along a row or column (its
    rescaling, running max, split-KV combine or dK/dV accumulation across
    tiles); and balanced pairs rarely give one query against many keys, the
    decoding shape (``seqlen_q = 1``) that kernels serve with a path of its
    own.  The short side shrinks toward 1 (decoding), the long side toward
    ``min_value``.  Lengths the kernel cannot run are never drawn
    (:func:`_side_limit`, :func:`seqlens`).
    """
    low = max(min_value, capabilities.min_seqlen)

    def side_lengths(side: str, limit: int) -> st.SearchStrategy[int]:
        high = _side_limit(capabilities, max(limit, low, 1), side)
        return seqlens(min_value=low, max_value=high, multiple_of=capabilities.seqlen_step(side))

    def pair(long_side: str) -> st.SearchStrategy[tuple[int, int]]:
        short_side = "k" if long_side == "q" else "q"

        def with_short(long: int) -> st.SearchStrategy[tuple[int, int]]:
            short = side_lengths(short_side, min(max_value, max_value**2 // max(long, 1)))
            return short.map(lambda n: (n, long) if long_side == "k" else (long, n))

        return side_lengths(long_side, UNBALANCED_LENGTH).flatmap(with_short)

    return st.one_of(pair("k"), pair("q"))


def seqlen_pairs(
    *, min_value: int = 1, max_value: int = 128, capabilities: Capabilities | None = None
) -> st.SearchStrategy[tuple[int, int]]:
    """``(seqlen_q, seqlen_k)``: equal, independent (so q longer and shorter than k both occur), or,
    below :data:`UNBALANCED_LENGTH`, :func:`unbalanced_pairs` (a third of the draws).

    With ``capabilities``, only pairs the kernel supports
    (:meth:`~core.contract.Capabilities.seqlen_unsupported_reason`): each side
    a multiple of its ``seqlen_multiple_of`` (equal pairs of both), within
    ``min_seqlen``/``max_seqlen``, equal only if ``equal_seqlens``
    (:func:`seqlens` rounds boundary lengths to the multiple).
    """
    if capabilities is None:
        capabilities = Capabilities(dtypes={"cpu": ("float32",)}, head_dims=(64,))
    low = max(min_value, capabilities.min_seqlen)
    equal = None
    if capabilities.smallest_seqlen() is not None:
        equal_lengths = seqlens(
            min_value=low, max_value=_side_limit(capabilities, max_value, None), multiple_of=capabilities.seqlen_step()
        )
        equal = equal_lengths.map(lambda n: (n, n))
    if capabilities.equal_seqlens:
        assert equal is not None, "Capabilities refuses equal_seqlens with no equal length to run"
        return equal
    sides = st.tuples(
        *(
            seqlens(
                min_value=low,
                max_value=_side_limit(capabilities, max_value, side),
                multiple_of=capabilities.seqlen_step(side),
            )
            for side in ("q", "k")
        )
    )
    kinds = [kind for kind in (equal, sides) if kind is not None]
    if max_value < UNBALANCED_LENGTH:
        kinds.append(unbalanced_pairs(min_value=min_value, max_value=max_value, capabilities=capabilities))
    return st.one_of(kinds)


def prefix_rows(*, seqlen_q: int, seqlen_k: int, capabilities: Capabilities) -> st.SearchStrategy[int]:
    """How many leading queries ``m`` a causal-prefix relation keeps: ``m`` in ``[1, sq]`` whose prefix keeps
    a key and is a pair ``(m, causal_prefix_keys(m))`` the kernel supports (``m + sk - sq`` keys bottom-right
    aligned, :func:`core.contract.causal_prefix_keys`); shrinks toward the fewest rows.

    ``m = seqlen_q`` is always among them (the full case is supported).
    """
    alignment = capabilities.causal_alignment
    rows = [
        m
        for m in range(1, seqlen_q + 1)
        if (keys := causal_prefix_keys(m, seqlen_q, seqlen_k, alignment)) >= 1
        and capabilities.seqlen_unsupported_reason(m, keys) is None
    ]
    return st.sampled_from(rows)


def head_counts(
    *, max_heads_kv: int = 3, max_group: int = 3, gqa: bool = True, min_group: int = 1, min_heads_q: int = 1
) -> st.SearchStrategy[tuple[int, int]]:
    """``(heads_q, heads_kv)`` with ``heads_q = group * heads_kv``: MHA, GQA (kv > 1) and MQA (kv = 1).

    ``gqa=False`` (a kernel without GQA) gives MHA only; ``min_group=2`` GQA/MQA
    only; ``min_heads_q`` at least that many query heads.
    """
    check_int("max_heads_kv", max_heads_kv, min_value=1)
    check_int("max_group", max_group, min_value=1)
    check_int("min_group", min_group, min_value=1, max_value=max_group if gqa else 1)
    check_int("min_heads_q", min_heads_q, min_value=1, max_value=max_heads_kv * (max_group if gqa else 1))
    groups = st.integers(min_group, max_group if gqa else 1)
    pairs = st.tuples(groups, st.integers(1, max_heads_kv)).map(lambda pair: (pair[0] * pair[1], pair[1]))
    return pairs.filter(lambda heads: heads[0] >= min_heads_q) if min_heads_q > 1 else pairs


#: One example in this many draws its head dim above the profile's ``common_head_dim``.
LARGE_HEAD_DIM_ODDS = 8

#: Head dims where the second 128-column chunk of a chunked kernel starts (129) and ends (255, 256);
#: half of the large draws take one of these, the other half any large head dim.
CHUNK_EDGE_HEAD_DIMS: tuple[int, ...] = (129, 255, 256)


def head_dims(
    *, capabilities: Capabilities, device: str = "cpu", max_value: int = 256, common_max: int | None = None
) -> st.SearchStrategy[int]:
    """A head dim the kernel declares on ``device``, at most ``max_value``, smallest first.

    With ``common_max``, the dims above it are drawn one time in
    :data:`LARGE_HEAD_DIM_ODDS` (half of those times one of
    :data:`CHUNK_EDGE_HEAD_DIMS`) and shrink toward the dims at or below it.
    """
    check_int("max_value", max_value, min_value=1)
    declared = capabilities.head_dims_on(device)
    supported = sorted(d for d in declared if d <= max_value)
    if not supported:
        raise UsageError(
            f"max_value={max_value} excludes every head dim the kernel supports on {device} "
            f"({min(declared)}..{max(declared)}): raise max_value"
        )
    if common_max is None:
        return st.sampled_from(supported)
    check_int("common_max", common_max, min_value=1, max_value=max_value)
    common = [d for d in supported if d <= common_max]
    large = [d for d in supported if d > common_max]
    if not common or not large:
        return st.sampled_from(supported)
    # sampled_from draws its tickets uniformly; st.integers(0, 7) favours its low end (0 in about 44% of
    # draws, 7 in about 1 in 13), which made the large head dims rarer than the odds say.
    edges = [d for d in large if d in CHUNK_EDGE_HEAD_DIMS]
    large_dims = st.one_of(st.sampled_from(edges), st.sampled_from(large)) if edges else st.sampled_from(large)
    return st.sampled_from(range(LARGE_HEAD_DIM_ODDS)).flatmap(
        lambda ticket: large_dims if ticket == LARGE_HEAD_DIM_ODDS - 1 else st.sampled_from(common)
    )


def batches(*, min_value: int = 1, max_value: int = 2) -> st.SearchStrategy[int]:
    check_int("min_value", min_value, min_value=1)
    check_int("max_value", max_value, min_value=1)
    check_order("min_value", min_value, "max_value", max_value)
    return st.integers(min_value, max_value)
