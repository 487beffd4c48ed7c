"""What the Triton FA2 kernels can run on here, computed from the environment.

Triton decides at decoration time whether ``@triton.jit`` compiles for the GPU
or runs in its CPU interpreter (``TRITON_INTERPRET=1``), so the mode is fixed
when :mod:`kernels.triton_fa2.kernels` is first imported.  Until then it is read
from the environment; afterwards from what that import saw.

- No ``triton`` package: nothing runs.
- ``TRITON_INTERPRET=1``: CPU tensors, float16 and float32 only (the
  interpreter computes with NumPy, which has no bfloat16 arithmetic).
- Otherwise: CUDA tensors (float16, bfloat16, float32) when a CUDA device is
  visible.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import sys

import torch

from fa2_verify.core.contract import Capabilities
from fa2_verify.core.triton_passes import interpret_requested

#: Head dimensions with a tile shape: multiples of 8 from 32 to 256, padded in
#: the kernels to the next power of two with masked loads.
HEAD_DIMS: tuple[int, ...] = tuple(range(32, 257, 8))

CPU_DTYPES: tuple[str, ...] = ("float16", "float32")
CUDA_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")


_KERNEL_MODULE = "fa2_verify.kernels.triton_fa2.kernels"


@dataclasses.dataclass(frozen=True)
class Environment:
    """The facts that decide where the kernels run."""

    triton_installed: bool
    interpret: bool
    cuda_available: bool

    @property
    def capabilities(self) -> Capabilities:
        return _capabilities(self.triton_installed, self.interpret, self.cuda_available)

    def unavailable_reason(self) -> str | None:
        if not self.triton_installed:
            return "triton is not installed: pip install 'fa2-verify[gpu]' (or triton>=3.2)"
        if not self.interpret and not self.cuda_available:
            return (
                "no CUDA device is visible, and the CPU needs the Triton interpreter: "
                "set TRITON_INTERPRET=1 before importing kernels.triton_fa2"
            )
        return None


@functools.cache
def _capabilities(triton_installed: bool, interpret: bool, cuda_available: bool) -> Capabilities:
    """The kernels' capabilities in an environment: one validated record per environment, as every kernel call
    checks its problem against them (building it per call took a fifth of a forward call's host time)."""
    dtypes: dict[str, tuple[str, ...]] = {}
    if triton_installed and interpret:
        dtypes["cpu"] = CPU_DTYPES
    elif triton_installed and cuda_available:
        dtypes["cuda"] = CUDA_DTYPES
    notes = (
        "cpu runs only under the Triton interpreter: set TRITON_INTERPRET=1 before importing "
        "fa2_verify.kernels.triton_fa2 (float16/float32; no bfloat16 arithmetic there)",
        "head_dim is padded to the next power of two; softmax_scale must be >= 0",
    )
    return Capabilities(
        dtypes=dtypes,
        head_dims=HEAD_DIMS,
        causal=True,
        window=True,
        gqa=True,
        backward=True,
        deterministic_backward=True,
        varlen=True,
        unaligned_inputs=True,
        notes=notes,
    )


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def current() -> Environment:
    """The environment now (the interpret mode is the one the kernels were built with, once imported)."""
    module = sys.modules.get(_KERNEL_MODULE)
    interpret = module.INTERPRET if module is not None else interpret_requested()
    return Environment(
        triton_installed=_triton_installed(),
        interpret=interpret,
        cuda_available=torch.cuda.is_available(),
    )
