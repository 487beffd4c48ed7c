"""A kernel that kills the process, as PyTorch's cuDNN SDPA backward does on an H100 (docs/targets.md).

:data:`ABORTS_ON_HEAD_DIM_40` is the ``reference`` kernel (head dims 32 and
40 only) whose ``backward`` calls :func:`os.abort` on a case with head_dim
40: no exception, no ``finally``, the process ends on SIGABRT.  A verifier
cannot report it as a failure from inside; it must still name the case
(``fa2-verify run`` by announcing each case on stderr, the property suite by
its in-flight record, docs/properties.md, "A kernel that kills the process").

Loadable as ``tests.crashing:ABORTS_ON_HEAD_DIM_40``.
"""

from __future__ import annotations

import dataclasses
import os

from fa2_verify.kernels.reference import DEFERRED

#: The head dim on which the backward aborts.
FATAL_HEAD_DIM = 40


class AbortsOnHeadDim:
    """``reference`` whose ``backward`` aborts the process on ``head_dim == fatal_head_dim``."""

    def __init__(self, fatal_head_dim: int):
        self.fatal_head_dim = fatal_head_dim
        self.capabilities = dataclasses.replace(DEFERRED.capabilities, head_dims=(32, fatal_head_dim))

    def forward(self, q, k, v, **options):
        return DEFERRED.forward(q, k, v, **options)

    def backward(self, dout, q, k, v, out, lse, **options):
        if q.shape[-1] == self.fatal_head_dim:
            os.abort()
        return DEFERRED.backward(dout, q, k, v, out, lse, **options)


ABORTS_ON_HEAD_DIM_40 = AbortsOnHeadDim(FATAL_HEAD_DIM)
