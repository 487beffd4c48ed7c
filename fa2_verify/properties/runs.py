"""Calling a kernel for the metamorphic and determinism properties.

Those properties compare a kernel's outputs with its own outputs on related
inputs, so they need the tensors themselves (:func:`verify.check.check_case`
returns only comparisons).  Calls go through :mod:`verify.kernel_call`:
poisoned outputs, and a :class:`~verify.kernel_call.KernelFailure` for an exception or an output
that breaks the contract, which the property reports as a failure of the
kernel.  A kernel that raises :class:`~core.errors.UnsupportedCase` declines
the case; that propagates.
"""

from __future__ import annotations

import dataclasses

import torch

from fa2_verify.properties.varlen import Packed
from fa2_verify.core.case import Case
from fa2_verify.verify.kernel_call import call_entry, run_case
from fa2_verify.verify.registry import LoadedKernel


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


def run(kernel: LoadedKernel, case: Case, *, backward: bool | None = None) -> Outputs:
    """Forward, then (if ``backward``, by default ``case.spec.backward``) backward with the kernel's own out and lse."""
    return Outputs(**run_case(kernel, case, backward=backward))


def run_varlen(kernel: LoadedKernel, packed: Packed, *, backward: bool) -> Outputs:
    """``forward_varlen`` (and ``backward_varlen``) on a packed batch; outputs in the packed layout.

    ``lse`` comes back as (heads_q, total_q), flash-attn's varlen layout.
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
    lengths = (packed.cu_seqlens_q, packed.cu_seqlens_k, packed.max_seqlen_q, packed.max_seqlen_k)
    masking = {"softmax_scale": packed.cases[0].spec.scale, "causal": spec.causal, "window_size": spec.window_size}
    forward = call_entry(
        kernel, "forward_varlen", ("out", "lse"), layouts, packed.q.device,
        lambda: kernel.target.forward_varlen(packed.q, packed.k, packed.v, *lengths, **masking),
    )  # fmt: skip
    if not backward:
        return Outputs(**forward)
    out, lse = forward["out"], forward["lse"]
    gradients = call_entry(
        kernel, "backward_varlen", ("dq", "dk", "dv"), layouts, packed.q.device,
        lambda: kernel.target.backward_varlen(packed.dout, packed.q, packed.k, packed.v, out, lse, *lengths, **masking),
    )  # fmt: skip
    return Outputs(**forward, **gradients)
