"""Degraded copies of correct kernels, for showing that the check and the gate fail them.

:class:`ScaledOutError` wraps a kernel and, when ``degrade`` is on, returns
``out' = e + factor (out - e)`` rounded to the dtype, with ``e`` the float64 attention
of :mod:`tests.naive`: the error of ``out`` grows ``factor`` times (2 for
:data:`REFERENCE`, :data:`TRITON`, :data:`TORCH_FLASH`) while the kernel name,
capabilities and the other outputs' code stay the same.  ``degrade`` starts
from the environment variable ``FA2_DEGRADE_OUT=1`` so that the same target
name can record a baseline and then be gated degraded from the command line
(e.g. on a GPU: ``fa2-verify baseline --kernel tests.degraded:TRITON ...``,
then ``FA2_DEGRADE_OUT=1 fa2-verify gate --kernel tests.degraded:TRITON ...``).

:class:`ScaleInBfloat16` is the deliberate error the tests of a bundled kernel
show :func:`fa2_verify.verify.check.check_case` failing: the same kernel handed
its ``softmax_scale`` rounded to bfloat16.
"""

from __future__ import annotations

import functools
import os

import torch

from tests.naive import attention
from fa2_verify.verify.registry import load_kernel


class ScaledOutError:
    """``kernel_name`` with the error of ``out`` multiplied by ``factor`` while ``degrade`` is on."""

    def __init__(self, kernel_name: str, factor: float = 2.0):
        self.kernel_name = kernel_name
        self.factor = factor
        self.degrade = os.environ.get("FA2_DEGRADE_OUT") == "1"

    @functools.cached_property
    def kernel(self):
        return load_kernel(self.kernel_name)

    @property
    def capabilities(self):
        return self.kernel.capabilities

    def unavailable_reason(self):
        return self.kernel.unavailable_reason()

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1)):
        out, lse = self.kernel.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        if not self.degrade:
            return out, lse
        expected, _ = attention(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        return (expected + self.factor * (out.double() - expected)).to(out.dtype), lse

    def backward(self, *args, **kwargs):
        return self.kernel.backward(*args, **kwargs)


def in_bfloat16(value: float) -> float:
    """``value`` rounded to bfloat16 (8 significant bits, round to nearest even)."""
    return float(torch.tensor(value, dtype=torch.float64).to(torch.bfloat16))


class ScaleInBfloat16:
    """``target`` computing with ``softmax_scale`` rounded to bfloat16 in forward and backward, as a
    kernel that keeps the scale in a 16-bit register would.

    With the tests' scale 0.3 every score is ``in_bfloat16(0.3) / 0.3 - 1 = 2.6e-3`` relative too
    large, so each finite ``lse`` moves by about ``2.6e-3 * sum_j P_ij S_ij`` (``d lse / d scale``),
    where the error model allows a few float32 roundoffs of its terms (docs/error-model.md, eq. 3).
    """

    def __init__(self, target):
        self.target = target
        self.capabilities = target.capabilities

    def forward(self, q, k, v, *, softmax_scale, **mask):
        return self.target.forward(q, k, v, softmax_scale=in_bfloat16(softmax_scale), **mask)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, **options):
        return self.target.backward(dout, q, k, v, out, lse, softmax_scale=in_bfloat16(softmax_scale), **options)


REFERENCE = ScaledOutError("reference")
TRITON = ScaledOutError("triton")
TORCH_FLASH = ScaledOutError("torch-flash")
