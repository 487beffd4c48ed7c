"""The case strategy: a whole :class:`~core.case.CaseSpec` built from the simpler strategies.

A case is shape + dtype + mask + softmax scale + value generator + seed; its
tensors come from :func:`core.case.make_case`, so a counterexample is its
spec and ``spec.reproduction(kernel)`` is the one-line reproduction.
Everything drawn is inside the kernel's capabilities (docs/properties.md, "Capabilities, not skips"): an
unsupported combination is never generated, and a property that needs a
missing capability is skipped by the plugin before any case is drawn.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from hypothesis import strategies as st

from fa2_verify.core.contract import Capabilities
from fa2_verify.properties import inputs, masks, shapes
from fa2_verify.properties.profiles import Limits
from fa2_verify.properties.shape_classes import ShapeClasses
from fa2_verify.properties.validation import check_bool
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import UsageError
from fa2_verify.verify.memory import estimate

#: The shape limits used when none are given.
DEFAULT_LIMITS = Limits()


def work(spec: CaseSpec) -> int:
    """``batch * heads_q * seqlen_q * seqlen_k * head_dim``: the cost unit of the golden and the error model."""
    return spec.batch * spec.heads_q * spec.seqlen_q * spec.seqlen_k * spec.head_dim


def fit_budget(spec: CaseSpec, limits: Limits, *, min_batch: int = 1, min_heads_q: int = 1, min_group: int = 1,
               with_mha: bool = False) -> CaseSpec:
    """``spec`` cut down until its work and memory are within ``limits.max_work`` and ``limits.max_bytes``.

    The memory is the size guard's estimate of a GPU's device memory,
    ``verify.memory.estimate(spec, "cuda").device`` (``max_bytes`` budgets a GPU); ``with_mha`` adds the
    estimate of its MHA twin (K and V repeated over each group, :func:`properties.relations.repeat_kv`), which
    the GQA relations hold beside it: ``group`` times the case's K and V and their float64 error-model copies.

    In this order, each step halving one size while the case is over budget
    and never going below what the property asked for: the batch, the kv
    heads, the group, then ``seqlen_q`` (to the largest boundary length at
    most half of it, :func:`shapes.boundary_lengths`).  ``seqlen_k``, the long
    keys where the scale bugs live, is kept.  Deterministic, so Hypothesis
    shrinks and replays through it.
    """

    def over(candidate: CaseSpec) -> bool:
        too_long = limits.max_work is not None and work(candidate) > limits.max_work
        if too_long or limits.max_bytes is None:
            return too_long
        held = estimate(candidate, "cuda").device
        if with_mha:
            held += estimate(dataclasses.replace(candidate, heads_kv=candidate.heads_q), "cuda").device
        return held > limits.max_bytes

    while over(spec):
        group = spec.heads_q // spec.heads_kv
        if spec.batch > min_batch:
            spec = dataclasses.replace(spec, batch=max(min_batch, spec.batch // 2))
        elif spec.heads_kv > 1 and group * (spec.heads_kv // 2) >= min_heads_q:
            spec = dataclasses.replace(spec, heads_kv=spec.heads_kv // 2, heads_q=group * (spec.heads_kv // 2))
        elif group // 2 >= min_group and (group // 2) * spec.heads_kv >= min_heads_q:
            spec = dataclasses.replace(spec, heads_q=(group // 2) * spec.heads_kv)
        elif spec.seqlen_q > 1:
            spec = dataclasses.replace(spec, seqlen_q=shapes.boundary_lengths(min_value=1, max_value=spec.seqlen_q // 2)[-1])
        else:
            break
    return spec


def backward_modes(capabilities: Capabilities) -> st.SearchStrategy[bool]:
    """A backward's ``deterministic`` flag: the default mode or, when the kernel has one, the
    deterministic mode (shrinking toward default), so both backward paths are searched."""
    return st.booleans() if capabilities.deterministic_backward else st.just(False)


def case_specs(
    *,
    capabilities: Capabilities,
    device: str,
    limits: Limits = DEFAULT_LIMITS,
    backward: bool = False,
    deterministic: bool | None = False,
    masked: bool = True,
    gqa: bool = True,
    min_batch: int = 1,
    min_heads_q: int = 1,
    min_group: int = 1,
    with_mha: bool = False,
    generators: Iterable[str] | None = None,
    dtypes: Iterable[str] | None = None,
    shape_classes: ShapeClasses | None = None,
) -> st.SearchStrategy[CaseSpec]:
    """Cases the kernel supports on ``device``.

    ``backward``/``deterministic`` request a backward case (in deterministic
    mode); ``deterministic=None`` draws the mode, default or (when the kernel
    has one) deterministic, shrinking toward default, so the golden gradient
    checks see both backward paths; ``masked=False`` draws unmasked cases
    only, ``gqa=False`` MHA only;
    ``min_batch``, ``min_heads_q`` and ``min_group`` (2 for GQA/MQA only) serve
    the metamorphic relations that need them, ``with_mha`` those that also run
    the case's MHA twin (its memory counts in the budget, :func:`fit_budget`); ``generators`` and ``dtypes``
    restrict the value generators and dtypes drawn; ``shape_classes``, if
    given, moves a case of a new shape class into one drawn before once the
    test has drawn its limit (:mod:`properties.shape_classes`).
    """
    for name, flag in (("backward", backward), ("masked", masked), ("gqa", gqa), ("with_mha", with_mha)):
        check_bool(name, flag)
    if deterministic is not None:
        check_bool("deterministic", deterministic)
    elif not backward:
        raise UsageError("deterministic=None: only a backward case has a mode to draw; pass backward=True")
    if backward and not capabilities.backward:
        raise UsageError("backward=True: the kernel has no backward pass; draw forward cases only")
    if min_group > 1 and not (gqa and capabilities.gqa):
        raise UsageError(f"min_group={min_group}: the kernel has no GQA/MQA (or gqa=False); leave min_group=1")
    if deterministic and not capabilities.deterministic_backward:
        raise UsageError("deterministic=True: the kernel has no deterministic backward; leave deterministic=False")
    dtype_strategy = inputs.dtypes(capabilities=capabilities, device=device, include=dtypes)
    generator_strategy = inputs.generator_names(include=generators)
    head_dim_strategy = shapes.head_dims(
        capabilities=capabilities, device=device, max_value=limits.max_head_dim, common_max=limits.common_head_dim
    )
    heads_strategy = shapes.head_counts(
        max_heads_kv=limits.max_heads_kv,
        max_group=limits.max_group,
        gqa=gqa and capabilities.gqa,
        min_group=min_group,
        min_heads_q=min_heads_q,
    )
    modes = backward_modes(capabilities)
    batch_strategy = shapes.batches(min_value=min_batch, max_value=limits.max_batch)
    seqlen_strategy = shapes.seqlen_pairs(max_value=limits.max_seqlen, capabilities=capabilities)

    @st.composite
    def build(draw: st.DrawFn) -> CaseSpec:
        seqlen_q, seqlen_k = draw(seqlen_strategy)
        heads_q, heads_kv = draw(heads_strategy)
        if masked:
            causal, window_size = draw(masks.kernel_masks(seqlen_q=seqlen_q, seqlen_k=seqlen_k, capabilities=capabilities))
        else:
            causal, window_size = (capabilities.causal_only, masks.NO_MASK[1])
        spec = CaseSpec(
            batch=draw(batch_strategy),
            seqlen_q=seqlen_q,
            seqlen_k=seqlen_k,
            heads_q=heads_q,
            heads_kv=heads_kv,
            head_dim=draw(head_dim_strategy),
            dtype=draw(dtype_strategy),
            causal=causal,
            window_size=window_size,
            softmax_scale=draw(inputs.softmax_scales(custom=capabilities.custom_softmax_scale)),
            generator=draw(generator_strategy),
            seed=draw(inputs.seeds()),
            backward=backward,
            deterministic=draw(modes) if deterministic is None else deterministic,
        )
        def fit(candidate: CaseSpec) -> CaseSpec:
            return fit_budget(candidate, limits, min_batch=min_batch, min_heads_q=min_heads_q, min_group=min_group,
                              with_mha=with_mha)

        spec = fit(spec)
        if shape_classes is not None:
            spec = fit(shape_classes.admit(spec, draw))
        return spec.aligned(capabilities.causal_alignment)

    return build()
