"""Calling a kernel for the metamorphic and determinism properties.

Those properties compare a kernel's outputs with its own outputs on related
inputs, so they need the tensors themselves (:func:`verify.check.check_case`
returns only comparisons).  Every call runs under :func:`verify.poison.poisoned`,
so an element the kernel never writes reads NaN; an exception from the kernel
or an output of the wrong shape or dtype becomes a :class:`KernelFailure`,
which the property reports as a failure of the kernel.  A kernel that raises
:class:`~verify.errors.UnsupportedCase` declines the case; that propagates.
"""

from __future__ import annotations

import dataclasses

import torch

from properties.varlen import Packed
from verify.case import Case
from verify.errors import UnsupportedCase
from verify.poison import poisoned
from verify.registry import LoadedKernel


class KernelFailure(Exception):
    """The kernel raised or broke the contract; the message says how."""


@dataclasses.dataclass(frozen=True)
class Outputs:
    """One forward (and optionally backward) call's outputs, cloned off the kernel's buffers."""

    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        value = getattr(self, name)
        if value is None:
            raise KeyError(f"{name} was not computed: run the case with backward=True")
        return value


def _expected(case: Case) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    spec = case.spec
    q_shape = tuple(case.q.shape)
    kv_shape = tuple(case.k.shape)
    return {
        "out": (q_shape, spec.torch_dtype),
        "lse": ((spec.batch, spec.heads_q, spec.seqlen_q), torch.float32),
        "dq": (q_shape, spec.torch_dtype),
        "dk": (kv_shape, spec.torch_dtype),
        "dv": (kv_shape, spec.torch_dtype),
    }


def _call(kernel: LoadedKernel, entry: str, names: tuple[str, ...], case: Case, call) -> tuple[torch.Tensor, ...]:
    return _call_with(kernel, entry, names, _expected(case), case.q.device, call)


def _call_with(
    kernel: LoadedKernel,
    entry: str,
    names: tuple[str, ...],
    expected: dict[str, tuple[tuple[int, ...], torch.dtype]],
    device: torch.device,
    call,
) -> tuple[torch.Tensor, ...]:
    """Call one entry point under poisoning and check its outputs' count, shapes and dtypes."""
    try:
        with poisoned(device, [expected[name] for name in names]):
            returned = call()
    except UnsupportedCase:
        raise
    except Exception as exc:
        raise KernelFailure(f"{kernel.name}.{entry} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(returned, (tuple, list)) or len(returned) != len(names):
        raise KernelFailure(f"{kernel.name}.{entry} returned {type(returned).__name__}, expected ({', '.join(names)})")
    for name, tensor in zip(names, returned):
        shape, dtype = expected[name]
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape or tensor.dtype != dtype:
            got = f"{tuple(tensor.shape)} {tensor.dtype}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise KernelFailure(f"{kernel.name}.{entry} returned {name} as {got}, expected {shape} {dtype}")
    return tuple(tensor.detach().clone() for tensor in returned)


def run(kernel: LoadedKernel, case: Case, *, backward: bool | None = None) -> Outputs:
    """Forward, then (if ``backward``, by default ``case.spec.backward``) backward with the kernel's own out and lse."""
    spec = case.spec
    masking = {"softmax_scale": spec.scale, "causal": spec.causal, "window_size": spec.window_size}
    out, lse = _call(kernel, "forward", ("out", "lse"), case, lambda: kernel.forward(case.q, case.k, case.v, **masking))
    if not (spec.backward if backward is None else backward):
        return Outputs(out, lse)
    dq, dk, dv = _call(
        kernel,
        "backward",
        ("dq", "dk", "dv"),
        case,
        lambda: kernel.backward(
            case.dout, case.q, case.k, case.v, out, lse, deterministic=spec.deterministic, **masking
        ),
    )
    return Outputs(out, lse, dq, dk, dv)


def run_varlen(kernel: LoadedKernel, packed: Packed, *, backward: bool) -> Outputs:
    """``forward_varlen`` (and ``backward_varlen``) on a packed batch; outputs in the packed layout.

    ``lse`` comes back as (heads_q, total_q), flash-attn's varlen layout.
    """
    spec = packed.spec
    total_q, total_k = packed.q.shape[0], packed.k.shape[0]
    dtype = packed.q.dtype
    expected = {
        "out": ((total_q, spec.heads_q, spec.head_dim), dtype),
        "lse": ((spec.heads_q, total_q), torch.float32),
        "dq": ((total_q, spec.heads_q, spec.head_dim), dtype),
        "dk": ((total_k, spec.heads_kv, spec.head_dim), dtype),
        "dv": ((total_k, spec.heads_kv, spec.head_dim), dtype),
    }
    lengths = (packed.cu_seqlens_q, packed.cu_seqlens_k, packed.max_seqlen_q, packed.max_seqlen_k)
    masking = {"softmax_scale": packed.cases[0].spec.scale, "causal": spec.causal, "window_size": spec.window_size}
    out, lse = _call_with(
        kernel, "forward_varlen", ("out", "lse"), expected, packed.q.device,
        lambda: kernel.target.forward_varlen(packed.q, packed.k, packed.v, *lengths, **masking),
    )
    if not backward:
        return Outputs(out, lse)
    dq, dk, dv = _call_with(
        kernel, "backward_varlen", ("dq", "dk", "dv"), expected, packed.q.device,
        lambda: kernel.target.backward_varlen(packed.dout, packed.q, packed.k, packed.v, out, lse, *lengths, **masking),
    )
    return Outputs(out, lse, dq, dk, dv)
