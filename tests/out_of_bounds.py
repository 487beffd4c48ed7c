"""A kernel that faults a GPU on one case shape only, for lab/device/device-fault.sh (not run on the CPU).

``KERNEL`` is the ``reference`` kernel (head dims 32 and 40) whose forward,
on a case with head_dim 40, first launches a small Triton kernel that stores
a block far past the end of a 16-element tensor: on a GPU the address is
unmapped, the launch faults with "an illegal memory access was encountered",
and the CUDA context is lost for the rest of the process.  Every other case
runs as the reference does.  Loadable as ``tests.out_of_bounds:KERNEL``.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from fa2_verify.kernels.reference import DEFERRED

#: The head dim on which the forward stores out of bounds.
FATAL_HEAD_DIM = 40
#: How far past its tensor the store lands, in elements (float32: 64 TiB, past any mapping).
FAR = 1 << 44


@triton.jit
def _store_far_past(Y, far, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(Y + far + offsets, tl.zeros([BLOCK], dtype=tl.float32))


class StoresPastItsTensor:
    """The reference, after an out-of-bounds store on head_dim 40."""

    capabilities = dataclasses.replace(DEFERRED.capabilities, head_dims=(32, FATAL_HEAD_DIM))

    def forward(self, q, k, v, **options):
        if q.shape[-1] == FATAL_HEAD_DIM:
            _store_far_past[(1,)](torch.empty(16, device=q.device, dtype=torch.float32), FAR, BLOCK=16)
        return DEFERRED.forward(q, k, v, **options)

    def backward(self, dout, q, k, v, out, lse, **options):
        return DEFERRED.backward(dout, q, k, v, out, lse, **options)


KERNEL = StoresPastItsTensor()
