"""benchmarks/bench_before_after.py: its summary of two sides' ratios, its verdicts, and its one-line errors."""

from __future__ import annotations

import json
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
    after = [_replies(1.29), _replies(1.30), _replies(1.2)]
    short = bba.summarize(ROWS, {"before": [_replies(1.0)] * 3, "after": after})
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
        "bench_before_after.py: error: no CUDA device: "
        "the kernel benchmark times triton against PyTorch's FA2 on a GPU\n"
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


#: Stands in for benchmarks/bench_side.py where there is no GPU: the same protocol, a ratio per side
#: (1.0 for the package root named "before", else 1.4; 0.1 less with the backward); each row it times
#: appends its side's name to $FAKE_SIDE_LOG.
FAKE_SIDE = """
import json, os, sys
root = os.environ["PYTHONPATH"].split(os.pathsep)[0]
name = "before" if os.path.basename(root) == "before" else "after"
ratio = 1.0 if name == "before" else 1.4
print(json.dumps({"package": root}), flush=True)
for line in sys.stdin:
    row = json.loads(line)
    with open(os.environ["FAKE_SIDE_LOG"], "a") as log:
        log.write(name + "\\n")
    value = ratio if row["mode"] == "fwd" else ratio - 0.1
    print(json.dumps({"ms_triton": 1.0, "ms_sdpa": value, "ratio": value}), flush=True)
"""


def test_both_sides_run_in_their_own_processes_with_their_own_package_first(tmp_path, monkeypatch, capsys):
    before = tmp_path / "before"
    (before / "fa2_verify").mkdir(parents=True)
    (before / "fa2_verify" / "__init__.py").write_text("")
    side = tmp_path / "side.py"
    side.write_text(FAKE_SIDE)
    monkeypatch.setattr(bba, "SIDE", side)
    monkeypatch.setattr(bba, "require_cuda", lambda: None)
    monkeypatch.setenv("FAKE_SIDE_LOG", str(tmp_path / "turns.log"))
    out = tmp_path / "out"
    assert bba.main(["--before", str(before), "--seqlens", "1024", "--repeats", "2", "--out", str(out)]) == 0
    report = json.loads((out / "before-after.json").read_text())
    assert report["processes"] == {"before": {"package": str(before)}, "after": {"package": str(bba.REPO)}}
    assert len(report["rows"]) == 16 and all(len(replies) == 2 for replies in report["replies"]["after"])
    assert report["rows"][0]["before"] == 1.0 and report["rows"][0]["after"] == 1.4
    assert report["sides"]["after"]["fwd"]["geomean_ok"] and not report["sides"]["before"]["fwd"]["geomean_ok"]
    text = capsys.readouterr().out
    assert "after  fwd+bwd: geometric mean 1.300 (target >= 1.16: met)" in text
    assert (out / "before-after.md").read_text() in text
    turns = (tmp_path / "turns.log").read_text().split()
    assert turns[:6] == ["before", "after", "after", "before", "before", "after"] and len(turns) == 2 * 16 * 2
