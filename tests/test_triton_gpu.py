"""The ``triton`` kernels on a CUDA GPU: the feature cases of :mod:`fa2_verify.bench.checks`
(masks, GQA/MQA, odd seqlens, head dims 32..256, fp16/bf16/fp32, varlen with an empty
sequence, strided inputs) through the product's check (poisoned outputs, golden, error
model), both backward modes, and the deterministic backward repeated bit for bit.
Skipped without a CUDA device."""

from __future__ import annotations

import pytest

from fa2_verify.app.cases.bench_checks import CHECK_CASES
from fa2_verify.bench import checks


@pytest.mark.gpu
@pytest.mark.parametrize("case", CHECK_CASES, ids=[case.name for case in CHECK_CASES])
def test_case_passes_the_check(case) -> None:
    result = checks.check(case)
    assert result["passed"], result


@pytest.mark.gpu
def test_check_fails_a_wrong_mask() -> None:
    """The check can fail: a causal output checked as the non-causal case."""
    assert checks.negative_control()["failed_as_it_must"]
