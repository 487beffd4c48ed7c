"""Blocks of query rows for a masked attention evaluated a block at a time over the keys its rows see.

Query ``i`` sees keys ``first[i]..last[i]`` (:func:`core.case.CaseSpec.visible_ranges`),
both never decreasing with ``i``, so the rows that see a key form one range
and a block of consecutive rows ``start..stop-1`` spans keys
``first[start]..last[stop-1]``.  Its ``rows x keys`` scores cost the
arithmetic of those scores plus a fixed cost per block (kernel launches, the
host's work between them), counted in scores: :data:`OVERHEAD_ELEMENTS`.
:func:`plan` grows each block, greedily, while its scores stay within a
budget and its cost per *visible* score still falls.  So a causal head's
early blocks, over few keys, hold many rows (the budget bounds the later
ones), a sliding window's blocks grow until the hidden scores on their sides
outweigh a block's fixed cost, and an unmasked head takes blocks of
``budget / seqlen_k`` rows.  The float64 golden (:mod:`golden.fast`) and the
comparison's blocked passes (:mod:`verify.error_model`, :mod:`verify.lowprec`,
:mod:`verify.model_kernel`) share this plan.
"""

from __future__ import annotations

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
