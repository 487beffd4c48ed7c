"""Mask strategies: none, causal, every kind of sliding window (sides at their encoding's edges among
them), and rows that see no key.

Masks are bottom-right aligned (:func:`core.contract.visible_mask`; a kernel
declaring top-left alignment has its cases checked with that mask, which the
case strategies set, :meth:`core.case.CaseSpec.aligned`): with
``shift = seqlen_k - seqlen_q`` query ``i`` sees key ``j`` iff
``i + shift - left <= j <= i + shift + right``.  A row sees no key exactly when
``i + shift + right < 0``, i.e. only when ``seqlen_q > seqlen_k + right``; the
``empty_rows`` branch draws those shapes on purpose, since the contract's
answer there (out = 0, dq = 0, lse = +-inf, never NaN) is what a naive
``m = -inf; exp(s - m)`` gets wrong.  Every window side is one of
:func:`edge_sides` a third of the time (0, ``seqlen_k - 1``, ``seqlen_k``,
beyond every key), beside -1 on the other side (``(-1, 0)``, ``(0, -1)``), 0
(``(0, 0)``) or a side of its own: kernels translate ``-1`` and the inclusive
bounds into their own encodings, and get the edges wrong (TransformerEngine
#3528, SGLang PR #32087).
"""

from __future__ import annotations

from hypothesis import strategies as st

from fa2_verify.core.contract import UNBOUNDED, visible_mask
from fa2_verify.properties.shapes import boundary_lengths
from fa2_verify.properties.validation import check_bool, check_int
from fa2_verify.core.errors import UsageError

Mask = tuple[bool, tuple[int, int]]
NO_MASK: Mask = (False, (UNBOUNDED, UNBOUNDED))
CAUSAL_MASK = st.just((True, (UNBOUNDED, UNBOUNDED)))


def kernel_masks(*, seqlen_q: int, seqlen_k: int, capabilities) -> st.SearchStrategy[Mask]:
    """:func:`masks` of what ``capabilities`` (a :class:`core.contract.Capabilities`) declare."""
    return masks(seqlen_q=seqlen_q, seqlen_k=seqlen_k, causal=capabilities.causal, window=capabilities.window,
                 causal_only=capabilities.causal_only)


def edge_sides(*, seqlen_q: int, seqlen_k: int) -> list[int]:
    """The window sides at the edges of their encoding, smallest first: 0 (the diagonal only), one side
    of ``seqlen_q - 1``, ``seqlen_k - 1`` (just reaching the first key from the last row, or the last
    key from the first), ``seqlen_q``, ``seqlen_k`` and one past each (beyond every key), and past both."""
    sides = {0, seqlen_q + seqlen_k + 1}
    for length in (seqlen_q, seqlen_k):
        sides.update((max(length - 1, 0), length, length + 1))
    return sorted(sides)


def window_sides(*, seqlen_q: int, seqlen_k: int) -> st.SearchStrategy[int]:
    """A window side in ``[0, seqlen_q + seqlen_k + 1]``: 0, 1, boundary lengths, :func:`edge_sides`, or past every key."""
    largest = seqlen_q + seqlen_k + 1
    return st.one_of(
        st.sampled_from(boundary_lengths(min_value=0, max_value=largest)),
        st.integers(0, largest),
        st.sampled_from(edge_sides(seqlen_q=seqlen_q, seqlen_k=seqlen_k)),
    )


def masks(
    *, seqlen_q: int, seqlen_k: int, causal: bool = True, window: bool = True, causal_only: bool = False
) -> st.SearchStrategy[Mask]:
    """``(causal, window_size)`` for a ``seqlen_q x seqlen_k`` score matrix.

    ``causal`` and ``window`` say whether the kernel supports them; an
    unsupported feature is never drawn (docs/properties.md, "Capabilities, not skips").
    ``causal_only`` (a kernel with no non-causal path) draws causal masks only:
    plain, and with a left window when ``window``.
    """
    check_int("seqlen_q", seqlen_q, min_value=0)
    check_int("seqlen_k", seqlen_k, min_value=0)
    check_bool("causal", causal)
    check_bool("window", window)
    check_bool("causal_only", causal_only)
    sides = window_sides(seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    if causal_only:
        if not causal:
            raise UsageError("causal_only=True and causal=False: a causal-only kernel runs causal masks; allow them")
        return st.one_of([CAUSAL_MASK] + ([sides.map(lambda left: (True, (left, UNBOUNDED)))] if window else []))
    kinds: list[st.SearchStrategy[Mask]] = [st.just(NO_MASK)]
    if causal:
        kinds.append(CAUSAL_MASK)
    if window:
        kinds += [
            sides.map(lambda left: (False, (left, UNBOUNDED))),
            sides.map(lambda right: (False, (UNBOUNDED, right))),
            st.tuples(sides, sides).map(lambda pair: (False, pair)),
            sides.map(lambda left: (False, (left, 0))),
        ]
    if causal and window:
        kinds.append(sides.map(lambda left: (True, (left, UNBOUNDED))))
    if seqlen_q > seqlen_k and (causal or window):
        kinds.append(empty_row_masks(seqlen_q=seqlen_q, seqlen_k=seqlen_k, causal=causal, window=window))
    return st.one_of(kinds)


def empty_row_masks(*, seqlen_q: int, seqlen_k: int, causal: bool = True, window: bool = True) -> st.SearchStrategy[Mask]:
    """Masks under which the first rows see no key (needs ``seqlen_q > seqlen_k``).

    Causal leaves ``seqlen_q - seqlen_k`` empty rows; a window with
    ``right < seqlen_q - seqlen_k`` leaves ``seqlen_q - seqlen_k - right``.
    """
    check_int("seqlen_k", seqlen_k, min_value=0)
    check_int("seqlen_q", seqlen_q, min_value=seqlen_k + 1)
    if not (causal or window):
        raise UsageError("causal=False and window=False: empty rows need a causal mask or a window; allow one")
    kinds: list[st.SearchStrategy[Mask]] = []
    if causal:
        kinds.append(CAUSAL_MASK)
    if window:
        lefts = st.one_of(st.just(UNBOUNDED), window_sides(seqlen_q=seqlen_q, seqlen_k=seqlen_k))
        rights = st.integers(0, seqlen_q - seqlen_k - 1)
        kinds.append(st.tuples(lefts, rights).map(lambda pair: (False, pair)))
    return st.one_of(kinds)


def rows_without_keys(seqlen_q: int, seqlen_k: int, mask: Mask) -> int:
    """How many query rows see no key under ``mask``."""
    causal, window_size = mask
    visible = visible_mask(seqlen_q, seqlen_k, causal=causal, window_size=window_size)
    return int((~visible.any(dim=1)).sum()) if seqlen_k else seqlen_q
