"""The comparison's row blocks (verify.error_model.row_blocks over core.row_blocks.plan): every row once."""

from __future__ import annotations

import pytest
import torch

from fa2_verify.core.case import CaseSpec
from fa2_verify.verify import error_model

MASKS = {
    "causal-sq>sk (rows that see no key first)": (300, 120, {"causal": True}),
    "window": (300, 280, {"window_size": (40, 7)}),
    "diagonal, top-left (rows past the keys see none)": (50, 10, {"window_size": (0, 0),
                                                                 "causal_alignment": "top_left"}),
    "full": (64, 250, {}),
}


@pytest.mark.parametrize("work", [1, 700, 4096, 10**6])
@pytest.mark.parametrize("name", list(MASKS))
def test_row_blocks_cover_every_row_once_in_order_with_the_keys_it_sees(name, work):
    """Blocks cover the rows 0..seqlen_q-1 once, in increasing order; each block's span holds every key its
    rows see, a block over keys holds only rows that see one, the others lie in blocks over no key, and a block of several rows stays within
    ``work`` elements of rows x max(keys, head_dim)."""
    seqlen_q, seqlen_k, mask = MASKS[name]
    spec = CaseSpec(**{"batch": 1, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "heads_q": 1, "heads_kv": 1,
                       "head_dim": 8, "dtype": "float16", **mask})
    first, last = spec.visible_ranges("cpu")
    blocks = error_model.row_blocks(first, last, work, spec.head_dim)
    assert [row for rows, _ in blocks for row in range(rows.start, rows.stop)] == list(range(spec.seqlen_q))
    for rows, keys in blocks:
        sees = first[rows] <= last[rows]
        assert bool((first[rows][sees] >= keys.start).all()) and bool((last[rows][sees] < keys.stop).all())
        if keys.stop > keys.start:
            assert bool(sees.all())  # a block over keys holds only rows that see one
        else:
            assert not bool(sees.any())
        width = max(keys.stop - keys.start, spec.head_dim)
        assert rows.stop - rows.start == 1 or (rows.stop - rows.start) * width <= work


def test_rows_that_see_no_key_between_others_get_blocks_of_their_own():
    """Ranges that never decrease may leave a row with no key between rows with keys (first 5, last 3): it is
    put in a block over no key, so a block over keys needs no care for rows that see none."""
    first, last = torch.tensor([0, 0, 5, 5, 6]), torch.tensor([1, 2, 3, 6, 7])
    blocks = error_model.row_blocks(first, last, 10**6, 1)
    assert [(rows.start, rows.stop, keys.start, keys.stop) for rows, keys in blocks] == [
        (0, 2, 0, 3), (2, 3, 0, 0), (3, 5, 5, 8)]


def test_a_narrow_window_at_65537_tokens_takes_few_blocks():
    """The scale set's 65,537-token window of 4,096 keys: 22 blocks per kv head within CUDA's budget and
    block overhead, where blocks of ``budget / seqlen_k`` rows made 129."""
    from fa2_verify.core import row_blocks

    spec = CaseSpec(batch=1, seqlen_q=65537, seqlen_k=65537, heads_q=4, heads_kv=4, head_dim=128, dtype="bfloat16",
                    window_size=(4096, 0))
    first, last = spec.visible_ranges("cpu")
    first_host, last_host = first.numpy(), last.numpy()
    plan = row_blocks.plan(first_host, last_host, error_model.WORK_ELEMENTS["cuda"],
                           row_blocks.OVERHEAD_ELEMENTS["cuda"], spec.head_dim)
    assert len(plan) == 22
    assert torch.equal(torch.tensor([r.start for r in plan[1:]]), torch.tensor([r.stop for r in plan[:-1]]))
