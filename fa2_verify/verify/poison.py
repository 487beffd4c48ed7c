"""Poison the memory a kernel allocates its outputs from, so an unwritten element reads NaN.

A kernel that forgets to write part of an output (a tail block, a masked row)
returns whatever the allocator handed it; that is often zero, and zero is the
right answer for a masked row, so the bug hides.  Under :func:`poisoned`
every freshly allocated floating-point tensor starts as NaN instead, and NaN
never passes a comparison (:mod:`verify.metrics`):

* on every device, ``torch.utils.deterministic.fill_uninitialized_memory`` is
  switched on together with ``torch.use_deterministic_algorithms(True,
  warn_only=True)``; PyTorch then fills ``torch.empty``/``empty_like``/
  ``new_empty`` results with NaN (integers with their largest value), on CPU as
  on CUDA;
* on CUDA, NaN-filled blocks of the outputs' sizes are also allocated and freed
  back to the caching allocator first, so a kernel that takes memory through a
  path those flags do not cover (a custom extension's own allocation through
  the caching allocator) most likely receives one of the poisoned blocks.

The previous settings are restored on exit, whatever happens inside.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Iterable, Iterator

import torch

#: PyTorch's warnings for ops without a deterministic implementation (generic,
#: and cuBLAS without CUBLAS_WORKSPACE_CONFIG): expected while the deterministic
#: flag is on only to get NaN-filled allocations.
_NONDETERMINISTIC_WARNINGS = (
    r".*does not have a deterministic implementation.*",
    r".*Deterministic behavior was enabled with either.*",
)


def _prime_cuda_allocator(device: torch.device, outputs: Iterable[tuple[tuple[int, ...], torch.dtype]]) -> None:
    """Allocate a NaN-filled block per output and return it to the caching allocator."""
    blocks = [
        torch.full((math.prod(shape),), math.nan, dtype=dtype, device=device)
        for shape, dtype in outputs
        if dtype.is_floating_point and math.prod(shape) > 0
    ]
    torch.cuda.synchronize(device)
    del blocks


@contextlib.contextmanager
def poisoned(
    device: torch.device | str, outputs: Iterable[tuple[tuple[int, ...], torch.dtype]] = ()
) -> Iterator[None]:
    """Within the block, new tensors on ``device`` start as NaN (see the module docstring).

    ``outputs`` lists the (shape, dtype) of the tensors the kernel call is
    expected to return; on CUDA, blocks of those sizes are poisoned first.
    """
    device = torch.device(device)
    if device.type == "cuda":
        _prime_cuda_allocator(device, outputs)
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]  # set on the module's class
    try:
        with warnings.catch_warnings():
            for message in _NONDETERMINISTIC_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=UserWarning)
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
