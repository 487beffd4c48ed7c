"""The correct kernels of other numerics (tests/variants.py) compute attention: in float64, where their
roundings vanish, they agree with the reference to a few float64 ulps, forward and backward."""

from __future__ import annotations

import pytest
import torch

from fa2_verify.kernels.reference import DEFERRED
from tests import variants

CALLS = {"causal GQA": {"causal": True}, "window": {"window_size": (9, 3)}}


@pytest.mark.parametrize("mask", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("name", variants.NAMES)
def test_each_kernel_agrees_with_the_reference_in_float64(name, mask):
    generator = torch.Generator().manual_seed(7)
    q, dout = (torch.randn(2, 37, 4, 40, dtype=torch.float64, generator=generator) for _ in range(2))
    k, v = (torch.randn(2, 70, 2, 40, dtype=torch.float64, generator=generator) for _ in range(2))
    kernel = getattr(variants, name)
    expected_out, expected_lse = DEFERRED.forward(q, k, v, softmax_scale=0.15, **mask)
    out, lse = kernel.forward(q, k, v, softmax_scale=0.15, **mask)
    expected = DEFERRED.backward(dout, q, k, v, expected_out, expected_lse, softmax_scale=0.15, **mask)
    grads = kernel.backward(dout, q, k, v, out, lse, softmax_scale=0.15, **mask)
    for actual, wanted in zip((out, lse, *grads), (expected_out, expected_lse, *expected)):
        torch.testing.assert_close(actual, wanted, rtol=1e-12, atol=1e-12)
