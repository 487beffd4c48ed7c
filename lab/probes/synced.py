"""Wall seconds of one call, the device synchronised before and after: the probes' timer."""

from __future__ import annotations

import time

import torch


def timed(device: str, function, *args, **kwargs):
    """``(function(*args, **kwargs), seconds)``, with ``torch.cuda.synchronize()`` around it on CUDA."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = function(*args, **kwargs)
    if device == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start
