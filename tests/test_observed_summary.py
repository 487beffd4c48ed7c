"""benchmarks/observed_summary.py: examples per second and largest shapes from Hypothesis' observations."""

from __future__ import annotations

import json

from benchmarks import observed_summary


def _case(batch: int, seqlen_q: int, seqlen_k: int, heads_q: int, head_dim: int) -> dict:
    return {"batch": batch, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "heads_q": heads_q, "heads_kv": 1,
            "head_dim": head_dim, "dtype": "float16", "causal": False}


def _line(prop: str, status: str, seconds: float, case: dict | None) -> str:
    arguments = {"data": "data(...)", "Draw 2 (repeats)": 1}
    if case is not None:
        arguments["Draw 1 (case)"] = case
    return json.dumps({"type": "test_case", "property": f"test_x.py::{prop}", "status": status,
                       "timing": {"execute:test": seconds}, "arguments": arguments})


def test_rows_rates_and_largest_shapes(tmp_path):
    observations = tmp_path / "2026-11-23_testcases.jsonl"
    observations.write_text("\n".join([
        _line("test_out", "passed", 2.0, _case(1, 131072, 16, 1, 64)),
        _line("test_out", "failed", 2.0, _case(4, 64, 64, 8, 256)),
        _line("test_out", "gave_up", 1.0, None),
        _line("test_dk", "passed", 5.0, _case(32, 8, 8, 16, 32)),
        json.dumps({"type": "info", "title": "not an example"}),
    ]))
    lines = observed_summary.summary([observations]).splitlines()
    assert "| `test_out` | 1 | 1 | 1 | 5.0 | 0.600 | b1 h1/1 sq131072 sk16 d64 float16 |" in lines
    assert "| `test_dk` | 1 | 0 | 0 | 5.0 | 0.200 | b32 h16/1 sq8 sk8 d32 float16 |" in lines
    assert "4 examples in 10.0 s of test execution (0.400 examples/s)" in lines
    assert "largest seqlen_q: 131072 (b1 h1/1 sq131072 sk16 d64 float16)" in lines
    assert "largest head_dim: 256 (b4 h8/1 sq64 sk64 d256 float16)" in lines
    assert "largest batch x heads_q: 512 (b32 h16/1 sq8 sk8 d32 float16)" in lines


def test_wall_seconds_give_the_rate_of_parallel_workers(tmp_path):
    """Two workers, 4 s of execution each, in 5 s of wall time: 4 examples over 5 s, not over the summed 10."""
    observations = tmp_path / "2026-11-27_testcases.jsonl"
    observations.write_text("\n".join([
        _line("test_out", "passed", 4.0, _case(1, 64, 64, 1, 64)),
        _line("test_out", "passed", 0.5, _case(1, 64, 64, 1, 64)),
        _line("test_dk", "passed", 4.0, _case(1, 64, 64, 1, 64)),
        _line("test_dk", "passed", 1.5, _case(1, 64, 64, 1, 64)),
    ]))
    lines = observed_summary.summary([observations], wall=5.0).splitlines()
    assert "4 examples in 10.0 s of test execution (0.400 examples/s)" in lines
    assert "4 examples in 5 s of wall time (0.800 examples/s)" in lines
    assert not any("wall time" in line for line in observed_summary.summary([observations]).splitlines())
