"""The ``triton`` kernels on a CUDA GPU: the feature cases of benchmarks/bench_kernels.py
(masks, GQA/MQA, odd seqlens, head dims 32..256, fp16/bf16/fp32, varlen with an empty
sequence, strided inputs), outputs poisoned with NaN, both backward modes against float64,
and the deterministic backward repeated bit for bit.  Skipped without a CUDA device."""

from __future__ import annotations

import pytest

from benchmarks import bench_kernels as bench


@pytest.mark.gpu
@pytest.mark.parametrize("case", bench.CHECK_CASES, ids=[case.name for case in bench.CHECK_CASES])
def test_case_matches_float64(case) -> None:
    result = bench.check_case(case)
    assert result["passed"], result


@pytest.mark.gpu
def test_check_fails_a_wrong_mask() -> None:
    """The comparison can fail: a causal output against the non-causal reference."""
    assert bench.negative_control()["failed_as_it_must"]
