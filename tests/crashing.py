"""Kernels that end the process, as PyTorch's cuDNN SDPA backward does on an H100 (docs/targets.md).

:data:`ABORTS_ON_HEAD_DIM_40` is the ``reference`` kernel (head dims 32 and
40 only) whose ``backward`` calls :func:`os.abort` on a case with head_dim
40: no exception, no ``finally``, the process ends on SIGABRT.  A verifier
cannot report it as a failure from inside; it must still name the case
(``fa2-verify run`` by announcing each case on stderr, the property suite by
its in-flight record, docs/properties.md, "A kernel that kills the process").
:data:`EXITS_0_ON_HEAD_DIM_40` ends the process there with status 0 instead,
through the C library's ``_exit`` (a native library's ``exit(0)``, which no
stand-in for ``os._exit`` sees): the exit status alone says nothing failed.

Loadable as ``tests.crashing:ABORTS_ON_HEAD_DIM_40`` and ``tests.crashing:EXITS_0_ON_HEAD_DIM_40``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import Callable

from fa2_verify.kernels.reference import DEFERRED

#: The head dim on which the backward aborts.
FATAL_HEAD_DIM = 40


def exit_0_in_c() -> None:
    """End the process with status 0 through the C library's ``_exit``: no Python code runs on the way."""
    ctypes.CDLL(None)._exit(0)


class DiesOnHeadDim:
    """``reference`` whose ``backward`` calls ``die`` (ending the process) on ``head_dim == fatal_head_dim``."""

    def __init__(self, fatal_head_dim: int, die: Callable[[], None]):
        self.fatal_head_dim = fatal_head_dim
        self.die = die
        self.capabilities = dataclasses.replace(DEFERRED.capabilities, head_dims=(32, fatal_head_dim))

    def forward(self, q, k, v, **options):
        return DEFERRED.forward(q, k, v, **options)

    def backward(self, dout, q, k, v, out, lse, **options):
        if q.shape[-1] == self.fatal_head_dim:
            self.die()
        return DEFERRED.backward(dout, q, k, v, out, lse, **options)


ABORTS_ON_HEAD_DIM_40 = DiesOnHeadDim(FATAL_HEAD_DIM, os.abort)
EXITS_0_ON_HEAD_DIM_40 = DiesOnHeadDim(FATAL_HEAD_DIM, exit_0_in_c)
