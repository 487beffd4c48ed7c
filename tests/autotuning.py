"""A kernel that "autotunes" per shape class, as a Triton ``@autotune`` keyed on the lengths and head dim does.

:data:`AUTOTUNES` is the ``reference`` kernel that sleeps :data:`TUNE_SECONDS`
the first time this process calls it with a shape class
(:func:`properties.shape_classes.shape_class` of its tensors and mask), and
appends that class to the file :data:`LOG_ENV` names, one JSON line.
:data:`AUTOTUNES_OUT_OFF` does the same and returns ``out`` scaled by
``1 + 2^-4`` (a value bug; LSE and the gradients as ``reference``'s).

Loadable as ``tests.autotuning:AUTOTUNES`` and ``tests.autotuning:AUTOTUNES_OUT_OFF``.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

from fa2_verify.core.atomic import append_line
from fa2_verify.core.contract import UNBOUNDED
from fa2_verify.kernels.reference import DEFERRED
from fa2_verify.properties.shape_classes import bucket

#: The environment variable naming the file of compiled shape classes.
LOG_ENV = "FA2_TEST_AUTOTUNE_LOG"

#: Seconds the first call of each shape class takes.
TUNE_SECONDS = 0.5


class AutotunesPerShape:
    """``reference``, tuned once per shape class per process; ``out`` times ``out_scale``."""

    def __init__(self, out_scale: float = 1.0):
        self.capabilities = DEFERRED.capabilities
        self.out_scale = out_scale
        self.tuned: set[tuple] = set()

    def _tune(self, q, k, causal: bool, window_size) -> None:
        kind = "window" if tuple(window_size) != (UNBOUNDED, UNBOUNDED) else "causal" if causal else "none"
        key = (str(q.dtype).removeprefix("torch."), q.shape[-1], kind, bucket(q.shape[1]), bucket(k.shape[1]))
        if key not in self.tuned:
            time.sleep(TUNE_SECONDS)
            self.tuned.add(key)
            if LOG_ENV in os.environ:
                append_line(pathlib.Path(os.environ[LOG_ENV]), json.dumps(key), sync=False)

    def forward(self, q, k, v, *, causal=False, window_size=(UNBOUNDED, UNBOUNDED), **options):
        self._tune(q, k, causal, window_size)
        out, lse = DEFERRED.forward(q, k, v, causal=causal, window_size=window_size, **options)
        return out * self.out_scale, lse

    def backward(self, dout, q, k, v, out, lse, *, causal=False, window_size=(UNBOUNDED, UNBOUNDED), **options):
        self._tune(q, k, causal, window_size)
        return DEFERRED.backward(dout, q, k, v, out, lse, causal=causal, window_size=window_size, **options)


AUTOTUNES = AutotunesPerShape()
AUTOTUNES_OUT_OFF = AutotunesPerShape(out_scale=1 + 2**-4)
