"""``--fa2-shape-classes``: at most N shape classes per property test, drawn so Hypothesis replays and shrinks."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from fa2_verify.core.case import CaseSpec
from fa2_verify.kernels.reference import DEFERRED
from fa2_verify.properties.cases import case_specs
from fa2_verify.properties.shape_classes import ShapeClasses, bucket, shape_class

QUICK = settings(max_examples=60, database=None, derandomize=True, deadline=None,
                 suppress_health_check=list(HealthCheck))  # fmt: skip


def drawn_classes(classes: ShapeClasses | None) -> set:
    seen: set = set()

    @QUICK
    @given(case_specs(capabilities=DEFERRED.capabilities, device="cpu", dtypes=("float32",), shape_classes=classes))
    def draw(spec):
        seen.add(shape_class(spec))

    draw()
    return seen


def test_a_shape_class_is_dtype_head_dim_mask_kind_and_lengths_rounded_up_to_a_power_of_two():
    assert [bucket(n) for n in (0, 1, 2, 3, 64, 65)] == [0, 1, 2, 4, 64, 128]
    spec = CaseSpec(batch=1, seqlen_q=5, seqlen_k=33, heads_q=1, heads_kv=1, head_dim=40, dtype="float32", causal=True)
    assert shape_class(spec) == ("float32", 40, "causal", 8, 64)
    assert shape_class(CaseSpec(batch=1, seqlen_q=8, seqlen_k=64, heads_q=2, heads_kv=1, head_dim=40, dtype="float32",
                                window_size=(3, -1)))[2] == "window"  # fmt: skip


def test_a_test_draws_at_most_n_shape_classes_where_it_drew_many_without_the_limit():
    classes = ShapeClasses(2)
    classes.start("test_x[float32]")
    assert len(drawn_classes(classes)) <= 2 and len(classes.classes()) == 2
    assert len(drawn_classes(None)) > 2
    classes.start("test_y[float32]")
    assert classes.classes() == []


def test_a_failure_within_the_classes_shrinks_without_flakiness():
    """A failing example is replayed and shrunk: the same draws give the same case (no ``Flaky`` error)."""
    classes = ShapeClasses(2)
    classes.start("test_x[float32]")

    @QUICK
    @given(case_specs(capabilities=DEFERRED.capabilities, device="cpu", dtypes=("float32",), shape_classes=classes))
    def fails(spec):
        assert spec.seed < 50 or spec.batch < 2

    with pytest.raises(AssertionError):
        fails()
