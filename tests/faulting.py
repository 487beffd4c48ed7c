"""Kernels that fault their device, or hang, on head_dim 40, simulated on the CPU.

:data:`FAULTS_ON_HEAD_DIM_40` is the ``reference`` kernel (head dims 32 and
40) whose ``forward`` raises the error a CUDA context raises after an illegal
memory access on a case with head_dim 40, and from then on raises it in every
call of the process, whatever the case, as a lost context does; a fresh
process runs it as the reference (docs/design.md, "A kernel that faults the
device").  :data:`HANGS_ON_HEAD_DIM_40` sleeps in ``forward`` there instead, as
a hung GPU kernel never returns (the per-call watchdog, :mod:`verify.watchdog`).

Loadable as ``tests.faulting:FAULTS_ON_HEAD_DIM_40`` and ``tests.faulting:HANGS_ON_HEAD_DIM_40``.
"""

from __future__ import annotations

import dataclasses
import time

from fa2_verify.kernels.reference import DEFERRED

#: The head dim on which the kernels fault or hang.
FATAL_HEAD_DIM = 40
#: The error a CUDA context raises from a kernel's illegal address on.
FAULT = "CUDA error: an illegal memory access was encountered"

#: The fault this process's simulated device has met (empty while it works).
_lost: list[str] = []


class FaultsOnHeadDim:
    """``reference`` whose ``forward`` on ``head_dim == 40`` faults (``hang``: sleeps an hour)."""

    capabilities = dataclasses.replace(DEFERRED.capabilities, head_dims=(32, FATAL_HEAD_DIM))

    def __init__(self, hang: bool) -> None:
        self.hang = hang

    def _device(self, q) -> None:
        if q.shape[-1] == FATAL_HEAD_DIM:
            if self.hang:
                time.sleep(3600)
            _lost.append(FAULT)
        if _lost:
            raise RuntimeError(f"{_lost[0]}\nCUDA kernel errors might be asynchronously reported")

    def forward(self, q, k, v, **options):
        self._device(q)
        return DEFERRED.forward(q, k, v, **options)

    def backward(self, dout, q, k, v, out, lse, **options):
        self._device(q)
        return DEFERRED.backward(dout, q, k, v, out, lse, **options)


FAULTS_ON_HEAD_DIM_40 = FaultsOnHeadDim(hang=False)
HANGS_ON_HEAD_DIM_40 = FaultsOnHeadDim(hang=True)
