"""Calling a kernel under the contract: poisoned outputs, untouched inputs, checked count, shapes, dtypes and device.

Every comparison in fa2-verify (against the golden in :mod:`verify.check`,
against the kernel itself in the property suite) gets its tensors from here.
Each call runs under :func:`verify.poison.poisoned`, so an element the kernel
never writes reads NaN.  Every tensor handed to an entry point must be
bit for bit the same after the call: ``backward`` gets its own copies of the
forward's ``out`` and ``lse``, so it can neither change the forward results
that are compared nor get away with writing into them.  Anything the kernel
raises (any :class:`BaseException`, :mod:`verify.user_code`), a modified
input, or an output that breaks the contract becomes a :class:`KernelFailure`
whose message says how: a failure of the kernel, never of the harness.  An
output the kernel's capabilities declare it does not provide (``lse=False``:
:meth:`~core.contract.Capabilities.missing_outputs`) must come back as
``None`` and is left out of the outputs (and handed to ``backward`` as
``None``).  A kernel that raises :class:`~core.errors.UnsupportedCase` declines the case;
that propagates.

Each call ends with a synchronize of the case's device inside the user-code
boundary, so an asynchronous GPU error surfaces in the call that caused it;
one that loses the device (:func:`verify.device_fault.is_device_fault`) is a
:class:`DeviceFault`, recorded for the process (:func:`verify.device_fault.record`).
Each call runs under :func:`verify.watchdog.watched`: one that hangs past the
per-call limit ends the process, naming the call and its case.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, cast

import torch

from fa2_verify.core.contract import GRADIENTS, VarlenKernelTarget, dtype_name
from fa2_verify.core.case import Case, CaseSpec
from fa2_verify.core.digest import digest
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.core.layouts import to_layout
from fa2_verify.core.varlen import Packed
from fa2_verify.verify import device_fault
from fa2_verify.verify.poison import poisoned
from fa2_verify.verify.registry import LoadedKernel
from fa2_verify.verify.user_code import UserCodeRaised, call_user_code
from fa2_verify.verify.watchdog import watched

#: Output name -> (shape, dtype, description of the shape's axes).
Layouts = dict[str, tuple[tuple[int, ...], torch.dtype, str]]

_INTEGER_VIEWS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


#: What a :class:`KernelFailure`'s message says between ``<kernel>.<entry>`` and the exception the entry point raised.
RAISED = " raised "

#: What a :class:`DeviceFault`'s message says between ``<kernel>.<entry>`` and the device's error.
FAULTED = " faulted the device: "


class KernelFailure(Exception):
    """The kernel raised or broke the contract; the message says how."""


class DeviceFault(KernelFailure):
    """The kernel's call lost the device (an illegal address, say): nothing more can run in this process."""


def raised_error(reason: str, kernel_name: str) -> tuple[str, str] | None:
    """``(entry point, exception type)`` when ``reason`` (a report's reason, holding a :class:`KernelFailure`'s
    message) says ``kernel_name``'s entry point raised; ``None`` for a broken contract or another message."""
    found = re.search(re.escape(kernel_name) + r"\.(\w+)" + RAISED + r"([\w.]+)", reason.split("\n", 1)[0])
    return (found.group(1), found.group(2)) if found else None


def contract_layouts(spec: CaseSpec) -> Layouts:
    """The shape and dtype the contract requires of each output of ``spec``."""
    q_shape = (spec.batch, spec.seqlen_q, spec.heads_q, spec.head_dim)
    kv_shape = (spec.batch, spec.seqlen_k, spec.heads_kv, spec.head_dim)
    q_axes, kv_axes = "(batch, seqlen_q, heads_q, head_dim)", "(batch, seqlen_k, heads_kv, head_dim)"
    return {
        "out": (q_shape, spec.torch_dtype, q_axes),
        "lse": ((spec.batch, spec.heads_q, spec.seqlen_q), torch.float32, "(batch, heads_q, seqlen_q)"),
        "dq": (q_shape, spec.torch_dtype, q_axes),
        "dk": (kv_shape, spec.torch_dtype, kv_axes),
        "dv": (kv_shape, spec.torch_dtype, kv_axes),
    }


def bit_view(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bit pattern as integers of its width, in place: two results are the same when their bits
    are (a NaN equals itself, ``-0.0`` differs from ``0.0``)."""
    return tensor.detach().view(_INTEGER_VIEWS[tensor.element_size()])


def _synchronized(returned: Any, device: torch.device) -> Any:
    """``returned``, once the kernel's work on ``device`` has finished (so its errors surface in the call)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return returned


def call_entry(
    kernel: LoadedKernel,
    entry: str,
    inputs: Mapping[str, torch.Tensor | None],
    names: tuple[str, ...],
    layouts: Layouts,
    device: torch.device,
    call: Callable[..., Any],
    case: str,
) -> dict[str, torch.Tensor]:
    """``call(*inputs.values())`` under poisoning; its outputs by name, cloned, after checking the contract.

    ``inputs`` are the tensors the entry point receives, by name, in the order
    ``call`` takes them; each must be unchanged, bit for bit, after the call.
    Names among the kernel's missing outputs must be returned as ``None``; they
    are left out of the result.  ``case`` (its one-line reproduction) names
    the call's case should it hang (:func:`verify.watchdog.watched`).
    """
    missing = kernel.capabilities.missing_outputs()
    # a digest of the bits (core.digest), so NaN inputs compare equal to themselves, and computed on the device:
    # no second copy of the inputs, on the device or the host, at scale
    before = {name: digest(tensor) for name, tensor in inputs.items() if tensor is not None}
    with poisoned(device, [layouts[name][:2] for name in names if name not in missing]):
        try:
            with watched(f"{entry} on case {case}"):
                returned = call_user_code(lambda: _synchronized(call(*inputs.values()), device),
                                          passthrough=(UnsupportedCase,))
        except UserCodeRaised as raised:
            if device_fault.is_device_fault(raised.raised):
                fault = f"{kernel.name}.{entry}{FAULTED}{str(raised).splitlines()[0]}"
                device_fault.record(fault)
                raise DeviceFault(fault) from raised.raised
            raise KernelFailure(f"{kernel.name}.{entry}{RAISED}{raised}") from raised.raised
    for name, bits in before.items():
        if not torch.equal(digest(cast(torch.Tensor, inputs[name])), bits):  # `before` holds no None
            raise KernelFailure(f"{kernel.name}.{entry} modified its input {name} in place")
    expected = f"({', '.join(names)})"
    if not isinstance(returned, (tuple, list)):
        raise KernelFailure(f"{kernel.name}.{entry} returned {type(returned).__name__}, expected a tuple {expected}")
    if len(returned) != len(names):
        raise KernelFailure(f"{kernel.name}.{entry} returned {len(returned)} value(s), expected {len(names)}: {expected}")
    named = dict(zip(names, returned))
    for name in [name for name in named if name in missing]:
        if named.pop(name) is not None:
            raise KernelFailure(
                f"{kernel.name}.{entry} returned {name}, but its capabilities declare none ({missing[name]}): "
                f"return None in its place, or declare {name}=True"
            )
    for name, tensor in named.items():
        shape, dtype, axes = layouts[name]
        if not isinstance(tensor, torch.Tensor):
            raise KernelFailure(f"{kernel.name}.{entry} returned {name} as {type(tensor).__name__}, expected a tensor")
        if tuple(tensor.shape) != shape:
            raise KernelFailure(
                f"{kernel.name}.{entry} returned {name} with shape {tuple(tensor.shape)}, expected {shape} = {axes}"
            )
        if tensor.dtype != dtype:
            raise KernelFailure(
                f"{kernel.name}.{entry} returned {name} with dtype {dtype_name(tensor.dtype)}, "
                f"expected {dtype_name(dtype)}"
            )
        if tensor.device != device:
            raise KernelFailure(f"{kernel.name}.{entry} returned {name} on {tensor.device}, expected {device}")
    return {name: tensor.detach().clone() for name, tensor in named.items()}


def run_case(kernel: LoadedKernel, case: Case, *, backward: bool | None = None) -> dict[str, torch.Tensor]:
    """Forward, then (if ``backward``, by default ``case.spec.backward``) backward on copies of the forward's out and lse,
    ``out`` in ``case.out_layout`` when the case names one."""
    spec = case.spec
    layouts = contract_layouts(spec)
    device = case.q.device
    reproduction = spec.reproduction(kernel.name, str(device))
    masking = {"softmax_scale": spec.scale, "causal": spec.causal, "window_size": spec.window_size}
    outputs = call_entry(
        kernel, "forward", {"q": case.q, "k": case.k, "v": case.v}, ("out", "lse"), layouts, device,
        lambda q, k, v: kernel.forward(q, k, v, **masking), reproduction,
    )  # fmt: skip
    if spec.backward if backward is None else backward:
        handed: dict[str, torch.Tensor | None] = {"dout": case.dout, "q": case.q, "k": case.k, "v": case.v}
        out = outputs["out"].clone()
        handed["out"] = out if case.out_layout is None else to_layout(out, case.out_layout)
        handed["lse"] = outputs["lse"].clone() if "lse" in outputs else None
        outputs |= call_entry(
            kernel, "backward", handed, GRADIENTS, layouts, device,
            lambda dout, q, k, v, out, lse: kernel.backward(
                dout, q, k, v, out, lse, deterministic=spec.deterministic, **masking
            ), reproduction,
        )  # fmt: skip
    return outputs


def run_varlen(kernel: LoadedKernel, packed: Packed, *, backward: bool | None = None) -> dict[str, torch.Tensor]:
    """``forward_varlen`` (and, if ``backward``, by default ``packed.spec.backward``, ``backward_varlen``) on a packed batch.

    Outputs are in the packed layout; ``lse`` comes back as (heads_q, total_q), flash-attn's varlen layout.
    """
    spec = packed.spec
    total_q, total_k = packed.q.shape[0], packed.k.shape[0]
    dtype = packed.q.dtype
    packed_q, packed_kv = "(total_q, heads_q, head_dim)", "(total_k, heads_kv, head_dim)"
    layouts = {
        "out": ((total_q, spec.heads_q, spec.head_dim), dtype, packed_q),
        "lse": ((spec.heads_q, total_q), torch.float32, "(heads_q, total_q)"),
        "dq": ((total_q, spec.heads_q, spec.head_dim), dtype, packed_q),
        "dk": ((total_k, spec.heads_kv, spec.head_dim), dtype, packed_kv),
        "dv": ((total_k, spec.heads_kv, spec.head_dim), dtype, packed_kv),
    }
    max_lengths = (packed.max_seqlen_q, packed.max_seqlen_k)
    reproduction = spec.reproduction(kernel.name, str(packed.q.device))
    masking: dict[str, Any] = {"softmax_scale": spec.scale, "causal": spec.causal, "window_size": spec.window_size}
    sequences = {"cu_seqlens_q": packed.cu_seqlens_q, "cu_seqlens_k": packed.cu_seqlens_k}
    target = cast(VarlenKernelTarget, kernel.target)  # a varlen case runs only on a kernel declaring varlen=True
    outputs = call_entry(
        kernel, "forward_varlen", {"q": packed.q, "k": packed.k, "v": packed.v, **sequences}, ("out", "lse"), layouts,
        packed.q.device,
        lambda q, k, v, cu_q, cu_k: target.forward_varlen(q, k, v, cu_q, cu_k, *max_lengths, **masking),
        reproduction,
    )  # fmt: skip
    if spec.backward if backward is None else backward:
        handed: dict[str, torch.Tensor | None] = {"dout": packed.dout, "q": packed.q, "k": packed.k, "v": packed.v}
        handed |= {"out": outputs["out"].clone(), "lse": outputs["lse"].clone() if "lse" in outputs else None, **sequences}
        outputs |= call_entry(
            kernel, "backward_varlen", handed, GRADIENTS, layouts, packed.q.device,
            lambda dout, q, k, v, out, lse, cu_q, cu_k: target.backward_varlen(
                dout, q, k, v, out, lse, cu_q, cu_k, *max_lengths, deterministic=spec.deterministic, **masking
            ), reproduction,
        )  # fmt: skip
    return outputs
