"""Varlen cases drawn by Hypothesis: packed batches (:class:`core.varlen.VarlenSpec`) inside a kernel's capabilities.

The record and the packing live in :mod:`core.varlen`.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import Capabilities
from fa2_verify.properties import inputs, masks, shapes
from fa2_verify.properties.cases import backward_modes, fit_budget
from fa2_verify.properties.profiles import Limits
from fa2_verify.core.errors import UsageError
from fa2_verify.core.varlen import VarlenSpec

#: Most sequences in one packed batch.
MAX_SEQUENCES = 4


def varlen_specs(
    *, capabilities: Capabilities, device: str, limits: Limits, backward: bool = False, dtypes: tuple[str, ...] | None = None
) -> st.SearchStrategy[VarlenSpec]:
    """Packed batches of 1 to 4 sequences, often with an empty one, inside the kernel's capabilities
    (each sequence's lengths as :func:`properties.shapes.seqlen_pairs` draws them); a backward case
    draws its mode (:func:`properties.cases.backward_modes`), as the varlen deterministic backward is
    a path of its own."""
    if not capabilities.varlen:
        raise UsageError("the kernel has no varlen entry points (capabilities.varlen is False); draw padded cases")
    if backward and not capabilities.backward:
        raise UsageError("backward=True: the kernel has no backward pass; draw forward cases only")
    modes = backward_modes(capabilities)
    pairs = shapes.seqlen_pairs(min_value=0, max_value=limits.max_seqlen, capabilities=capabilities)

    @st.composite
    def build(draw: st.DrawFn) -> VarlenSpec:
        seqlens = tuple(draw(st.lists(pairs, min_size=1, max_size=MAX_SEQUENCES)))
        longest_q = max(seqlen_q for seqlen_q, _ in seqlens)
        longest_k = max(seqlen_k for _, seqlen_k in seqlens)
        heads_q, heads_kv = draw(
            shapes.head_counts(max_heads_kv=limits.max_heads_kv, max_group=limits.max_group, gqa=capabilities.gqa)
        )
        causal, window_size = draw(masks.kernel_masks(seqlen_q=longest_q, seqlen_k=longest_k, capabilities=capabilities))
        head_dim = draw(
            shapes.head_dims(
                capabilities=capabilities, device=device, max_value=limits.max_head_dim, common_max=limits.common_head_dim
            )
        )
        dtype = draw(inputs.dtypes(capabilities=capabilities, device=device, include=dtypes))
        # the per-example budget, on the padded batch that holds every sequence
        padded = fit_budget(
            CaseSpec(batch=len(seqlens), seqlen_q=longest_q, seqlen_k=longest_k, heads_q=heads_q, heads_kv=heads_kv,
                     head_dim=head_dim, dtype=dtype, backward=backward),
            limits,
            min_batch=len(seqlens),
        )
        return VarlenSpec.packing(
            tuple((min(seqlen_q, padded.seqlen_q), seqlen_k) for seqlen_q, seqlen_k in seqlens),
            heads_q=padded.heads_q,
            heads_kv=padded.heads_kv,
            head_dim=head_dim,
            dtype=dtype,
            causal=causal,
            window_size=window_size,
            softmax_scale=draw(inputs.softmax_scales(custom=capabilities.custom_softmax_scale)),
            generator=draw(inputs.generator_names()),
            seed=draw(inputs.seeds()),
            backward=backward,
            deterministic=draw(modes) if backward else False,
        ).aligned(capabilities.causal_alignment)

    return build()
