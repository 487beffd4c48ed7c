"""Blocks of query rows for a masked attention evaluated a block at a time over the keys its rows see.

Query ``i`` sees keys ``first[i]..last[i]`` (:func:`core.case.CaseSpec.visible_ranges`),
both never decreasing with ``i``, so a block of consecutive rows
``start..stop-1`` spans keys ``first[start]..last[stop-1]``; under the
contract's masks the rows that see a key form one range, and :func:`runs`
splits any other ranges into runs of rows that see a key or none.  Its ``rows x keys`` scores cost the
arithmetic of those scores plus a fixed cost per block (kernel launches, the
host's work between them), counted in scores: :data:`OVERHEAD_ELEMENTS`.
:func:`plan` grows each block, greedily, while its scores stay within a
budget and its cost per *visible* score still falls.  So a causal head's
early blocks, over few keys, hold many rows (the budget bounds the later
ones), a sliding window's blocks grow until the hidden scores on their sides
outweigh a block's fixed cost, and an unmasked head takes blocks of
``budget / seqlen_k`` rows.  The float64 golden (:mod:`golden.fast`) and the
comparison's blocked passes (:mod:`verify.error_model`, :mod:`verify.lowprec`,
:mod:`verify.model_kernel`) share this plan; the comparison's passes mask a
block only on the column bands some of its rows do not see (:class:`BlockMask`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

#: The fixed cost of one row block in scores of arithmetic, per device type: about 4 ms of host time per block
#: (its kernel launches) against 0.45 ns of GPU time per score in a profile of the float64 golden on an H200,
#: and about 6 ms against 100 ns per score on one CPU core.
OVERHEAD_ELEMENTS = {"cpu": 2**16, "cuda": 2**23}


def overhead_elements(device: torch.device | str) -> int:
    """:data:`OVERHEAD_ELEMENTS` of ``device``'s type (a GPU's for any accelerator)."""
    return OVERHEAD_ELEMENTS.get(torch.device(device).type, OVERHEAD_ELEMENTS["cuda"])


def seen_rows(first: np.ndarray, last: np.ndarray) -> range:
    """The query rows from the first to the last that sees a key (empty when none does)."""
    nonempty = np.flatnonzero(first <= last)
    return range(int(nonempty[0]), int(nonempty[-1]) + 1) if len(nonempty) else range(0)


def runs(first: np.ndarray, last: np.ndarray) -> list[tuple[range, bool]]:
    """The rows as maximal runs of consecutive rows that all see a key (``True``) or all see none (``False``),
    in order."""
    sees = first <= last
    edges = [0, *(np.flatnonzero(sees[1:] != sees[:-1]) + 1).tolist(), len(sees)]
    return [(range(start, stop), bool(sees[start])) for start, stop in zip(edges, edges[1:]) if stop > start]


def plan(first: np.ndarray, last: np.ndarray, budget: int, overhead: int, min_width: int = 1) -> list[range]:
    """Consecutive row ranges covering :func:`seen_rows`, each as large as keeps ``rows x max(keys, min_width)``
    within ``budget`` while ``(overhead + rows x keys) / visible`` (its cost per visible score) still falls, and
    at least one row (the module docstring).  ``min_width`` counts a block's (rows x head_dim) tensors where they
    outgrow its scores."""
    visible = np.concatenate(([0], np.cumsum(np.maximum(last - first + 1, 0))))

    def elements(start: int, stop: int) -> int:
        return (stop - start) * max(min_width, int(last[stop - 1]) + 1 - int(first[start]))

    def cost(start: int, stop: int) -> float:
        return (overhead + elements(start, stop)) / max(1, int(visible[stop] - visible[start]))

    def fits(start: int, stop: int) -> bool:
        return elements(start, stop) <= budget and cost(start, stop) <= cost(start, stop - 1)

    seen = seen_rows(first, last)
    result = []
    start = seen.start
    while start < seen.stop:
        low, high = start + 1, seen.stop  # the largest stop that fits (a binary search), at least one row
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(start, middle) else (low, middle - 1)
        result.append(range(start, low))
        start = low
    return result


@dataclasses.dataclass(frozen=True)
class BlockMask:
    """The mask of one row block over its key span, as column bands: ``full`` (local key indices) is seen by
    every row of the block and needs no mask; each of ``bands`` is seen by only some rows, ``visible[k]``
    (rows x band) saying which.  A block of rows that all see every key of their span has no band, so the
    bounds of an unmasked case never form a mask; a causal or sliding-window block has its partial columns in
    two narrow bands beside the diagonal(s)."""

    full: slice
    bands: tuple[slice, ...]
    visible: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, rows: slice, keys: slice, first: torch.Tensor, last: torch.Tensor,
           first_host: torch.Tensor, last_host: torch.Tensor) -> "BlockMask":
        """The bands of block ``(rows, keys)`` (:func:`verify.error_model.row_blocks`), from the ranges on the
        host (no device sync) and, for the bands' masks, on the device."""
        span = keys.stop - keys.start
        lo, hi = (int(first_host[rows].max()), int(last_host[rows].min())) if span else (0, -1)
        # a row that sees no key has first > last, so then lo > hi: the whole span is one band
        full = slice(lo - keys.start, hi + 1 - keys.start) if lo <= hi else slice(0, 0)
        edges = [slice(0, full.start), slice(full.stop, span)] if lo <= hi else [slice(0, span)]
        bands = tuple(band for band in edges if band.stop > band.start)
        visible = []
        for band in bands:
            index = torch.arange(keys.start + band.start, keys.start + band.stop, device=first.device)
            visible.append((index >= first[rows, None]) & (index <= last[rows, None]))
        return cls(full, bands, tuple(visible))

    def mask_(self, tensor: torch.Tensor, value: float = 0.0) -> torch.Tensor:
        """``tensor`` (..., rows, keys) with its elements outside the mask set to ``value``, in place."""
        for band, visible in zip(self.bands, self.visible):
            tensor[..., band].masked_fill_(~visible, value)
        return tensor

    def row_max(self, values: torch.Tensor) -> torch.Tensor:
        """``max(0, max_(j visible) values_ij)`` (..., rows, 1), of ``values`` (..., rows, keys)."""
        largest = values.new_zeros(*values.shape[:-1], 1)
        if self.full.stop > self.full.start:
            largest = torch.maximum(largest, values[..., self.full].amax(-1, keepdim=True))
        for band, visible in zip(self.bands, self.visible):
            largest = torch.maximum(largest, values[..., band].masked_fill(~visible, 0.0).amax(-1, keepdim=True))
        return largest

    def key_sums(self, values: torch.Tensor) -> torch.Tensor:
        """``sum_(j visible from i) values_jc`` (C, rows, d), of ``values`` (C, keys, d)."""
        total = values[:, self.full].sum(-2, keepdim=True)
        for band, visible in zip(self.bands, self.visible):
            total = total + visible.to(values.dtype) @ values[:, band]
        return total

    def row_sums(self, values: torch.Tensor, span: int) -> torch.Tensor:
        """``sum_(i that sees j) values_ic`` (C, keys, d) over a span of ``span`` keys, of ``values`` (C, rows, d)."""
        total = values.new_zeros(values.shape[0], span, values.shape[-1])
        total[:, self.full] = values.sum(-2, keepdim=True)
        for band, visible in zip(self.bands, self.visible):
            total[:, band] = visible.to(values.dtype).mT @ values
        return total
