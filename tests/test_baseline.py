"""Baselines: fail-closed loading, the JSON round trip, and the committed reference-cpu baseline."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from fa2_verify.core.contract import DTYPES
from fa2_verify.app.cases.gate_corpus import load_corpus
from fa2_verify.verify.corpus import Corpus
from fa2_verify.verify.metrics import OUTPUT_AXES, QUANTILES
from tests.helpers import CAPABILITIES, COMMITTED, cases, summarize, synthetic_result
from fa2_verify.records import baseline as baselines
from fa2_verify.cli import main as cli
from fa2_verify.records import gate
from fa2_verify.core.errors import BaselineError


def test_round_trip_keeps_every_field(tmp_path):
    baseline = summarize(*cases())
    path = baselines.write_baseline(baseline, tmp_path / "b.json", overwrite=False)
    assert baselines.load_baseline(path) == baseline
    json.loads(path.read_text(), parse_constant=lambda constant: pytest.fail(f"non-JSON constant {constant}"))


def _valid_record() -> dict:
    return json.loads(baselines.dumps(summarize(*cases())))


#: The corpus the synthetic baseline was recorded on (``summarize`` builds the same one).
SYNTHETIC_CORPUS = Corpus(version=1, cases=tuple(case.spec for case in cases()))


def _set(path, item):
    """A change of the valid record: the field at ``path`` (keys and indices) becomes ``item``."""

    def change(record):
        target = record
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = item

    return change


def _delete(path):
    def change(record):
        target = record
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


def _duplicate_group(record):
    record["groups"].append(record["groups"][0])


def _group_of_no_case(record):
    record["groups"].append(dict(record["groups"][0], feature="window+gqa"))


def _set_group(key, **fields):
    """Change the group ``key`` = (output, feature) of the float16 baseline."""

    def change(record):
        group = next(g for g in record["groups"] if (g["output"], g["feature"]) == key)
        group.update(fields)

    return change


def _unordered(record):
    quantiles = record["groups"][0]["quantiles"]["normalized"]
    quantiles["p50"] = quantiles["max"] + 1


def _valid_text_with(change) -> str:
    record = _valid_record()
    change(record)
    return json.dumps(record)


@pytest.mark.parametrize(
    "content, message",
    [
        pytest.param(None, "does not exist", id="missing"),
        pytest.param('{"schema": ', "corrupt: not valid JSON", id="truncated"),
        pytest.param("[]", "not a fa2-verify/baseline file", id="not-an-object"),
        pytest.param(
            json.dumps({"schema": "fa2-verify/tolerance"}),
            "not a fa2-verify/baseline file",
            id="other-schema",
        ),
        pytest.param(_set(["schema_version"], 2), "schema_version=2, this fa2-verify reads 1", id="schema-version"),
        pytest.param(_delete(["corpus"]), "(baseline: 'corpus' is a required property)", id="no-corpus"),
        pytest.param(
            _set(["colour"], 1),
            "baseline: Additional properties are not allowed ('colour'",
            id="unknown-field",
        ),
        pytest.param(_set(["corpus", "digest"], "abc"), "corpus.digest: 'abc' does not match", id="digest"),
        pytest.param(_set(["repeats"], -5), "repeats: -5 is less than the minimum of 1", id="repeats-negative"),
        pytest.param(_set(["repeats"], 2.5), "repeats: 2.5 is not of type 'integer'", id="repeats-float"),
        pytest.param(_set(["dtypes"], []), "dtypes: [] should be non-empty", id="dtypes-empty"),
        pytest.param(_set(["capabilities"], []), "capabilities: [] is not of type 'object'", id="capabilities"),
        pytest.param(
            _set(["capabilities", "dtypes"], {}),
            "capabilities.dtypes: {} should be non-empty",
            id="capabilities-dtypes-empty",
        ),
        pytest.param(
            _set(["capabilities", "dtypes"], "cpu"),
            "capabilities.dtypes: 'cpu' is not of type 'object'",
            id="capabilities-dtypes-string",
        ),
        pytest.param(
            _set(["capabilities", "dtypes"], {"cpu": "float16"}),
            "capabilities.dtypes.cpu: 'float16' is not of type 'array'",
            id="capabilities-dtypes-device-string",
        ),
        pytest.param(
            _set(["capabilities", "dtypes"], {"cuda": ["float16"]}),
            "cases.a.status='passed': the baseline's capabilities exclude it (device=cpu",
            id="capabilities-other-device",
        ),
        pytest.param(
            _set(["capabilities", "head_dims"], [64]),
            "cases.a.status='passed': the baseline's capabilities exclude it (head_dim=32",
            id="capabilities-head-dim",
        ),
        pytest.param(
            _set(["capabilities", "causal"], "yes"),
            "capabilities.causal: 'yes' is not of type 'boolean'",
            id="capabilities-flag",
        ),
        pytest.param(_set(["groups"], []), "groups: [] should be non-empty", id="groups-empty"),
        pytest.param(
            lambda record: record["groups"].pop(0),
            "groups: float16/dk/causal is missing, though 1 case(s) of it were compared",
            id="group-deleted",
        ),
        pytest.param(_duplicate_group, "the group float16/dk/causal appears twice", id="group-twice"),
        pytest.param(
            _group_of_no_case,
            "groups[float16/dk/window+gqa]: no case of the corpus compares it",
            id="group-of-no-case",
        ),
        pytest.param(
            _set_group(("out", "none"), cases=7),
            "groups[float16/out/none].cases=7: 2 case(s) of it were compared",
            id="group-case-count",
        ),
        pytest.param(
            _set(["groups", 0, "cases"], 0),
            "groups[0].cases: 0 is less than the minimum of 1",
            id="group-no-cases",
        ),
        pytest.param(
            _set(["groups", 0, "feature"], "masked"),
            "groups[0].feature: 'masked' does not match",
            id="group-feature",
        ),
        pytest.param(_set(["groups", 0, "output"], "o"), "groups[0].output: 'o' is not one of", id="group-output"),
        pytest.param(
            _set(["groups", 0, "quantiles", "normalized", "max"], "inf"),
            "groups[0].quantiles.normalized.max: 'inf' is not of type 'number'",
            id="quantile-inf",
        ),
        pytest.param(
            _set(["groups", 0, "quantiles", "normalized", "max"], "nan"),
            "groups[0].quantiles.normalized.max: 'nan' is not of type 'number'",
            id="quantile-nan",
        ),
        pytest.param(
            _valid_text_with(_set(["groups", 0, "quantiles", "ulp", "max"], 1.0)).replace(
                '"max": 1.0', '"max": Infinity', 1
            ),
            "Infinity is not strict JSON",
            id="quantile-infinity-literal",
        ),
        pytest.param(
            _set(["groups", 0, "quantiles", "normalized", "p50"], -1.0),
            "groups[0].quantiles.normalized.p50: -1.0 is less than the minimum of 0",
            id="quantile-negative",
        ),
        pytest.param(_unordered, "groups[0].quantiles.normalized.p90=", id="quantiles-unordered"),
        pytest.param(
            _set(["groups", 0, "quantiles", "normalized"], {"p50": 0.1}),
            "groups[0].quantiles.normalized: 'p90' is a required property",
            id="quantiles-partial",
        ),
        pytest.param(
            _set(["groups", 0, "jitter"], {}),
            "groups[0].jitter: 'normalized' is a required property",
            id="jitter-empty",
        ),
        pytest.param(
            _set(["groups", 0, "jitter", "normalized", "max"], 1e9),
            "groups[0].jitter.normalized.max=1000000000.0: must be 0 with repeats=1",
            id="jitter-huge",
        ),
        pytest.param(_set(["cases", "a", "status"], "flaky"), "cases.a.status: 'flaky' is not one of", id="status"),
        pytest.param(
            _set(["cases", "a", "outputs", "out"], "yes"),
            "cases.a.outputs.out: 'yes' is not of type 'boolean'",
            id="output-verdict",
        ),
        pytest.param(
            _set(["cases", "a", "outputs", "o"], True),
            "cases.a.outputs: 'o' is not one of",
            id="output-name",
        ),
        pytest.param(
            _delete(["cases", "a", "outputs", "dq"]),
            "cases.a.outputs: has ['dk', 'dv', 'lse', 'out'], the case compares",
            id="output-dropped",
        ),
        pytest.param(
            _set(["cases", "a", "failed_outputs"], ["dq"]),
            "cases.a.failed_outputs=['dq']: must list the outputs that are false",
            id="failed-outputs",
        ),
        pytest.param(
            _set(["cases", "a", "reason"], "why"),
            "cases.a.reason='why': a passed case has no reason",
            id="reason",
        ),
        pytest.param(_delete(["cases", "a"]), "cases: ['a'] missing", id="case-deleted"),
    ],
)
def test_a_bad_baseline_fails_closed_with_one_line_naming_the_field(tmp_path, content, message):
    """Everything the gate checks before running: loading (schema and invariants), then identity and coverage."""
    path = tmp_path / "baseline.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else _valid_text_with(content))
    with pytest.raises(BaselineError) as raised:
        baseline = baselines.load_baseline(path)
        gate.check_compatible(
            baseline, kernel="synthetic", device="cpu", corpus=SYNTHETIC_CORPUS, dtypes=("float16",), source=str(path)
        )
    assert message in str(raised.value)
    assert "\n" not in str(raised.value) and "fa2-verify baseline --kernel" in str(raised.value)


def test_the_valid_synthetic_baseline_passes_every_check(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(_valid_text_with(lambda record: None))
    baseline = baselines.load_baseline(path)
    gate.check_compatible(
        baseline, kernel="synthetic", device="cpu", corpus=SYNTHETIC_CORPUS, dtypes=("float16",), source="b"
    )


@pytest.mark.parametrize("path", sorted(COMMITTED.parent.glob("*.json")), ids=lambda path: path.name)
def test_committed_baselines_validate_against_the_schema_and_cover_the_corpus(path):
    record = json.loads(path.read_text())
    schema = json.loads(baselines.SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator(schema).validate(record)
    baseline = baselines.load_baseline(path)
    baselines.require_coverage(baseline, load_corpus().select(baseline.dtypes))
    baselines.require_consistent_verdicts(baseline, load_corpus().select(baseline.dtypes))


def test_the_schema_names_what_the_code_names():
    definitions = json.loads(baselines.SCHEMA_PATH.read_text())["$defs"]
    assert definitions["dtype"]["enum"] == list(DTYPES)
    assert definitions["output"]["enum"] == list(OUTPUT_AXES)
    assert definitions["quantiles"]["required"] == list(QUANTILES)
    assert definitions["metrics"]["required"] == list(baselines.BASELINE_METRICS)
    assert set(definitions["case"]["properties"]["status"]["enum"]) == {"passed", "failed", "error", "unsupported"}
    assert set(definitions["capabilities"]["properties"]) == set(CAPABILITIES.as_dict())


def test_a_run_with_non_finite_errors_is_never_written_as_a_baseline(tmp_path):
    broken = cases()
    broken[0] = synthetic_result("a", seed=1, scales={"out": math.inf})
    with pytest.raises(BaselineError, match=r"cannot be a baseline \(groups\[\d+\]\.quantiles\.\w+\.[\w.]+: 'inf'"):
        baselines.write_baseline(summarize(*broken), tmp_path / "b.json", overwrite=False)
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param(lambda record: record["groups"].pop(), "groups: ", id="group-deleted"),
        pytest.param(_set(["groups", 0, "jitter", "normalized", "max"], 1e9), "jitter.normalized.max", id="jitter"),
        pytest.param(_set(["capabilities", "dtypes"], {"cpu": 1}), "capabilities.dtypes.cpu", id="capabilities-type"),
        pytest.param(
            _set(["groups", 0, "quantiles", "normalized"], dict(zip(QUANTILES, (5.0, 6.0, 7.0, 8.0, 9.0)))),
            "contradicts itself (groups[bfloat16/dk/causal+gqa].quantiles.normalized.max=9.0: above the pass threshold 1, "
            "yet all 1 case(s) of the group passed dk)",
            id="quantiles-5-to-9-of-passed-cases",
        ),
        pytest.param(
            _set(["groups", 0, "quantiles", "normalized"], dict.fromkeys(QUANTILES, 1e308)),
            "normalized.max=1e+308: above the pass threshold 1",
            id="quantiles-1e308-of-passed-cases",
        ),
    ],
)
def test_gate_refuses_a_tampered_committed_baseline_before_running(tmp_path, capsys, monkeypatch, change, message):
    record = json.loads(COMMITTED.read_text())
    change(record)
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(record))
    monkeypatch.setattr(baselines, "record", lambda *args, **kwargs: pytest.fail("the gate ran the corpus"))
    assert cli.main(["gate", "--kernel", "reference", "--baseline", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


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
    assert cli.main(["gate", "--kernel", "reference", "--baseline", str(COMMITTED), "--dtypes", "float99"]) == 2
    assert capsys.readouterr().err == (
        "fa2-verify: error: --dtypes=float99: the corpus has no float99 case (it covers bfloat16,float16,float32)\n"
    )


TINY_CORPUS = {
    "schema_version": 1,
    "corpus_version": 1,
    "cases": [
        {"batch": 1, "seqlen_q": 3, "seqlen_k": 5, "heads_q": 1, "heads_kv": 1, "head_dim": 32, "dtype": dtype,
         "backward": False, "name": f"tiny-{dtype}"}
        for dtype in ("float16", "float32")
    ],
}


@pytest.mark.parametrize(
    "dtypes, message",
    [("float16", "--kernel=tests.test_cli_run:FLOAT32_ONLY ran none of the 1 corpus cases of float16 on --device=cpu "
                 "(dtype=float16 is not supported on cpu (supported: ['float32'])): nothing was verified"),
     ("float16,float32", "--dtypes=float16,float32: --kernel=tests.test_cli_run:FLOAT32_ONLY ran no corpus case of "
                         "float16 on --device=cpu (dtype=float16 is not supported on cpu")],
    ids=["nothing-ran", "a-named-dtype-did-not-run"],
)
def test_a_baseline_of_a_dtype_that_did_not_run_is_refused_and_not_written(tmp_path, capsys, dtypes, message):
    """A dtype named by --dtypes that the kernel does not run was asked for and not verified: one line, exit 2."""
    corpus, out = tmp_path / "corpus.json", tmp_path / "b.json"
    corpus.write_text(json.dumps(TINY_CORPUS))
    argv = ["baseline", "--kernel", "tests.test_cli_run:FLOAT32_ONLY", "--corpus", str(corpus), "--out", str(out)]
    assert cli.main([*argv, "--dtypes", dtypes]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "no baseline written" in err
    assert not out.exists()
    assert cli.main(argv) == 0 and out.exists(), "without --dtypes an unsupported dtype is recorded as unsupported"


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
