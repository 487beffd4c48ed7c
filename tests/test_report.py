"""tolerance.json (schema 2) and its Markdown summary, on synthetic case results
(:func:`tests.helpers.synthetic_result`)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fa2_verify.cli import main as cli
from fa2_verify.verify import metrics
from fa2_verify.core.case import CaseSpec
from fa2_verify.app.cases import fixed
from fa2_verify.core.errors import ReportError
from fa2_verify.records.report_json import (
    SCHEMA_VERSION,
    build_tolerance_report,
    group_comparisons,
    load_tolerance_report,
    merge_histograms,
    write_tolerance_report,
)
from fa2_verify.records.report_markdown import render_tolerance
from fa2_verify.verify.results import RunResult
from tests.helpers import synthetic_result, synthetic_run

ENVIRONMENT = {
    "device": "cpu",
    "device_name": "x86_64",
    "torch": "2.13.0",
    "triton": "3.9.0",
    "kernel_version": "fa2-verify 0.1.0",
}


@pytest.fixture(scope="module")
def run() -> RunResult:
    return synthetic_run(
        synthetic_result("a", seed=1),
        synthetic_result("b", seed=2, scale=0.6),
        synthetic_result("c", seed=3, causal=True, scales={"dq": 3.0}),
        synthetic_result("d", dtype="bfloat16", status="unsupported", reason="dtype=bfloat16 is not supported on cpu"),
        synthetic_result("e", status="error", reason="synthetic.forward raised RuntimeError: boom"),
    )


def test_groups_pool_histograms_and_take_the_worst_case_quantiles(run):
    report = build_tolerance_report(run, environment=ENVIRONMENT)
    assert report["schema_version"] == SCHEMA_VERSION == 2
    keys = [(g["dtype"], g["output"], g["feature"]) for g in report["groups"]]
    assert keys == sorted(keys) and len(keys) == 10
    none_out = next(g for g in report["groups"] if g["output"] == "out" and g["feature"] == "none")
    a, b = run.cases[0].comparisons["out"], run.cases[1].comparisons["out"]
    assert none_out["cases"] == 2 and none_out["elements"] == a.numel + b.numel
    assert none_out["metrics"]["normalized"]["quantiles"]["max"] == max(
        a.normalized.quantiles["max"], b.normalized.quantiles["max"]
    )
    assert sum(none_out["metrics"]["normalized"]["histogram"]["counts"]) == a.numel + b.numel
    assert none_out["verdict"] == "passed"
    causal_dq = next(g for g in report["groups"] if g["output"] == "dq" and g["feature"] == "causal")
    assert causal_dq["verdict"] == "failed" and causal_dq["mismatches"] > 0


def test_report_lists_failures_with_reproduction_unsupported_and_environment(run):
    report = build_tolerance_report(run, environment=ENVIRONMENT)
    assert report["summary"] == {"passed": 2, "failed": 1, "unsupported": 1, "error": 1}
    assert report["verdict"] == "failed"
    assert report["environment"]["triton"] == "3.9.0" and report["config"] == {"block_m": 64}
    failures = {failure["case"]: failure for failure in report["failures"]}
    assert set(failures) == {"c", "e"}
    assert failures["c"]["outputs"] == ["dq"]
    assert "dq[" in failures["c"]["message"] and "mismatches the golden" in failures["c"]["message"]
    assert failures["c"]["reproduction"] == run.cases[2].spec.reproduction("synthetic", run.cases[2].device)
    assert "boom" in failures["e"]["message"]
    assert report["unsupported"] == [{"reason": "dtype=bfloat16 is not supported on cpu", "cases": ["d"]}]
    assert len(report["cases"]) == 5


def test_nothing_ran_is_not_a_pass():
    report = build_tolerance_report(
        synthetic_run(synthetic_result("d", status="unsupported", reason="no")), environment={}
    )
    assert report["verdict"] == "nothing-ran" and report["groups"] == []


def test_write_is_strict_json_atomic_and_not_overwritten(run, tmp_path):
    path = tmp_path / "tolerance.json"
    infinite = synthetic_run(synthetic_result("inf-out", scales={"out": math.inf}))
    write_tolerance_report(path, infinite, environment=ENVIRONMENT, overwrite=False)

    def refuse(constant):
        raise AssertionError(f"tolerance.json holds the non-JSON constant {constant}")

    json.loads(path.read_text(), parse_constant=refuse)
    loaded = load_tolerance_report(path)
    out = next(group for group in loaded["groups"] if group["output"] == "out")
    assert out["metrics"]["normalized"]["quantiles"]["max"] == "inf" and out["verdict"] == "failed"
    with pytest.raises(ReportError, match="exists"):
        write_tolerance_report(path, run, environment=ENVIRONMENT, overwrite=False)
    write_tolerance_report(path, run, environment=ENVIRONMENT, overwrite=True)
    assert load_tolerance_report(path)["summary"]["error"] == 1


@pytest.mark.parametrize(
    "content, message",
    [
        pytest.param("{", "not valid JSON", id="corrupt"),
        pytest.param(json.dumps({"schema_version": 1, "cases": []}), "schema_version=1", id="version-1"),
        pytest.param("[]", "schema_version=None", id="not-an-object"),
    ],
)
def test_load_refuses_other_schemas(tmp_path, content, message):
    path = tmp_path / "tolerance.json"
    path.write_text(content)
    with pytest.raises(ReportError, match=message):
        load_tolerance_report(path)


def test_merge_refuses_histograms_with_other_edges():
    first = metrics.Distribution.of(torch.ones(3), metrics.NORMALIZED_EDGES)
    second = metrics.Distribution.of(torch.ones(3), metrics.ULP_EDGES)
    assert merge_histograms([first, first])[1] == [2 * c for c in first.histogram[1]]
    with pytest.raises(ValueError, match="edges differ"):
        merge_histograms([first, second])


def test_group_comparisons_keys_by_dtype_output_feature(run):
    groups = group_comparisons(run.cases)
    assert ("float16", "dq", "causal") in groups
    assert all(case.comparisons for members in groups.values() for case, _ in members)


def test_markdown_summary_has_verdict_table_failures_and_unsupported(run):
    markdown = render_tolerance(build_tolerance_report(run, environment=ENVIRONMENT))
    assert markdown.startswith("## fa2-verify: `synthetic` on `cpu`: FAILED\n")
    assert "5 cases: 2 passed, 1 failed, 1 error, 1 unsupported." in markdown
    assert "torch 2.13.0" in markdown and "triton 3.9.0" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith("| float16 |")]
    assert len(rows) == 10
    assert any("| dq | causal |" in row and "**FAILED** (1)" in row for row in rows)
    assert "### Failures (2)" in markdown and "fa2-verify repro --kernel synthetic" in markdown
    assert "- dtype=bfloat16 is not supported on cpu: 1 case(s) (d)" in markdown


def test_markdown_of_a_clean_run_says_passed():
    markdown = render_tolerance(build_tolerance_report(synthetic_run(synthetic_result("a")), environment={}))
    assert ": PASSED\n" in markdown and "Failures" not in markdown and "Unsupported" not in markdown


def test_run_command_writes_tolerance_json_and_markdown(tmp_path, monkeypatch, capsys):
    tiny = CaseSpec(batch=1, seqlen_q=5, seqlen_k=7, heads_q=2, heads_kv=1, head_dim=32, dtype="float16", name="tiny")
    monkeypatch.setattr(fixed, "FIXED_CASES", (tiny,))
    summary = tmp_path / "summary.md"
    arguments = ["run", "--kernel", "reference", "--report", str(tmp_path), "--markdown", str(summary)]
    assert cli.main(arguments) == 0
    report = load_tolerance_report(tmp_path / "tolerance.json")
    assert report["verdict"] == "passed" and report["environment"]["kernel"] == "reference"
    assert summary.read_text().startswith("## fa2-verify: `reference` on `cpu`: PASSED")
    capsys.readouterr()
    elsewhere = ["run", "--kernel", "reference", "--report", str(tmp_path / "other"), "--markdown", str(summary)]
    assert cli.main(elsewhere) == 2
    assert "summary.md exists: pass --overwrite" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
    assert cli.main([*arguments, "--overwrite"]) == 0
