"""A kernel that faults its device: the sticky error recognised, and the process marked as unable to go on.

A GPU kernel that reads or writes an illegal address (or trips a device-side
assert, a misaligned access, an illegal instruction) does not raise where it
runs: CUDA reports the error at a later call, and the error is sticky: the
context is lost, and every later call of the process raises it, whatever it
runs.  Each entry-point call therefore ends with a synchronize inside the
user-code boundary (:mod:`verify.kernel_call`), so the error surfaces in the
call that caused it; :func:`is_device_fault` tells it from an ordinary error
of the kernel by its text (PyTorch raises ``torch.AcceleratorError``, a
``RuntimeError``, older versions the ``RuntimeError`` itself), and
:func:`record` marks this process: :func:`recorded` is then the first fault,
which the case loop (:mod:`verify.continuation`) and the property suite
(:mod:`properties.verdicts`) read to stop using the device.  The mark is never
cleared: only a new process has a working device again.
"""

from __future__ import annotations

#: What the message of a sticky device error contains: the CUDA errors after which a context cannot run more.
FAULT_MARKERS: tuple[str, ...] = (
    "CUDA error: an illegal memory access",
    "device-side assert",
    "misaligned address",
    "unspecified launch failure",
    "an illegal instruction",
)

#: The faults recorded in this process (the first is the one that matters).
_recorded: list[str] = []


def is_device_fault(error: BaseException) -> bool:
    """Whether ``error`` is a sticky device error: a ``RuntimeError`` (``torch.AcceleratorError`` included)
    whose message contains one of :data:`FAULT_MARKERS`."""
    return isinstance(error, RuntimeError) and any(marker in str(error) for marker in FAULT_MARKERS)


def record(fault: str) -> None:
    """Mark this process's device as lost to ``fault`` (one line: which call faulted, and the error)."""
    _recorded.append(fault)


def recorded() -> str | None:
    """The first fault recorded in this process, or ``None`` while its device works."""
    return _recorded[0] if _recorded else None
