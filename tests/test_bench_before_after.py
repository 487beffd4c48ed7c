"""benchmarks/bench_before_after.py: its summary of two sides' ratios, its verdicts, and its one-line errors."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import bench_before_after as bba


def _row(mode, seqlen=1024):
    return {"mode": mode, "causal": False, "head_dim": 64, "seqlen": seqlen, "dtype": "float16"}


def _replies(*ratios):
    return [{"ratio": ratio} if ratio is not None else {"error": "RuntimeError: no"} for ratio in ratios]


ROWS = [_row("fwd", 1024), _row("fwd", 2048), _row("fwd+bwd", 1024)]


def test_each_row_is_the_median_of_its_repeats_and_each_mode_a_geometric_mean():
    replies = {
        "before": [_replies(1.2, 1.3, 1.1), _replies(1.3, 1.3, 1.3), _replies(1.1, 1.0, 1.2)],
        "after": [_replies(1.5, 1.2, 1.4), _replies(1.25, 1.3, 1.28), _replies(1.2, 1.17, 1.3)],
    }
    summary = bba.summarize(ROWS, replies)
    assert [entry["after"] for entry in summary["rows"]] == [1.4, 1.28, 1.2]
    fwd = summary["sides"]["after"]["fwd"]
    assert fwd["geomean"] == pytest.approx(math.sqrt(1.4 * 1.28)) and fwd["lowest"] == 1.28
    assert summary["sides"]["before"]["fwd+bwd"]["geomean"] == 1.1
    assert "| fwd     full   d=64  s=1024  float16 | 1.200 | 1.400 | 1.167 |" in bba.markdown(summary)


def test_targets_are_met_when_every_mode_reaches_its_mean_and_no_row_is_below_the_floor():
    replies = {"before": [_replies(1.0)] * 3, "after": [_replies(1.31), _replies(1.32), _replies(1.2)]}
    summary = bba.summarize(ROWS, replies)
    assert bba.met(summary)
    text = bba.markdown(summary)
    assert "after  fwd    : geometric mean 1.315 (target >= 1.30: met), lowest row 1.310 (target >= 0.8: met)" in text
    assert "before fwd    : geometric mean 1.000 (target >= 1.30: NOT met)" in text
    short = bba.summarize(ROWS, {"before": [_replies(1.0)] * 3, "after": [_replies(1.29), _replies(1.30), _replies(1.2)]})
    assert not short["sides"]["after"]["fwd"]["geomean_ok"] and not bba.met(short)


def test_a_row_below_the_floor_or_a_failed_row_fails_the_targets():
    low = bba.summarize(ROWS, {"before": [_replies(1.0)] * 3, "after": [_replies(2.2), _replies(0.79), _replies(1.2)]})
    assert low["sides"]["after"]["fwd"]["geomean_ok"] and not low["sides"]["after"]["fwd"]["floor_ok"]
    after = [_replies(1.5, None), _replies(1.5), _replies(1.2)]
    failed = bba.summarize(ROWS, {"before": [_replies(1.0)] * 3, "after": after})
    assert failed["rows"][0]["after"] is None
    assert failed["sides"]["after"]["fwd"]["failed_rows"] == 1 and not bba.met(failed)
    assert "| failed | - |" in bba.markdown(failed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_fails_with_one_line(tmp_path, capsys):
    (tmp_path / "fa2_verify").mkdir()
    (tmp_path / "fa2_verify" / "__init__.py").write_text("")
    assert bba.main(["--before", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "bench_before_after.py: error: no CUDA device: the kernel benchmark times triton against PyTorch's FA2 on a GPU\n"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--before", "/nonexistent"], "--before=/nonexistent: holds no fa2_verify package"),
        (["--before", ".", "--modes", "bwd"], "--modes=bwd: use fwd, fwd+bwd or both"),
        (["--before", ".", "--repeats", "0"], "--repeats=0: use 1 or more"),
    ],
)
def test_bad_options_are_one_line_errors(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(bba.REPO)
    assert bba.main(argv) == 2
    assert capsys.readouterr().err == f"bench_before_after.py: error: {message}\n"
