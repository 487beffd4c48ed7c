"""A bounds check for Triton kernels run by the CPU interpreter (``TRITON_INTERPRET=1``).

On a GPU, a load just outside a tensor reads whatever lies there and goes
unnoticed, until the address falls in an unmapped page: then the CUDA
context faults ("an illegal memory access was encountered"), every later
call in the process fails, and under CUDA MPS every client process with it
(docs/properties.md, "A kernel that faults the GPU").  The interpreter runs
each ``tl.load``, ``tl.store`` and atomic as a NumPy gather or scatter over
raw addresses, so here the check is exact: under :func:`bounds_checked`,
every address a kernel touches with its mask on must lie inside one of the
tensors it was launched with, or the launch raises :class:`OutOfBounds`
naming the operation and how far outside the nearest tensor it went.  The
property suite runs under it with ``--fa2-bounds-check``.

A tensor's allowed span runs from its first to one past its last element
(strides are non-negative).  A stray access can still land inside another
argument of the same launch and go unseen; :func:`core.layouts.guarded` places a
tensor in a NaN-filled storage with a guard before and after it, so that an access
just before or after it lands in its own guard, which no launch argument covers (the
project's own checks guard their inputs: tests/triton_interpreter_checks.py).
The check patches the interpreter's ``GridExecutor`` and
``InterpreterBuilder`` (Triton 3.6 to 3.9), restored on exit.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch

from fa2_verify.core.errors import UsageError
from fa2_verify.core.layouts import storage_span

#: The interpreter's launch and memory operations the check wraps, by class.
_PATCHED = {"GridExecutor": ("__call__",),
            "InterpreterBuilder": ("create_masked_load", "create_masked_store", "create_atomic_rmw")}


class OutOfBounds(AssertionError):
    """An interpreted kernel touched memory outside every tensor it was launched with."""


def require_interpreter(flag: str) -> None:
    """``UsageError`` (one line, naming ``flag``) unless ``TRITON_INTERPRET=1``: without it no kernel runs
    in the interpreter, and the check would check nothing."""
    from fa2_verify.core.triton_passes import interpret_requested

    if not interpret_requested():
        raise UsageError(f"{flag} needs TRITON_INTERPRET=1 set before the process starts: it checks the memory "
                         "accesses of kernels that the Triton interpreter runs")


def _span(tensor: torch.Tensor) -> tuple[int, int] | None:
    """[first byte, one past the last byte) of ``tensor``'s elements, or ``None`` when it has none."""
    if tensor.numel() == 0:
        return None
    return tensor.data_ptr(), tensor.data_ptr() + storage_span(tuple(tensor.shape), tensor.stride()) * tensor.element_size()


@contextlib.contextmanager
def bounds_checked() -> Iterator[None]:
    """Within the block, interpreted kernels may touch only the elements of their tensor arguments.

    Raises ``UsageError`` (one line) when this Triton's interpreter lacks an operation it wraps.
    """
    from triton.runtime import interpreter

    for owner, names in _PATCHED.items():
        missing = [name for name in names if not hasattr(getattr(interpreter, owner, None), name)]
        if missing:
            raise UsageError(f"this Triton's interpreter has no {owner}.{missing[0]}: the bounds check cannot wrap it")

    spans: list[tuple[int, int]] = []
    executor = interpreter.GridExecutor
    builder = interpreter.InterpreterBuilder
    originals = {
        "call": executor.__call__,
        "load": builder.create_masked_load,
        "store": builder.create_masked_store,
        "atomic": builder.create_atomic_rmw,
    }

    def launch(self, *args, **kwargs):
        spans[:] = [span for arg in (*args, *kwargs.values()) if isinstance(arg, torch.Tensor)
                    if (span := _span(arg)) is not None]
        return originals["call"](self, *args, **kwargs)

    def check(operation: str, pointers, mask) -> None:
        size = np.dtype(interpreter._get_np_dtype(pointers.get_element_ty())).itemsize
        addresses = pointers.data[mask.data.astype(bool)].astype(np.int64)
        inside = np.zeros(addresses.shape, dtype=bool)
        for first, end in spans:
            inside |= (addresses >= first) & (addresses + size <= end)
        if not inside.all():
            outside = addresses[~inside]
            first_outside = int(outside[0])
            first, end = min(spans, key=lambda span: min(abs(first_outside - span[0]), abs(first_outside - span[1])))
            where = (f"{first - first_outside} bytes before" if first_outside < first
                     else f"{first_outside + size - end} bytes past the end of")
            raise OutOfBounds(f"{operation} of {outside.size} element(s) outside every tensor argument, "
                                 f"the first {where} the nearest one")

    def load(self, pointers, mask, other, *args, **kwargs):
        check("load", pointers, mask)
        return originals["load"](self, pointers, mask, other, *args, **kwargs)

    def store(self, pointers, value, mask, *args, **kwargs):
        check("store", pointers, mask)
        return originals["store"](self, pointers, value, mask, *args, **kwargs)

    def atomic(self, operation, pointers, value, mask, *args, **kwargs):
        check("atomic", pointers, mask)
        return originals["atomic"](self, operation, pointers, value, mask, *args, **kwargs)

    executor.__call__ = launch
    builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw = load, store, atomic
    try:
        yield
    finally:
        executor.__call__ = originals["call"]
        builder.create_masked_load = originals["load"]
        builder.create_masked_store = originals["store"]
        builder.create_atomic_rmw = originals["atomic"]
