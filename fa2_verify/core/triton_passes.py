"""The rules shared by the float64 Triton passes that replace a block's elementwise torch work
(:mod:`golden.passes`, :mod:`verify.bound_weights`): where they run, on which device, with which scalars.

* By default they serve CUDA tensors only, where the ``triton`` package is installed and ``TRITON_INTERPRET``
  is off (:func:`serve_by_default`; the interpreter runs them on the CPU, which the tests ask for explicitly).
* A trial on the device decides the rest (:func:`trial_runs`): Triton builds each kernel's launcher with the
  host's C compiler, which a GPU image may lack, and there the torch evaluation serves (the same values,
  slower) rather than every case failing.
* Launches go to the tensors' own device (:func:`on_device_of`): a case on ``cuda:1`` in a process whose
  current device is ``cuda:0``.
* Scalars travel as float64 tensors made once per device and values (:func:`float64_scalars`): a compiled
  kernel takes a Python float as float32, and a copy from pageable host memory at every block waits for the
  device.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Callable

import torch

#: Values of TRITON_INTERPRET that Triton reads as "on".
_TRUE_VALUES = frozenset({"1", "true", "yes", "on", "y"})


def interpret_requested() -> bool:
    """``True`` when ``TRITON_INTERPRET`` is set to a value Triton reads as on."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE_VALUES


def serve_by_default(device: torch.device) -> bool:
    """Whether the passes may serve ``device`` unless asked otherwise: CUDA, Triton installed, not interpreting."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None and not interpret_requested()


@functools.cache
def trial_runs(trial: Callable[[torch.device], object], device: torch.device) -> bool:
    """Whether ``trial(device)`` (a launch of every pass on :func:`trial_block`) builds and runs, synchronised on
    CUDA; tried once per trial and device."""
    try:
        trial(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception:  # any failure to build or launch leaves the torch evaluation
        return False
    return True


def trial_block(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A trial's inputs on ``device``: a block of 4 rows and 8 keys of one pair, zeros (1, 1, 4, 8) float64, the
    rows' key ranges (4,) int64 and a row quantity (1, 1, 4) float64."""
    return (torch.zeros(1, 1, 4, 8, dtype=torch.float64, device=device),
            torch.zeros(4, dtype=torch.int64, device=device),
            torch.zeros(1, 1, 4, dtype=torch.float64, device=device))


def on_device_of(tensor: torch.Tensor):
    """A context that makes ``tensor``'s CUDA device the current one (Triton launches on the current device)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


@functools.lru_cache(maxsize=64)
def float64_scalars(device: torch.device, *values: float) -> torch.Tensor:
    """``values`` as a float64 tensor on ``device``, made once."""
    return torch.tensor(values, dtype=torch.float64, device=device)
