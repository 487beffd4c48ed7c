"""Every command that writes checks its output paths before any work (core/outputs.py): no output may be a
file the command reads, with or without --overwrite, and a symlink loop is one line, exit 2, not a traceback
after the run."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from fa2_verify.cli import main as cli
from fa2_verify.records import baseline as baselines
from fa2_verify.app.cases.gate_corpus import DEFAULT_PATH
from tests.helpers import COMMITTED


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    """Copies of the committed baseline and the bundled corpus; recording a baseline fails the test."""
    monkeypatch.setattr(baselines, "record", lambda *args, **kwargs: pytest.fail("the command ran the corpus"))
    baseline, corpus = tmp_path / "baseline.json", tmp_path / "corpus.json"
    shutil.copy(COMMITTED, baseline)
    shutil.copy(DEFAULT_PATH, corpus)
    return baseline, corpus


def _refused(argv, capsys) -> str:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    return captured.err


#: collision -> (arguments after the command, given the baseline and corpus paths; the input named)
COLLISIONS = {
    "gate-markdown-is-baseline": (lambda b, c, h: ["gate", "--baseline", b, "--markdown", b, "--overwrite"], "--baseline"),
    "gate-out-is-baseline": (lambda b, c, h: ["gate", "--baseline", b, "--out", b, "--overwrite"], "--baseline"),
    "gate-markdown-is-corpus": (lambda b, c, h: ["gate", "--baseline", b, "--corpus", c, "--markdown", c], "--corpus"),
    "gate-out-is-corpus-by-hard-link": (
        lambda b, c, h: ["gate", "--baseline", b, "--corpus", c, "--out", h, "--overwrite"], "--corpus"),
    "baseline-out-is-corpus": (lambda b, c, h: ["baseline", "--corpus", c, "--out", c, "--overwrite"], "--corpus"),
}


@pytest.mark.parametrize("arguments, input_flag", COLLISIONS.values(), ids=COLLISIONS.keys())
def test_an_output_that_is_an_input_is_refused_before_any_case_runs(inputs, tmp_path, capsys, arguments, input_flag):
    baseline, corpus = inputs
    hard_link = tmp_path / "hard.json"
    os.link(corpus, hard_link)
    before = baseline.read_bytes(), corpus.read_bytes()
    argv = arguments(str(baseline), str(corpus), str(hard_link))
    err = _refused([argv[0], "--kernel", "reference", *argv[1:]], capsys)
    assert f"which this command reads: writing it would destroy the input" in err and f" is {input_flag}=" in err
    assert (baseline.read_bytes(), corpus.read_bytes()) == before


def test_gate_with_distinct_outputs_gets_past_the_output_check(inputs, tmp_path, capsys):
    """The same command with a fresh --markdown reaches the baseline's checks (the corpus copy is the bundled one)."""
    baseline, corpus = inputs
    argv = ["gate", "--kernel", "reference", "--baseline", str(baseline), "--corpus", str(corpus),
            "--markdown", str(tmp_path / "gate.md"), "--dtypes", "float99"]
    assert "--dtypes=float99: the corpus has no float99 case" in _refused(argv, capsys)


@pytest.fixture
def loop(tmp_path):
    path = tmp_path / "loop"
    path.symlink_to(path)
    return path


def test_run_report_in_a_symlink_loop_is_refused_before_any_case(loop, capsys):
    err = _refused(["run", "--kernel", "reference", "--report", str(loop)], capsys)
    assert f"--report={loop}/tolerance.json is a symlink loop" in err


def test_report_out_in_a_symlink_loop_is_refused_in_one_line(loop, tmp_path, capsys):
    results = tmp_path / "allure-results"
    results.mkdir()
    (results / "x-result.json").write_text(json.dumps({"name": "x"}))
    assert f"--out={loop} is a symlink loop" in _refused(["report", str(results), "--out", str(loop)], capsys)


def test_corpus_add_to_a_symlink_loop_is_refused_in_one_line(loop, capsys):
    case = '{"batch": 1, "seqlen_q": 2, "seqlen_k": 2, "heads_q": 1, "heads_kv": 1, "head_dim": 8, "dtype": "float32"}'
    assert f"--corpus={loop} is a symlink loop" in _refused(["corpus", "add", "--corpus", str(loop), "--case", case], capsys)


def test_baseline_out_in_a_symlink_loop_is_refused_in_one_line(loop, capsys):
    assert f"--out={loop} is a symlink loop" in _refused(["baseline", "--kernel", "reference", "--out", str(loop)], capsys)
