"""Kernel registry: load a target by short name or ``module:attr``.

A new bundled target is one module and one line in :data:`BUNDLED`.
Every failure to load is a :class:`~core.errors.KernelLoadError` with a
one-line message; nothing is imported until a kernel is asked for.

Importing the target and calling its hooks (``capabilities``,
``unavailable_reason()``, ``config()``) run user code: anything they raise,
``SystemExit`` and ``KeyboardInterrupt`` included (:mod:`verify.user_code`),
is a :class:`~core.errors.KernelLoadError` that names the hook, and so is a
hook that returns the wrong type.
A target's ``capabilities`` may be a :class:`~core.contract.Capabilities` or a
plain mapping of its fields (:meth:`Capabilities.from_mapping`); a bad mapping
is a one-line :class:`~core.errors.KernelLoadError` naming the field.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping

import torch

from fa2_verify.core.contract import DEVICE_TYPES, Capabilities, KernelTarget
from fa2_verify.core.errors import DeviceUnavailable, KernelLoadError, UsageError
from fa2_verify.verify import kernel_config
from fa2_verify.verify.user_code import UserCodeRaised, call_user_code

#: short name -> "module:attr" of the bundled targets.
BUNDLED: dict[str, str] = {
    "reference": "fa2_verify.kernels.reference:DEFERRED",
    "reference-eager": "fa2_verify.kernels.reference:EAGER",
    "torch-flash": "fa2_verify.kernels.torch_flash:KERNEL",
    "triton": "fa2_verify.kernels.triton_fa2:KERNEL",
    "flash-attn": "fa2_verify.kernels.flash_attn:KERNEL",
    "flash-attn-4": "fa2_verify.kernels.flash_attn_4:KERNEL",
    "sdpa-efficient": "fa2_verify.kernels.sdpa_efficient:KERNEL",
    "sdpa-cudnn": "fa2_verify.kernels.sdpa_cudnn:KERNEL",
    "flex-attention": "fa2_verify.kernels.flex_attention:KERNEL",
}


@dataclasses.dataclass(frozen=True)
class LoadedKernel:
    """A target together with the name it was asked for by; its ``capabilities`` read as the class.

    ``target`` has the contract's ``forward`` and ``capabilities`` (:func:`load_kernel` checks them); its
    optional members (:class:`~core.contract.KernelHooks`, the varlen entry points) are read with ``getattr``.
    """

    name: str
    target: KernelTarget

    def call_hook(self, hook: str, call: Callable[[], Any]) -> Any:
        """``call()``, the target's ``hook``; anything it raises is a :class:`KernelLoadError` naming the hook."""
        try:
            return call_user_code(call)
        except UserCodeRaised as raised:
            raise KernelLoadError(f"kernel {self.name!r}: {hook} raised {raised}") from raised.raised

    @property
    def capabilities(self) -> Capabilities:
        capabilities = self.call_hook("capabilities", lambda: self.target.capabilities)
        if not isinstance(capabilities, (Capabilities, Mapping)):
            raise KernelLoadError(
                f"kernel {self.name!r}: 'capabilities' is {type(capabilities).__name__}, "
                "expected core.contract.Capabilities or a mapping of its fields"
            )
        try:
            return Capabilities.from_mapping(capabilities)
        except UsageError as exc:
            raise KernelLoadError(f"kernel {self.name!r}: {exc}") from None

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.target.forward(*args, **kwargs)

    def backward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.target.backward(*args, **kwargs)

    def unavailable_reason(self, device: str | None = None) -> str | None:
        """Why this target cannot run here (on ``device`` if given), or ``None``."""
        probe = getattr(self.target, "unavailable_reason", None)
        reason = self.call_hook("unavailable_reason()", probe) if probe is not None else None
        if reason is not None and not isinstance(reason, str):
            raise KernelLoadError(
                f"kernel {self.name!r}: unavailable_reason() returned {type(reason).__name__}, expected str or None"
            )
        if reason is None and device is not None:
            device_type = torch.device(device).type
            if device_type not in self.capabilities.dtypes:
                reason = f"it does not support device={device_type}"
            else:
                reason = device_unavailable_reason(device_type)
        return reason

    def config(self) -> dict[str, Any]:
        """Settings a run records to be reproducible (block sizes, versions...), checked by
        :func:`verify.kernel_config.validate` (a one-line :class:`KernelLoadError` naming the key path)."""
        describe = getattr(self.target, "config", None)
        settings = self.call_hook("config()", describe) if describe is not None else {}
        if not isinstance(settings, Mapping):
            raise KernelLoadError(f"kernel {self.name!r}: config() returned {type(settings).__name__}, expected a dict")
        try:
            kernel_config.validate(settings)
        except KernelLoadError as exc:
            raise KernelLoadError(f"kernel {self.name!r}: {exc}") from None
        return dict(settings)


def device_unavailable_reason(device_type: str) -> str | None:
    if device_type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device is visible (torch.cuda.is_available() is False)"
    if device_type not in DEVICE_TYPES:
        return f"device={device_type} is not one fa2-verify drives (use {' or '.join(DEVICE_TYPES)})"
    return None


def require_device(device: str) -> None:
    """Raise :class:`DeviceUnavailable` if ``device`` cannot be used here."""
    reason = device_unavailable_reason(torch.device(device).type)
    if reason is not None:
        raise DeviceUnavailable(f"--device={device}: {reason}")


def load_kernel(name: str) -> LoadedKernel:
    """Resolve ``name`` (a key of :data:`BUNDLED` or ``module:attr``)."""
    spec = BUNDLED.get(name, name)
    if ":" not in spec:
        known = ", ".join(sorted(BUNDLED))
        raise KernelLoadError(f"unknown kernel {name!r}: use one of {known}, or module:attr")
    module_name, _, attr_path = spec.partition(":")
    try:
        target: Any = call_user_code(lambda: importlib.import_module(module_name))
    except UserCodeRaised as raised:
        raise KernelLoadError(f"kernel {name!r}: cannot import module {module_name!r}: {raised}") from raised.raised
    for attr in attr_path.split("."):
        try:
            target = call_user_code(lambda: getattr(target, attr), passthrough=(AttributeError,))
        except AttributeError:
            raise KernelLoadError(f"kernel {name!r}: module {module_name!r} has no attribute {attr_path!r}") from None
        except UserCodeRaised as raised:
            raise KernelLoadError(f"kernel {name!r}: reading {attr_path!r} raised {raised}") from raised.raised
    kernel = LoadedKernel(name=name, target=target)
    for required in ("forward", "capabilities"):
        if not kernel.call_hook(required, lambda: hasattr(target, required)):
            raise KernelLoadError(f"kernel {name!r}: target {spec!r} lacks {required!r}, required by the kernel contract")
    forward = kernel.call_hook("forward", lambda: target.forward)
    if not callable(forward):
        raise KernelLoadError(
            f"kernel {name!r}: 'forward' of {spec!r} is {type(forward).__name__}, not callable: the kernel contract "
            "calls forward(q, k, v, *, softmax_scale, causal, window_size)"
        )
    kernel.capabilities  # read once now, so a target whose capabilities cannot be read fails to load
    return kernel
