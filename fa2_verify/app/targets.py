"""Resolving a kernel target: the one way every command, the property plugin and the benchmark load one.

:func:`load_target` loads a target by name (:func:`verify.registry.load_kernel`)
once per process: the plugin's checks at startup, its suite fixture and its
dtype shards, and a command's own checks, all get the same target.  A name
that fails to load is not remembered, so it fails again, with its one line,
where it is asked for next.  :func:`resolve_target` is a command's target:
loaded, its hooks called, the device checked, before any case runs.
"""

from __future__ import annotations

import functools

import torch

from fa2_verify.core.errors import DeviceUnavailable, UsageError
from fa2_verify.verify.registry import LoadedKernel, load_kernel, require_device
from fa2_verify.verify.watchdog import DEFAULT_CALL_TIMEOUT, set_call_timeout


@functools.cache
def load_target(name: str) -> LoadedKernel:
    """The target ``name`` (a bundled short name or ``module:attr``), loaded on its first request in this process."""
    return load_kernel(name)


def resolve_target(kernel_name: str, device: str, *, call_timeout: float = DEFAULT_CALL_TIMEOUT) -> LoadedKernel:
    """Load the kernel and check that it and ``device`` can run here (else a one-line error); each of its
    calls may then run ``call_timeout`` seconds (:mod:`verify.watchdog`).

    Its hooks are called here, before any case runs, so one that raises is a
    one-line :class:`~core.errors.KernelLoadError` at once.
    """
    set_call_timeout(call_timeout)
    kernel = load_target(kernel_name)
    kernel.config()
    try:
        torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device={device!r} is not a device: use cpu or cuda") from None
    require_device(device)
    reason = kernel.unavailable_reason(device)
    if reason is not None:
        raise DeviceUnavailable(f"--kernel={kernel_name} cannot run on --device={device}: {reason}")
    return kernel
