"""A kernel with a stray read, for ``--fa2-bounds-check`` (tests/test_plugin.py).

``KERNEL`` is the reference forward (no backward), after a small Triton kernel
that copies the start of q from one element too early: a read one element
before its input.  What it reads never reaches the outputs, so every property
passes unless the bounds check is on, as with a kernel whose masked-off row
lies before its tensor (lab/benchmarks-history.md, "The suite after the
search changes").  The copy's source is :func:`~fa2_verify.core.layouts.guarded`,
so the stray element lies in its guard, outside every argument.  Runs under
``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from fa2_verify.kernels.reference import DEFERRED
from fa2_verify.core.layouts import guarded

#: Elements of q the stray copy reads (from one before the first).
COPIED = 16


@triton.jit
def _copy_from_one_before(X, Y, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(Y + offsets, tl.load(X + offsets - 1, mask=offsets < n), mask=offsets < n)


class StrayRead:
    """The reference forward after a stray read of one element before q."""

    capabilities = dataclasses.replace(DEFERRED.capabilities, backward=False, deterministic_backward=False)

    def forward(self, q, k, v, **options):
        source = guarded(q.reshape(-1)[:COPIED].contiguous())
        if source.numel():
            _copy_from_one_before[(1,)](source, torch.empty_like(source), source.numel(), BLOCK=COPIED)
        return DEFERRED.forward(q, k, v, **options)


KERNEL = StrayRead()
