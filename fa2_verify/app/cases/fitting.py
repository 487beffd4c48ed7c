"""Fitting a case to a kernel: the nearest case it runs, for every case set that ``run`` and ``race`` run.

A kernel with shape constraints (``seqlen_multiple_of``, ``equal_seqlens``,
``min_seqlen``/``max_seqlen``, a short list of head dims) gets each case with
its lengths and head dim fitted (:func:`fit_case`), so the mask, dtype and
head layout the case exists for are still verified.  A kernel that lacks a
feature a case uses gets the nearest case it runs, with only that feature
taken away: MHA for GQA/MQA, the default scale for a custom one, no window
(or a causal one) for a window, a causal mask for a causal-only kernel; and a
top-left kernel's masked cases of unequal lengths are checked against the
top-left mask.  ``fa2-verify run`` lists every case so changed
(:func:`fitting`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import UNBOUNDED, Capabilities
from fa2_verify.core.varlen import VarlenSpec


def fit_head_dim(head_dim: int, supported: tuple[int, ...]) -> int:
    """The smallest of ``supported`` at least ``head_dim``, else the largest: ``head_dim`` itself when supported."""
    return min((dim for dim in supported if dim >= head_dim), default=max(supported))


def fit_case(spec: CaseSpec, capabilities: Capabilities, device: str) -> CaseSpec | None:
    """``spec`` with its head dim and sequence lengths moved to ones ``capabilities`` supports on ``device``.

    The head dim becomes the next supported one (:func:`fit_head_dim`); a
    kernel without a deterministic backward gets its default one, and a
    forward-only kernel the forward alone (its dq, dk and dv are reported as
    not checked: :meth:`Capabilities.missing_outputs`), so the mask, lengths
    and scale the case exists for still get verified.  A feature the kernel
    lacks is taken away and nothing else (:func:`_fit_features`): without GQA
    ``heads_kv = heads_q``; without ``custom_softmax_scale`` the default scale;
    without windows the window is dropped; without causal masks ``causal`` is
    dropped, and a causal-only kernel gets ``causal=True`` (a window it runs
    stays, closed on the right by the causal mask); a top-left kernel gets its
    alignment where the case's lengths make it matter.  Each
    length is rounded up to its own side's multiple
    (:meth:`Capabilities.fit_seqlen`); with ``equal_seqlens`` both become the
    longer side, rounded to both multiples; None if no length fits.  A
    packed batch has each sequence's lengths fitted so.  A case that already
    fits is returned unchanged.
    """
    head_dim = fit_head_dim(spec.head_dim, capabilities.head_dims_on(device))
    if head_dim != spec.head_dim:
        spec = dataclasses.replace(spec, head_dim=head_dim)
    if spec.backward and not capabilities.backward:
        spec = dataclasses.replace(spec, backward=False, deterministic=False)
    if spec.deterministic and not capabilities.deterministic_backward:
        spec = dataclasses.replace(spec, deterministic=False)
    spec = _fit_features(spec, capabilities)
    if isinstance(spec, VarlenSpec):
        seqlens = tuple(_fit_seqlens(pair, capabilities) for pair in spec.seqlens)
        if None in seqlens:
            return None
        spec = spec if seqlens == spec.seqlens else spec.repacked(cast("tuple[tuple[int, int], ...]", seqlens))
    else:
        fitted = _fit_seqlens((spec.seqlen_q, spec.seqlen_k), capabilities)
        if fitted is None:
            return None
        if fitted != (spec.seqlen_q, spec.seqlen_k):
            spec = dataclasses.replace(spec, seqlen_q=fitted[0], seqlen_k=fitted[1])
    return spec.aligned(capabilities.causal_alignment)


def _fit_features(spec: CaseSpec, capabilities: Capabilities) -> CaseSpec:
    """``spec`` without the head layout, scale and mask features ``capabilities`` lacks (:func:`fit_case`)."""
    changes: dict[str, Any] = {}
    if spec.heads_kv != spec.heads_q and not capabilities.gqa:
        changes["heads_kv"] = spec.heads_q
    if spec.softmax_scale is not None and not capabilities.custom_softmax_scale:
        changes["softmax_scale"] = None
    if tuple(spec.window_size) != (UNBOUNDED, UNBOUNDED) and not capabilities.window:
        changes["window_size"] = (UNBOUNDED, UNBOUNDED)
    if capabilities.causal_only and not spec.causal:
        changes["causal"] = True
    elif spec.causal and not capabilities.causal:
        changes["causal"] = False
    return dataclasses.replace(spec, **changes) if changes else spec


def fitting(original: CaseSpec, fitted: CaseSpec) -> str:
    """What :func:`fit_case` changed, ``field old -> new, ...`` (``""`` when nothing), for the run's table."""
    changed = [
        f"{name} {getattr(original, name)!r} -> {getattr(fitted, name)!r}"
        for name in (field.name for field in dataclasses.fields(CaseSpec))
        if getattr(original, name) != getattr(fitted, name)
    ]
    return ", ".join(changed)


def _fit_seqlens(seqlens: tuple[int, int], capabilities: Capabilities) -> tuple[int, int] | None:
    """(seqlen_q, seqlen_k) as :func:`fit_case` fits them (one sequence of a packed batch alike); None if none fits."""
    seqlen_q, seqlen_k = seqlens
    if capabilities.seqlen_unsupported_reason(seqlen_q, seqlen_k) is None:
        return seqlens
    if capabilities.equal_seqlens:
        fitted_q = fitted_k = capabilities.fit_seqlen(max(seqlen_q, seqlen_k))
    else:
        fitted_q, fitted_k = capabilities.fit_seqlen(seqlen_q, "q"), capabilities.fit_seqlen(seqlen_k, "k")
    if fitted_q is None or fitted_k is None:
        return None
    return fitted_q, fitted_k


def fitted_pairs(
    capabilities: Capabilities, cases: tuple[CaseSpec, ...], device: str
) -> tuple[tuple[CaseSpec, CaseSpec], ...]:
    """``(case, fitted case)`` of each of ``cases`` that :func:`fit_case` can fit on ``device``, in order."""
    pairs = ((spec, fit_case(spec, capabilities, device)) for spec in cases)
    return tuple((spec, fitted) for spec, fitted in pairs if fitted is not None)


def fitted_cases(capabilities: Capabilities, cases: tuple[CaseSpec, ...], device: str) -> tuple[CaseSpec, ...]:
    """``cases`` (e.g. :data:`FIXED_CASES`) fitted to the kernel on ``device`` (:func:`fit_case`)."""
    return tuple(fitted for _, fitted in fitted_pairs(capabilities, cases, device))
