"""The kernel benchmark (:mod:`fa2_verify.bench`) and ``fa2-verify bench``: the parts that run
without a GPU (ULP distance, tile choice, FLOP counts, the rows' check cases, the check
cases as case records, the CLI's refusal).  Its correctness checks run through
``verify.check`` under the Triton interpreter in tests/triton_interpreter_checks.py."""

from __future__ import annotations


import pytest
import torch

from fa2_verify.app.cases.bench_checks import CHECK_CASES
from fa2_verify.bench import sweep, timing
from fa2_verify.bench import run as bench_run
from fa2_verify.core.varlen import VarlenSpec
from fa2_verify.kernels.triton_fa2.configs import TileConfig
from fa2_verify.cli.main import main


@pytest.mark.parametrize("dtype, mantissa_bits", [(torch.float16, 10), (torch.bfloat16, 7)])
def test_ulp_distance_counts_representable_steps(dtype, mantissa_bits) -> None:
    one = torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=dtype)
    step = torch.finfo(dtype).eps
    other = torch.tensor([1.0 + step, -1.0 - 3 * step, -0.0, torch.finfo(dtype).tiny], dtype=dtype)
    assert timing.ulp_distance(one, other).tolist() == [1, 3, 0, 2**mantissa_bits]


def test_best_tiles_takes_the_geometric_mean_over_all_points() -> None:
    fast, slow = TileConfig(128, 64, 8, 3), TileConfig(64, 64, 4, 3)
    results = []
    for seqlen in sweep.SWEEP_SEQLENS["forward"]:
        for causal in (False, True):
            for tile, ms in ((fast, 1.0), (slow, 0.9 if causal else 1.5)):
                point = sweep.SweepPoint("forward", 64, causal, tile, seqlen)
                results.append({"point": sweep._point_dict(point), "ms": ms})
    partial = sweep.SweepPoint("forward", 64, True, TileConfig(32, 32, 4, 1), 1024)
    results.append({"point": sweep._point_dict(partial), "ms": 0.1})
    assert sweep.best_tiles(results) == {("forward", 64, "short"): fast}


def test_bench_rows_cover_the_issue_grid() -> None:
    rows = timing.BENCH_ROWS
    assert {(r.mode, r.causal, r.head_dim, r.dtype) for r in rows} == {
        (m, c, d, t) for m in ("fwd", "fwd+bwd") for c in (False, True) for d in (64, 128)
        for t in ("float16", "bfloat16")}
    assert {r.seqlen for r in rows} == {1024, 2048, 4096, 8192, 16384}
    assert all(r.batch * r.seqlen == timing.TOKENS and r.heads * r.head_dim == timing.HIDDEN for r in rows)
    full = timing.BenchRow("fwd", False, 64, 1024, "float16")
    assert full.flops() == 4.0 * 16 * 32 * 64 * 1024**2
    assert timing.BenchRow("fwd+bwd", False, 64, 1024, "float16").flops() == 3.5 * full.flops()


def test_each_row_is_checked_as_a_case_of_its_configuration() -> None:
    row = timing.BenchRow("fwd+bwd", True, 128, 16384, "bfloat16")
    spec = row.check_spec()
    assert (spec.head_dim, spec.dtype, spec.causal, spec.backward) == (128, "bfloat16", True, True)
    assert spec.seqlen_q == spec.seqlen_k == timing.CHECK_SEQLEN
    assert not timing.BenchRow("fwd", False, 64, 1024, "float16").check_spec().backward


def test_check_cases_cover_every_feature_as_case_records() -> None:
    specs = [case.spec for case in CHECK_CASES]
    assert len({spec.name for spec in specs}) == len(specs)
    assert {spec.dtype for spec in specs} == {"float16", "bfloat16", "float32"}
    assert {spec.head_dim for spec in specs} >= {32, 64, 128, 256}
    assert any(spec.heads_kv == 1 < spec.heads_q for spec in specs) and any(1 < spec.heads_kv < spec.heads_q for spec in specs)
    assert any(spec.seqlen_q == 1 for spec in specs) and any(spec.seqlen_k == 1 for spec in specs)
    varlen = [spec for spec in specs if isinstance(spec, VarlenSpec)]
    assert varlen and any(0 in pair for spec in varlen for pair in spec.seqlens)
    assert {case.layout for case in CHECK_CASES} >= {"contiguous", "heads-major", "padded-head-dim"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cli_bench_needs_a_gpu(capsys) -> None:
    assert main(["bench", "--sections", "bench"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "--device=cuda" in error and "no CUDA device" in error


def test_tables_keep_one_cell_per_column_and_empty_cells_for_an_error() -> None:
    worst = {"normalized_max": {"out": 0.12, "lse": 0.5}}
    checked = [{"name": "x", "error": "bad"},
               {"name": "y", "atomic": worst, "deterministic": worst, "bitwise_repeat": True, "passed": True}]
    assert bench_run._check_table(checked).splitlines() == [
        "| case | atomic: out lse dq dk dv | deterministic: out lse dq dk dv | det. bitwise | passed |",
        "| --- | --- | --- | --- | --- |",
        "| x | error: bad | | | FAIL |",
        "| y | 0.12 0.5 - - - | 0.12 0.5 - - - | True | ok |",
    ]
    timed = [{"label": "a", "error": "boom"},
             {"label": "b", "check": None, "tflops_triton": 100.2, "tflops_sdpa": 90.0, "ratio": 1.11,
              "peak_mib_triton": 10, "peak_mib_sdpa": 12, "row": {"mode": "fwd"}}]
    assert bench_run._bench_table(timed).splitlines()[2:5] == [
        "| a | error: boom | | | | | |", "| b | 100 | 90 | 1.11 | 10 | 12 | - |", ""
    ]
