"""Metamorphic relations: the kernel against itself on related inputs (properties/relations.py).

Both sides are kernel outputs; the tolerance is the sum of both sides'
first-order bounds times the output's threshold (docs/error-model.md).
"""

import dataclasses

from hypothesis import strategies as st

from fa2_verify.core.contract import UNBOUNDED
from fa2_verify.properties import masks, relation_checks, shapes
from fa2_verify.properties.declaration import declare
from fa2_verify.core.layouts import JOINT_LAYOUTS, layouts_for


@declare(breaker="tests.breakers:FIRST_KEY_LEAK", requires=("non_causal",))
def test_out_invariant_under_key_permutation(suite, data):
    """out(q, k[perm], v[perm]) = out(q, k, v) without a mask."""
    spec = data.draw(suite.cases(masked=False), label="case")
    relation_checks.keys_permuted(suite, spec, "out")


@declare(breaker="tests.breakers:LEVEL_DEPENDENT_OUT")
def test_out_invariant_under_score_shift(suite, data):
    """out(S + t 1^T) = out(S) for a per-row shift t of the scores S."""
    spec = data.draw(suite.cases(), label="case")
    relation_checks.scores_shifted(suite, spec, "out")


@declare(breaker="tests.mutants:LSE_BASE2", requires=("lse",))
def test_lse_shifts_with_score_shift(suite, data):
    """lse(S + t 1^T) = lse(S) + t for a per-row shift t of the scores S."""
    spec = data.draw(suite.cases(), label="case")
    relation_checks.scores_shifted(suite, spec, "lse")


@declare(breaker="tests.breakers:BATCH_LEAK")
def test_out_independent_across_batch(suite, data):
    """out(x)[b] = out(x')[b] whenever x[b] = x'[b]."""
    spec = data.draw(suite.cases(min_batch=2), label="case")
    batch = data.draw(st.integers(0, spec.batch - 1), label="kept batch element")
    relation_checks.independent(suite, spec, batch=batch)


@declare(breaker="tests.mutants:GQA_WRONG_HEAD")
def test_out_independent_across_heads(suite, data):
    """out(x)[:, :, h] = out(x')[:, :, h] whenever q, dout agree on head h and k, v on its kv head."""
    spec = data.draw(suite.cases(min_heads_q=2), label="case")
    head = data.draw(st.integers(0, spec.heads_q - 1), label="kept query head")
    relation_checks.independent(suite, spec, head=head)


@declare(breaker="tests.mutants:GQA_WRONG_HEAD", requires=("gqa",))
def test_out_gqa_equals_mha_with_repeated_kv(suite, data):
    """out(q, k, v) = out(q, repeat(k), repeat(v)), K and V repeated over each group of query heads."""
    spec = data.draw(suite.cases(min_group=2, with_mha=True), label="case")
    relation_checks.gqa_as_mha(suite, spec, ("out",))


@declare(breaker="tests.mutants:DK_DV_GQA_NOT_SUMMED", requires=("gqa", "backward"))
def test_dkv_gqa_equals_group_sum_of_mha(suite, data):
    """dk, dv of GQA = sum over each group of dk, dv of MHA with repeated K and V."""
    spec = data.draw(suite.cases(min_group=2, backward=True, with_mha=True), label="case")
    relation_checks.gqa_as_mha(suite, spec, ("dk", "dv"))


@declare(breaker="tests.breakers:CAUSAL_PATH_SHIFT", requires=("causal", "non_causal", "window"))
def test_out_causal_equals_window_left_zero(suite, data):
    """out(causal=True, window=(left, w)) = out(causal=False, window=(left, 0))."""
    unmasked = data.draw(suite.cases(masked=False), label="case")
    left = data.draw(
        st.one_of(st.just(UNBOUNDED), masks.window_sides(seqlen_q=unmasked.seqlen_q, seqlen_k=unmasked.seqlen_k)),
        label="left",
    )
    spec = dataclasses.replace(unmasked, causal=True, window_size=(left, UNBOUNDED)).aligned(suite.kernel.capabilities.causal_alignment)
    relation_checks.causal_as_window(suite, spec)


@declare(breaker="tests.mutants:CAUSAL_SHIFT", requires=("causal",))
def test_out_causal_prefix_ignores_later_queries(suite, data):
    """out(q[:m], k[:m+d], v[:m+d], causal) = out(q, k, v, causal)[:m], d = seqlen_k - seqlen_q."""
    unmasked = data.draw(suite.cases(masked=False), label="case")
    spec = dataclasses.replace(unmasked, causal=True).aligned(suite.kernel.capabilities.causal_alignment)
    rows = data.draw(
        shapes.prefix_rows(seqlen_q=spec.seqlen_q, seqlen_k=spec.seqlen_k, capabilities=suite.kernel.capabilities),
        label="rows kept",
    )
    relation_checks.causal_prefix(suite, spec, rows)


@declare(breaker="tests.breakers:STRIDE_BLIND")
def test_outputs_invariant_under_layout(suite, data):
    """outputs(views of x in a non-contiguous layout, NaN around them) = outputs(x contiguous)."""
    spec = data.draw(suite.cases(backward=suite.kernel.capabilities.backward), label="case")
    layout = data.draw(st.sampled_from(layouts_for(suite.kernel.capabilities)[1:] + JOINT_LAYOUTS), label="layout")
    relation_checks.layout_invariant(suite, spec, layout)
