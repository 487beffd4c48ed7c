"""Baselines: fail-closed loading, the JSON round trip, and the committed reference-cpu baseline."""

from __future__ import annotations

import json

import pytest

from tests.helpers import COMMITTED, cases, summarize
from fa2_verify.verify import baseline as baselines
from fa2_verify.cli import main as cli
from fa2_verify.verify import gate
from fa2_verify.verify.corpus import load_corpus
from fa2_verify.core.errors import BaselineError


def test_round_trip_keeps_every_field(tmp_path):
    baseline = summarize(*cases())
    path = baselines.write_baseline(baseline, tmp_path / "b.json", overwrite=False)
    assert baselines.load_baseline(path) == baseline
    json.loads(path.read_text(), parse_constant=lambda constant: pytest.fail(f"non-JSON constant {constant}"))


def _valid_record() -> dict:
    return json.loads(baselines.dumps(summarize(*cases())))


def _without(key):
    record = _valid_record()
    del record[key]
    return json.dumps(record)


def _with(path, item):
    record = _valid_record()
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = item
    return json.dumps(record)


@pytest.mark.parametrize(
    "content, message",
    [
        pytest.param(None, "does not exist", id="missing"),
        pytest.param('{"schema": ', "corrupt: not valid JSON", id="truncated"),
        pytest.param("[]", "not a fa2-verify/baseline file", id="not-an-object"),
        pytest.param(
            json.dumps({"schema": "fa2-verify/tolerance"}), "not a fa2-verify/baseline file", id="other-schema"
        ),
        pytest.param(_with(["schema_version"], 2), "schema_version=2, this fa2-verify reads 1", id="schema-version"),
        pytest.param(_without("corpus"), "missing field 'corpus'", id="no-corpus"),
        pytest.param(_with(["cases", "a", "status"], "flaky"), "has status 'flaky'", id="status"),
        pytest.param(_with(["cases", "a", "outputs", "out"], "yes"), "true/false", id="output-verdict"),
        pytest.param(
            _with(["groups", 0, "quantiles", "normalized", "max"], "nan"), "negative or NaN", id="nan-quantile"
        ),
        pytest.param(
            _with(["groups", 0, "quantiles", "normalized"], {"p50": 0.1}), "exactly the quantiles", id="quantiles"
        ),
        pytest.param(_with(["groups", 0, "jitter"], {}), "must map exactly", id="jitter"),
        pytest.param(_with(["capabilities"], []), "Capabilities.as_dict()", id="capabilities"),
    ],
)
def test_a_bad_baseline_fails_closed_with_one_line(tmp_path, content, message):
    path = tmp_path / "baseline.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BaselineError, match=message) as raised:
        baselines.load_baseline(path)
    assert "\n" not in str(raised.value) and "fa2-verify baseline --kernel NAME" in str(raised.value)


def test_baseline_cli_refuses_to_overwrite_and_bad_arguments(tmp_path, capsys):
    existing = tmp_path / "b.json"
    existing.write_text("{}")
    assert cli.main(["baseline", "--kernel", "reference", "--out", str(existing)]) == 2
    assert "exists: pass --overwrite" in capsys.readouterr().err
    assert cli.main(["baseline", "--kernel", "reference", "--out", str(tmp_path / "n.json"), "--repeats", "0"]) == 2
    assert "--repeats=0" in capsys.readouterr().err
    assert (
        cli.main(["baseline", "--kernel", "reference", "--out", str(tmp_path / "n.json"), "--dtypes", "float64"]) == 2
    )
    assert "--dtypes=float64: the corpus has no float64 case" in capsys.readouterr().err
    assert cli.main(["gate", "--kernel", "reference", "--baseline", str(tmp_path / "none.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_baseline_directory_or_unwritable_output_is_named_before_any_case_runs(tmp_path, capsys):
    assert cli.main(["gate", "--kernel", "reference", "--baseline", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--baseline={tmp_path} is a directory" in err
    (tmp_path / "a-file").write_text("")
    for argv in (
        ["baseline", "--kernel", "reference", "--out", str(tmp_path)],
        ["gate", "--kernel", "reference", "--baseline", str(COMMITTED), "--out", str(tmp_path)],
        ["gate", "--kernel", "reference", "--baseline", str(COMMITTED), "--markdown", str(tmp_path / "a-file" / "g.md")],
    ):
        assert cli.main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert "is a directory: name a file" in captured.err or "a-file is not a directory" in captured.err


def test_committed_reference_baseline_matches_the_bundled_corpus():
    baseline = baselines.load_baseline(COMMITTED)
    corpus = load_corpus()
    gate.check_compatible(
        baseline, kernel="reference", device="cpu", corpus=corpus, dtypes=corpus.dtypes(), source=str(COMMITTED)
    )
    assert set(baseline.cases) == {spec.name for spec in corpus.cases}
    assert all(case.status == "passed" for case in baseline.cases.values())


@pytest.mark.slow
def test_reference_passes_the_gate_against_its_committed_baseline(tmp_path, capsys):
    code = cli.main(
        [
            "gate",
            "--kernel",
            "reference",
            "--baseline",
            str(COMMITTED),
            "--golden-cache",
            str(tmp_path / "cache"),
            "--markdown",
            str(tmp_path / "gate.md"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED" in out and "REGRESSION" not in out
    assert (tmp_path / "gate.md").read_text().startswith("## fa2-verify gate: `reference` on `cpu`: PASSED")
