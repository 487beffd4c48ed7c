"""The gate: margins, new failures, lost capabilities, fail-closed baselines, and end to end on the CPU.

The end-to-end tests record a baseline of the ``reference`` kernel on a few
corpus cases, gate it again (identical quantiles, no finding), and gate a
degraded copy under the same name (:mod:`tests.degraded`: the error of ``out``
doubled, everything else unchanged).
"""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from tests import degraded
from tests.helpers import CAPABILITIES, COMMITTED, cases, summarize, synthetic_result
from fa2_verify.cli import main as cli
from fa2_verify.records import gate
from fa2_verify.app.cases.gate_corpus import load_corpus, save_corpus
from fa2_verify.verify.corpus import Corpus
from fa2_verify.core.errors import BaselineError, UsageError
from fa2_verify.verify.registry import load_kernel
from fa2_verify.records.report_markdown import render_gate

def test_same_run_passes_with_no_finding():
    baseline = summarize(*cases())
    result = gate.compare(baseline, summarize(*cases()))
    assert result.passed and not result.notes


def test_doubled_out_error_fails_naming_the_quantiles_and_the_rise():
    result = gate.compare(summarize(*cases()), summarize(*cases(a=2.0, b=2.0, c=2.0)))
    assert not result.passed
    assert {finding.where for finding in result.regressions} == {
        "float16/out/none normalized",
        "float16/out/causal normalized",
    }
    assert {note.where for note in result.notes} == {"float16/out/none ulp", "float16/out/causal ulp"}
    text = gate.format_result(result, source="b.json")
    assert "FAILED with 2 regression(s)" in text
    assert "REGRESSION quantile-rise: float16/out/none normalized: p50 " in text and "(+100%, allowed +" in text
    assert "note quantile-rise: float16/out/none ulp: " in text and "(reported, not gating)" in text


def test_a_rise_within_the_margin_passes_and_a_fall_is_a_note():
    assert gate.compare(summarize(*cases()), summarize(*cases(a=1.2, b=1.2, c=1.2))).passed
    improved = gate.compare(summarize(*cases()), summarize(*cases(a=0.5, b=0.5, c=0.5)))
    assert improved.passed and {note.kind for note in improved.notes} == {"improved"}


def test_one_worse_case_raises_its_group_worst_case_quantiles():
    result = gate.compare(summarize(*cases()), summarize(*cases(c=2.0)))
    assert {finding.where for finding in result.regressions} == {"float16/out/causal normalized"}


def test_per_output_margin_and_jitter_widen_the_allowance():
    before, after = summarize(*cases()), summarize(*cases(a=2.0, b=2.0, c=2.0))
    assert gate.compare(before, after, gate.Margins(outputs={"out": 1.5})).passed
    jittery = summarize(*cases(), repeats=[cases(a=1.9, b=1.9, c=1.9)])
    assert jittery.repeats == 2
    assert jittery.groups[("float16", "out", "none")].jitter["normalized"]["max"] > 0
    assert gate.compare(jittery, after).passed


def test_a_newly_failing_case_and_a_new_error_fail():
    failing = cases()
    failing[1] = synthetic_result("b", seed=2, scales={"out": 0.3, "dq": 5.0})
    result = gate.compare(summarize(*cases()), summarize(*failing))
    assert "new-failure: case b: dq now mismatch(es) the golden (was passed)" in [
        f.explain() for f in result.regressions
    ]
    erroring = cases()
    erroring[0] = synthetic_result("a", status="error", reason="synthetic.backward raised RuntimeError: boom")
    result = gate.compare(summarize(*cases()), summarize(*erroring))
    assert any(f.kind == "new-error" and "boom" in f.detail for f in result.regressions)


def test_a_lost_lse_fails_and_a_baseline_older_than_the_flag_reads_it_as_declared():
    without_lse = dataclasses.replace(CAPABILITIES, lse=False)
    result = gate.compare(summarize(*cases()), summarize(*cases(), capabilities=without_lse))
    assert [f.where for f in result.regressions] == ["capabilities.lse"]
    older = summarize(*cases())
    del older.capabilities["lse"]
    assert gate.compare(older, summarize(*cases())).passed and not gate.compare(older, summarize(*cases())).notes


@pytest.mark.parametrize(("change", "where"), [
    ({"custom_softmax_scale": False}, "capabilities.custom_softmax_scale"),
    ({"causal_only": True}, "capabilities.causal_only"),
    ({"causal_alignment": "top_left"}, "capabilities.causal_alignment"),
])
def test_a_convention_that_narrows_or_changes_what_is_checked_fails(change, where):
    changed = dataclasses.replace(CAPABILITIES, **change)
    result = gate.compare(summarize(*cases()), summarize(*cases(), capabilities=changed))
    assert where in [f.where for f in result.regressions]
    older = summarize(*cases())
    for field in ("custom_softmax_scale", "causal_only", "causal_alignment", "unaligned_inputs"):
        older.capabilities.pop(field, None)
    assert gate.compare(older, summarize(*cases())).passed


def test_taking_unaligned_inputs_is_a_gain_and_dropping_it_a_loss():
    unaligned = dataclasses.replace(CAPABILITIES, unaligned_inputs=True)
    assert gate.compare(summarize(*cases()), summarize(*cases(), capabilities=unaligned)).passed
    result = gate.compare(summarize(*cases(), capabilities=unaligned), summarize(*cases()))
    assert [f.where for f in result.regressions] == ["capabilities.unaligned_inputs"]


def test_an_already_failing_case_is_not_new():
    failing = cases()
    failing[1] = synthetic_result("b", seed=2, scales={"out": 0.3, "dq": 5.0})
    assert gate.compare(summarize(*failing), summarize(*failing)).passed


def test_lost_capabilities_fail():
    narrower = dataclasses.replace(CAPABILITIES, dtypes={"cpu": ("float32",)}, deterministic_backward=False)
    result = gate.compare(summarize(*cases()), summarize(*cases(), capabilities=narrower))
    assert {f.where for f in result.regressions} == {"capabilities.deterministic_backward", "capabilities.dtypes[cpu]"}
    unsupported = cases()
    unsupported[2] = synthetic_result("c", status="unsupported", reason="causal masks are not supported")
    result = gate.compare(summarize(*cases()), summarize(*unsupported))
    assert [f.explain() for f in result.regressions] == [
        "capability-lost: case c: ran (passed) in the baseline, now unsupported: causal masks are not supported"
    ]
    assert not gate.compare(summarize(*unsupported), summarize(*cases())).regressions


def test_markdown_of_a_failed_gate_lists_every_regression():
    result = gate.compare(summarize(*cases()), summarize(*cases(a=2.0, b=2.0, c=2.0)))
    markdown = render_gate(result)
    assert markdown.startswith("## fa2-verify gate: `synthetic` on `cpu`: FAILED")
    assert markdown.count("| quantile-rise |") == 2


@pytest.mark.parametrize(
    "margins, message",
    [
        pytest.param({"relative": -0.1}, "--relative-margin=-0.1", id="negative"),
        pytest.param({"relative": float("nan")}, "--relative-margin=nan", id="nan"),
        pytest.param({"floors": {"normalized": 0.01, "ulp": 0.5, "abs": 1.0}}, "unknown metric", id="metric"),
        pytest.param({"floors": {"normalized": 0.01}}, "lack a floor for ulp", id="missing-floor"),
        pytest.param(
            {"floors": {"normalized": 1.0, "ulp": 0.5}},
            "--floor normalized=1.0 is not valid: a floor at the pass threshold 1",
            id="floor-at-threshold",
        ),
        pytest.param({"outputs": {"o": 0.5}}, "unknown output", id="output"),
        pytest.param({"outputs": {"dq": -1.0}}, "dq=-1.0 is not valid", id="output-negative"),
    ],
)
def test_bad_margins(margins, message):
    with pytest.raises(UsageError, match=message):
        gate.Margins(**margins)


def test_mismatched_baseline_fails_closed_naming_every_mismatch():
    baseline = summarize(*cases())
    corpus = Corpus(version=1, cases=tuple(case.spec for case in cases()))
    gate.check_compatible(baseline, kernel="synthetic", device="cpu", corpus=corpus, dtypes=("float16",), source="b")
    float32 = dataclasses.replace(corpus.cases[0], dtype="float32", name="float32-case")
    other = Corpus(version=2, cases=(dataclasses.replace(corpus.cases[0], seed=7), *corpus.cases[1:], float32))
    with pytest.raises(BaselineError) as raised:
        gate.check_compatible(
            baseline, kernel="triton", device="cpu", corpus=other, dtypes=("float16", "float32"), source="b"
        )
    message = str(raised.value)
    for expected in (
        "kernel 'synthetic' != 'triton'",
        "corpus version 1 != 2",
        "corpus digest",
        "dtypes 'float16' != 'float16,float32'",
    ):
        assert expected in message
    with pytest.raises(UsageError, match="--dtypes=float16,float64: the corpus has no float64 case"):
        gate.check_compatible(baseline, kernel="synthetic", device="cpu", corpus=corpus, dtypes=("float16", "float64"),
                              source="b")  # fmt: skip




#: A few corpus cases, small and fast on the CPU: float16 and float32, none/causal/window, GQA/MQA.
E2E_CASES = ("f16-causal-mqa-empty-rows", "f16-window-gqa", "f32-none-uniform-tiny", "f32-window-mqa")


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gate")
    full = load_corpus()
    corpus = Corpus(version=1, cases=tuple(spec for spec in full.cases if spec.name in E2E_CASES))
    return save_corpus(corpus, directory / "corpus.json"), directory / "golden-cache"


def _cli(*arguments, corpus, cache, device="cpu") -> list[str]:
    return [*arguments, "--device", device, "--corpus", str(corpus), "--golden-cache", str(cache)]


def test_gate_passes_its_own_baseline_twice_identically_and_fails_a_doubled_out_error(
    small_corpus, tmp_path, capsys, monkeypatch
):
    corpus, cache = small_corpus
    name = "tests.degraded:REFERENCE"
    base = tmp_path / "baseline.json"
    assert cli.main(_cli("baseline", "--kernel", name, "--out", str(base), corpus=corpus, cache=cache)) == 0
    runs = [tmp_path / "run1.json", tmp_path / "run2.json"]
    for run in runs:
        code = cli.main(
            _cli("gate", "--kernel", name, "--baseline", str(base), "--out", str(run), corpus=corpus, cache=cache)
        )
        assert code == 0
    out = capsys.readouterr().out
    assert out.count("(corpus version 1, 4 cases): PASSED") == 2 and "REGRESSION" not in out
    first, second = (json.loads(run.read_text()) for run in runs)
    assert first["groups"] == second["groups"] == json.loads(base.read_text())["groups"]

    monkeypatch.setattr(degraded.REFERENCE, "degrade", True)
    markdown = tmp_path / "gate.md"
    code = cli.main(
        _cli("gate", "--kernel", name, "--baseline", str(base), "--markdown", str(markdown), corpus=corpus, cache=cache)
    )
    assert code == 1
    out = capsys.readouterr().out
    regressions = [line for line in out.splitlines() if line.startswith("  REGRESSION")]
    for group in ("float16/out/causal+mqa", "float16/out/window+gqa", "float32/out/window+mqa"):
        assert any(line.startswith(f"  REGRESSION quantile-rise: {group} normalized: ") for line in regressions)
    # float32/out/none's largest error is below 0.01 of its bound: doubled, it stays under the gate's floor
    assert not any(line.startswith("  REGRESSION quantile-rise: float32/out/none normalized: ") for line in regressions)
    assert not any("/lse/" in line or "/dv/" in line for line in regressions)
    assert "FAILED" in markdown.read_text()


def test_gate_fails_a_kernel_that_now_exits_in_backward(small_corpus, tmp_path, capsys, monkeypatch):
    """``sys.exit(0)`` inside the kernel is a new error of each backward case, never a silent exit 0."""
    corpus, cache = small_corpus
    name = "tests.degraded:REFERENCE"
    base = tmp_path / "baseline.json"
    assert cli.main(_cli("baseline", "--kernel", name, "--out", str(base), corpus=corpus, cache=cache)) == 0
    capsys.readouterr()
    monkeypatch.setattr(degraded.REFERENCE, "backward", lambda *args, **kwargs: sys.exit(0))
    assert cli.main(_cli("gate", "--kernel", name, "--baseline", str(base), corpus=corpus, cache=cache)) == 1
    out = capsys.readouterr().out
    assert "REGRESSION new-error" in out and f"{name}.backward raised SystemExit: 0" in out


def test_gate_refuses_a_baseline_of_another_kernel_before_running(small_corpus, tmp_path, capsys):
    corpus, cache = small_corpus
    base = tmp_path / "baseline.json"
    assert (
        cli.main(
            _cli(
                "baseline",
                "--kernel",
                "reference",
                "--out",
                str(base),
                "--dtypes",
                "float32",
                corpus=corpus,
                cache=cache,
            )
        )
        == 0
    )
    code = cli.main(_cli("gate", "--kernel", "reference-eager", "--baseline", str(base), corpus=corpus, cache=cache))
    assert code == 2
    err = capsys.readouterr().err
    assert "kernel 'reference' != 'reference-eager'" in err and err.count("\n") == 1
    code = cli.main(
        _cli(
            "gate",
            "--kernel",
            "reference",
            "--baseline",
            str(base),
            "--dtypes",
            "float16,float32",
            corpus=corpus,
            cache=cache,
        )
    )
    assert code == 2 and "dtypes 'float32' != 'float16,float32'" in capsys.readouterr().err


def test_gate_cli_bad_margin_is_a_usage_error(small_corpus, capsys):
    corpus, cache = small_corpus
    code = cli.main(
        _cli("gate", "--kernel", "reference", "--baseline", "x.json", "--floor", "ulp", corpus=corpus, cache=cache)
    )
    assert code == 2 and "--floor 'ulp' is not NAME=NUMBER" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_gate_on_a_missing_device_is_a_one_line_error(small_corpus, capsys):
    corpus, cache = small_corpus
    code = cli.main(
        _cli("gate", "--kernel", "reference", "--baseline", str(COMMITTED), corpus=corpus, cache=cache, device="cuda")
    )
    err = capsys.readouterr().err
    assert code == 2 and "--device=cuda: no CUDA device is visible" in err and err.count("\n") == 1


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "torch-flash"])
def test_gpu_kernel_passes_its_own_baseline_recorded_with_repeats(name, small_corpus, tmp_path, capsys):
    reason = load_kernel(name).unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(f"{name} cannot run here: {reason}")
    corpus, cache = small_corpus
    base = tmp_path / "baseline.json"
    arguments = {"corpus": corpus, "cache": cache, "device": "cuda"}
    assert cli.main(_cli("baseline", "--kernel", name, "--out", str(base), "--repeats", "2", **arguments)) == 0
    assert cli.main(_cli("gate", "--kernel", name, "--baseline", str(base), **arguments)) == 0
    assert "PASSED" in capsys.readouterr().out
