"""Calling a kernel for the metamorphic and determinism properties.

Those properties compare a kernel's outputs with its own outputs on related
inputs, so they need the tensors themselves (:func:`verify.check.check_case`
returns only comparisons).  Calls go through :mod:`verify.kernel_call`:
poisoned outputs, inputs (``out`` and ``lse`` included) checked unchanged
after each call, and a :class:`~verify.kernel_call.KernelFailure` for anything
the kernel raises, a modified input or an output that breaks the contract,
which the property reports as a failure of the kernel.  A kernel that raises :class:`~core.errors.UnsupportedCase` declines
the case; that propagates.
"""

from __future__ import annotations

import dataclasses

import torch

from fa2_verify.core.case import Case
from fa2_verify.core.layouts import guarded_case
from fa2_verify.verify.kernel_call import run_case
from fa2_verify.verify.registry import LoadedKernel


@dataclasses.dataclass(frozen=True)
class Outputs:
    """One forward (and optionally backward) call's outputs, cloned off the kernel's buffers."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        value = getattr(self, name)
        if value is None:
            raise KeyError(f"{name} was not computed: the kernel provides none, or the case ran without backward=True")
        return value


def run(kernel: LoadedKernel, case: Case, *, backward: bool | None = None) -> Outputs:
    """Forward, then (if ``backward``, by default ``case.spec.backward``) backward on copies of the forward's out and lse,
    every input in NaN-guarded storage (:func:`core.layouts.guarded_case`)."""
    return Outputs(**run_case(kernel, guarded_case(case), backward=backward))
