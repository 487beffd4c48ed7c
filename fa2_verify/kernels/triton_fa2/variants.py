"""The compiled variants of the Triton FA2 kernels that a set of cases needs, and compiling them ahead of time.

Triton compiles a kernel once per key: the constexpr values, the type of
every other argument with its automatic specialization (an integer equal to
1, or divisible by 16, unless the parameter is in ``do_not_specialize``; a
pointer's 16-byte alignment) and the launch options.  :func:`key` reads that
key from a :class:`~.plans.Launch` as Triton's launcher does
(``native_specialize_impl`` on each non-constexpr parameter of the
``JITFunction``), without a GPU: :func:`launches` builds the launches a case
makes on a GPU target from ``meta`` tensors, through the launch's own
tensor preparation (:func:`.launch.forward_tensors`,
:func:`.launch.backward_tensors`) and plans (:mod:`.plans`).  The same
launches compile ahead of time on a GPU (:func:`compile_launch`,
``kernel.warmup``), so the count and the warm-up cannot differ from what a
real call compiles.

This module needs Triton and a kernel module decorated for the GPU
(``TRITON_INTERPRET`` unset): the interpreter compiles nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import UsageError
from fa2_verify.core.layouts import to_layout
from fa2_verify.kernels.triton_fa2 import configs, plans
from fa2_verify.kernels.triton_fa2.validation import Problem

#: The GPU target whose tiles the count models: Hopper (H100/H200), the CI runners' GPU.
DEFAULT_TARGET = "sm90"

#: The kernels of :mod:`.kernels`, in the order a backward call launches them.
KERNELS: tuple[str, ...] = ("forward_kernel", "backward_preprocess_kernel", "backward_kv_kernel", "backward_dq_kernel")

_META = torch.device("meta")


def _kernels():
    """The kernel module, decorated for the GPU (its JITFunctions carry the parameters Triton keys on)."""
    from fa2_verify.kernels.triton_fa2 import kernels

    if kernels.INTERPRET:
        raise UsageError("TRITON_INTERPRET=1: the interpreter compiles no variants; unset it to count or warm up")
    return kernels


def _problem(spec: CaseSpec, varlen: bool) -> Problem:
    fields = {field.name: getattr(spec, field.name) for field in dataclasses.fields(CaseSpec)}
    fields["softmax_scale"] = spec.scale
    offsets = torch.empty(spec.batch + 1, dtype=torch.int32, device=_META) if varlen else None
    return Problem(**fields, device=_META, cu_seqlens_q=offsets, cu_seqlens_k=offsets)


def _inputs(spec: CaseSpec, varlen: bool, layout: str) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout of ``spec`` on the meta device in ``layout``: dense, or packed (total, heads, head_dim)
    as :func:`core.varlen.pack` lays them out (one batch of ``total`` rows)."""
    dtype = spec.torch_dtype
    if varlen:
        seqlens = getattr(spec, "seqlens")
        total_q, total_k = sum(q for q, _ in seqlens), sum(k for _, k in seqlens)
        q_shape: tuple[int, ...]
        k_shape: tuple[int, ...]
        q_shape, k_shape = (total_q, spec.heads_q, spec.head_dim), (total_k, spec.heads_kv, spec.head_dim)
        return tuple(to_layout(torch.empty((1, *shape), dtype=dtype, device=_META), layout)[0]
                     for shape in (q_shape, k_shape, k_shape, q_shape))
    q_shape = (spec.batch, spec.seqlen_q, spec.heads_q, spec.head_dim)
    k_shape = (spec.batch, spec.seqlen_k, spec.heads_kv, spec.head_dim)
    return tuple(to_layout(torch.empty(shape, dtype=dtype, device=_META), layout)
                 for shape in (q_shape, k_shape, k_shape, q_shape))


def launches(spec: CaseSpec, *, target: str = DEFAULT_TARGET, layout: str = "contiguous") -> list[plans.Launch]:
    """The kernel launches of ``spec``'s calls on a GPU of ``target``: its forward, and its backward
    (deterministic or not) when ``spec.backward``; packed when ``spec`` has ``seqlens`` (a varlen case)."""
    from fa2_verify.kernels.triton_fa2 import launch

    varlen = hasattr(spec, "seqlens")
    problem = _problem(spec, varlen)
    q, k, v, dout = _inputs(spec, varlen, layout)
    if q.numel() == 0 or k.numel() == 0:
        return []
    tma_capable = target == "sm90"
    lse_shape = (spec.heads_q, q.shape[0]) if varlen else (spec.batch, spec.heads_q, spec.seqlen_q)
    q, k, v, out, lse = launch.forward_tensors(q, k, v, lse_shape)
    chosen = plans.tiles(problem, ("forward",), target, None)
    planned = plans.forward_launches(problem, q, k, v, out, lse, chosen, tma_capable)
    if spec.backward:
        passes = plans.backward_passes(problem, target, spec.deterministic)
        tensors = launch.backward_tensors(dout, q, k, v, out, lse, separate_dq="backward_dq" in passes)
        planned += plans.backward_launches(problem, *tensors, plans.tiles(problem, passes, target, None),
                                           tma_capable, plans.PREPROCESS_ROWS)
    return planned


def key(plan: plans.Launch) -> tuple:
    """Triton's compile key of ``plan``: (kernel, per-parameter specialization, launch options)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    function = getattr(_kernels(), plan.kernel)
    runtime = iter(plan.args)
    specialization = []
    for param in function.params:
        if param.is_constexpr:
            specialization.append(("constexpr", plan.constexprs[param.name]))
        else:
            specialization.append(native_specialize_impl(BaseBackend, next(runtime), param.is_const,
                                                         not param.do_not_specialize,
                                                         not param.do_not_specialize_on_alignment))
    return plan.kernel, tuple(specialization), tuple(sorted(plan.options.items()))


def distinct(plans_: Iterable[plans.Launch]) -> dict[tuple, plans.Launch]:
    """One launch per distinct compile key, in first-seen order."""
    found: dict[tuple, plans.Launch] = {}
    for plan in plans_:
        found.setdefault(key(plan), plan)
    return found


def per_kernel(keys: Iterable[tuple]) -> dict[str, int]:
    """How many of ``keys`` belong to each kernel of :data:`KERNELS`."""
    counts = dict.fromkeys(KERNELS, 0)
    for kernel, _, _ in keys:
        counts[kernel] += 1
    return counts


def device_args(plan: plans.Launch, device: torch.device) -> tuple:
    """``plan``'s arguments with each tensor replaced by a one-element tensor on ``device`` of the same
    dtype, strides and address modulo 16 bytes: all that Triton's key reads of a tensor, so compiling
    with them gives the key of the real launch (tests/test_triton_variants.py checks it)."""

    def stand_in(argument):
        if not isinstance(argument, torch.Tensor):
            return argument
        offset = argument.data_ptr() % 16 // argument.element_size()
        storage = torch.empty(offset + 1, dtype=argument.dtype, device=device)
        return storage.as_strided((1,) * argument.dim(), argument.stride(), offset)

    return tuple(stand_in(argument) for argument in plan.args)


def compile_launch(plan: plans.Launch, device: torch.device) -> None:
    """Compile ``plan``'s variant on ``device`` (into Triton's cache) without running it."""
    function = getattr(_kernels(), plan.kernel)
    with torch.cuda.device(device):
        function.warmup(*device_args(plan, device), grid=plan.grid, **plan.constexprs, **plan.options)


def target_of(device: torch.device) -> str:
    """The tile table of ``device`` (``sm90`` on Hopper)."""
    return configs.target_for(device, interpret=False)


def variants_of(cases: list[tuple[CaseSpec, str]], target: str) -> dict[tuple, tuple[CaseSpec, str, int]]:
    """Each distinct compile key of ``cases``' launches on a GPU of ``target`` (a tile table of
    :mod:`kernels.triton_fa2.configs`), with the first (case, layout, launch index) needing it."""
    found: dict[tuple, tuple[CaseSpec, str, int]] = {}
    for spec, layout in cases:
        for index, plan in enumerate(launches(spec, layout=layout, target=target)):
            found.setdefault(key(plan), (spec, layout, index))
    return found
