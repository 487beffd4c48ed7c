"""benchmarks/bench_kernels.py and ``fa2-verify bench``: the parts that run without a GPU
(error measures, ULP distance, tile choice, poisoning, FLOP counts, the CLI's refusal)."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import bench_kernels as bench
from fa2_verify.kernels.triton_fa2.configs import TileConfig
from fa2_verify.cli.main import main


def test_relative_error_never_passes_nan() -> None:
    expected = torch.tensor([1.0, 2.0, math.inf])
    assert bench.relative_error(expected.clone(), expected) == 0.0
    assert bench.relative_error(torch.tensor([1.0, 2.2, math.inf]), expected) == pytest.approx(0.2 / math.sqrt(5))
    assert math.isnan(bench.relative_error(torch.tensor([1.0, math.nan, math.inf]), expected))
    assert math.isnan(bench.relative_error(torch.tensor([1.0, 2.0, -math.inf]), expected))
    assert not bench.passes(math.nan, 1.0) and bench.passes(0.5, 1.0) and not bench.passes(2.0, 1.0)


def test_cancellation_floor_bounds_the_denominator() -> None:
    """A sum that cancels to ~0 is measured against the floor, not against ~0."""
    expected = torch.tensor([1e-12, -1e-12])
    actual = torch.tensor([1e-7, -1e-7])
    assert bench.relative_error(actual, expected) > 1e4
    assert bench.relative_error(actual, expected, floor=1e-3) < 1e-3


def test_lse_error_requires_matching_empty_rows() -> None:
    expected = torch.tensor([0.5, math.inf], dtype=torch.float64)
    assert bench.lse_error(torch.tensor([0.5 + 1e-6, math.inf], dtype=torch.float64), expected) == pytest.approx(1e-6)
    assert math.isnan(bench.lse_error(torch.tensor([0.5, 3.0]), expected))


@pytest.mark.parametrize("dtype, mantissa_bits", [(torch.float16, 10), (torch.bfloat16, 7)])
def test_ulp_distance_counts_representable_steps(dtype, mantissa_bits) -> None:
    one = torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=dtype)
    step = torch.finfo(dtype).eps
    other = torch.tensor([1.0 + step, -1.0 - 3 * step, -0.0, torch.finfo(dtype).tiny], dtype=dtype)
    assert bench.ulp_distance(one, other).tolist() == [1, 3, 0, 2**mantissa_bits]


def test_poisoned_allocations_fill_floats_with_nan() -> None:
    with bench.poisoned_allocations():
        floats, ints = torch.empty(4), torch.empty(4, dtype=torch.int32)
        like = torch.empty_like(floats)
    assert floats.isnan().all() and like.isnan().all() and ints.dtype == torch.int32
    assert not torch.empty(4).fill_(0).isnan().any()


def test_best_tiles_takes_the_geometric_mean_over_all_points() -> None:
    fast, slow = TileConfig(128, 64, 8, 3), TileConfig(64, 64, 4, 3)
    results = []
    for seqlen in bench.SWEEP_SEQLENS["forward"]:
        for causal in (False, True):
            for tile, ms in ((fast, 1.0), (slow, 0.9 if causal else 1.5)):
                point = bench.SweepPoint("forward", 64, causal, tile, seqlen)
                results.append({"point": bench._point_dict(point), "ms": ms})
    partial = bench.SweepPoint("forward", 64, True, TileConfig(32, 32, 4, 1), 1024)
    results.append({"point": bench._point_dict(partial), "ms": 0.1})
    assert bench.best_tiles(results) == {("forward", 64, "short"): fast}


def test_bench_rows_cover_the_issue_grid() -> None:
    rows = bench.BENCH_ROWS
    assert {(r.mode, r.causal, r.head_dim, r.dtype) for r in rows} == {
        (m, c, d, t) for m in ("fwd", "fwd+bwd") for c in (False, True) for d in (64, 128)
        for t in ("float16", "bfloat16")}
    assert {r.seqlen for r in rows} == {1024, 2048, 4096, 8192, 16384}
    assert all(r.batch * r.seqlen == bench.TOKENS and r.heads * r.head_dim == bench.HIDDEN for r in rows)
    full = bench.BenchRow("fwd", False, 64, 1024, "float16")
    assert full.flops() == 4.0 * 16 * 32 * 64 * 1024**2
    assert bench.BenchRow("fwd+bwd", False, 64, 1024, "float16").flops() == 3.5 * full.flops()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cli_bench_needs_a_gpu(capsys) -> None:
    assert main(["bench", "--sections", "bench"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "--device=cuda" in error and "no CUDA device" in error
