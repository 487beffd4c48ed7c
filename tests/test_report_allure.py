"""Allure results of a property test: one result per test, labels, parameters, attachments made once.

An inner pytest run (a subprocess, so allure-pytest's global state stays
there) checks a few small cases of the ``reference`` kernel inside one
Hypothesis-driven test; a ``pytest_runtest_call`` hook wrapper then calls
:func:`records.allure_report.record_property_test` once with every result, as
the property plugin does after a test's last example.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib

import pytest

from tests.helpers import run_inner_suite, synthetic_result
from fa2_verify.records import allure_report
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import ReportError, UsageError

@pytest.fixture(scope="module")
def allure_results(tmp_path_factory) -> pathlib.Path:
    return run_inner_suite(tmp_path_factory.mktemp("allure"))


def _result(directory: pathlib.Path) -> dict:
    results = [json.loads(path.read_text()) for path in directory.glob("*-result.json")]
    assert len(results) == 1, "one Allure result per property test"
    return results[0]


def _attachments(result: dict) -> list[dict]:
    found = list(result.get("attachments", []))
    for step in result.get("steps", []):
        found += step.get("attachments", [])
    return found


def test_one_result_with_kernel_device_dtype_feature_labels_and_parameters(allure_results):
    result = _result(allure_results)
    labels = {(label["name"], label["value"]) for label in result["labels"]}
    assert {("kernel", "reference"), ("device", "cpu"), ("dtype", "float16"), ("dtype", "float32")} <= labels
    assert {("feature", "none"), ("feature", "causal+mqa"), ("feature", "window")} <= labels
    parameters = {parameter["name"]: parameter["value"] for parameter in result["parameters"]}
    assert parameters["kernel"] == "'reference'" and parameters["unsupported"] == "0"
    assert int(parameters["examples"]) >= 2
    excluded = {parameter["name"] for parameter in result["parameters"] if parameter.get("excluded")}
    assert excluded == {"examples", "unsupported"}


def test_attachments_are_made_once_per_test_not_per_example(allure_results):
    result = _result(allure_results)
    attachments = _attachments(result)
    names = sorted(attachment["name"] for attachment in attachments)
    assert names == sorted(
        [f"error histogram: {output}" for output in ("out", "lse", "dq", "dk", "dv")]
        + ["error quantiles.csv", "case results.json"]
    )
    for attachment in attachments:
        body = (allure_results / attachment["source"]).read_bytes()
        if attachment["type"] == "image/png":
            assert body.startswith(b"\x89PNG\r\n\x1a\n") and len(body) > 10_000
    csv_body = next(a for a in attachments if a["name"].endswith(".csv"))
    rows = list(csv.DictReader(io.StringIO((allure_results / csv_body["source"]).read_text())))
    examples = int({p["name"]: p["value"] for p in result["parameters"]}["examples"])
    assert len(rows) == 5 * examples
    assert {row["output"] for row in rows} == {"out", "lse", "dq", "dk", "dv"}
    assert all(float(row["normalized_max"]) <= float(row["threshold"]) for row in rows)
    assert {CaseSpec.from_dict(json.loads(row["spec"])).name for row in rows} <= {"f16", "f16-causal-mqa", "f32-window"}
    json_body = next(a for a in attachments if a["name"].endswith(".json"))
    assert len(json.loads((allure_results / json_body["source"]).read_text())["cases"]) == examples


def _record_with_spies(monkeypatch) -> list[str]:
    """Call :func:`record_property_test` on two results; return which Allure steps it took."""
    taken: list[str] = []
    monkeypatch.setattr(allure_report, "label_test", lambda results, **_: taken.append("labels"))
    monkeypatch.setattr(allure_report, "attach_distributions", lambda name, results: taken.append("attachments"))
    results = [synthetic_result("a", seed=1), synthetic_result("b", seed=2)]
    allure_report.record_property_test("t", results, kernel="reference", device="cpu")
    return taken


def test_without_alluredir_nothing_is_recorded(monkeypatch):
    if allure_report.active():
        pytest.skip("this pytest run itself writes Allure results (--alluredir)")
    assert _record_with_spies(monkeypatch) == []


def test_with_an_allure_listener_labels_and_attachments_are_recorded_once(monkeypatch):
    """The positive control of the test above: the same call records when a listener is active."""
    monkeypatch.setattr(allure_report, "active", lambda: True)
    assert _record_with_spies(monkeypatch) == ["labels", "attachments"]


def test_generate_html_refuses_missing_results_and_existing_output(tmp_path, allure_results):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no Allure results"):
        allure_report.generate_html(tmp_path / "empty", tmp_path / "report")
    occupied = tmp_path / "report"
    occupied.mkdir()
    (occupied / "index.html").write_text("old")
    with pytest.raises(ReportError, match="is not empty: pass --overwrite"):
        allure_report.generate_html(allure_results, occupied)


FAKE_ALLURE_3 = """#!/bin/sh
if [ "$1" = --version ]; then echo 3.0.0; exit 0; fi
if [ -n "$FAKE_ALLURE_FAILS" ]; then echo "it broke" >&2; exit 3; fi
mkdir -p "$4" && echo new > "$4/index.html"
"""


@pytest.fixture
def fake_allure(tmp_path, monkeypatch) -> str:
    """An executable that answers ``--version`` as Allure 3 and ``generate R --output O`` with ``O/index.html``."""
    fake = tmp_path / "fake-allure"
    fake.write_text(FAKE_ALLURE_3)
    fake.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a-result.json").write_text("{}")
    return str(fake)


@pytest.mark.parametrize(
    "out, message",
    [("results", "--out=results holds results=results: replacing it would delete it"),
     (".", "--out=. holds results=results: replacing it"),
     ("a-file", "--out=a-file is a file: name a directory")],
    ids=["the-results", "an-ancestor-of-the-results", "a-file"],
)
def test_generate_html_refuses_an_output_that_would_delete_its_inputs_or_is_a_file(fake_allure, tmp_path, out, message):
    pathlib.Path("a-file").write_text("mine")
    with pytest.raises(ReportError) as info:
        allure_report.generate_html(pathlib.Path("results"), pathlib.Path(out), allure=fake_allure, overwrite=True)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    assert (tmp_path / "results" / "a-result.json").exists() and pathlib.Path("a-file").read_text() == "mine"


def test_generate_html_replaces_the_old_report_only_once_the_new_one_is_built(fake_allure, tmp_path, monkeypatch):
    report = tmp_path / "report"
    report.mkdir()
    (report / "index.html").write_text("old")
    monkeypatch.setenv("FAKE_ALLURE_FAILS", "1")
    with pytest.raises(ReportError, match="allure generate failed \\(exit 3\\): it broke"):
        allure_report.generate_html(tmp_path / "results", report, allure=fake_allure, overwrite=True)
    assert (report / "index.html").read_text() == "old"
    monkeypatch.delenv("FAKE_ALLURE_FAILS")
    assert allure_report.generate_html(tmp_path / "results", report, allure=fake_allure, overwrite=True) == (
        report / "index.html"
    )
    assert (report / "index.html").read_text() == "new\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["fake-allure", "report", "results"], "no staging left"


@pytest.mark.parametrize("results, problem", [("nothing", "does not exist"), ("fake-allure", "is not a directory")])
def test_generate_html_says_what_is_wrong_with_the_results(fake_allure, results, problem):
    with pytest.raises(UsageError, match=f"results={results} {problem}: run pytest with --alluredir {results}"):
        allure_report.generate_html(pathlib.Path(results), pathlib.Path("report"), allure=fake_allure)


def test_find_allure_explains_how_to_install(monkeypatch):
    monkeypatch.setattr(allure_report, "CHECKOUT_ALLURE", pathlib.Path("/nonexistent/allure"))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv(allure_report.ALLURE_ENV, raising=False)
    with pytest.raises(ReportError, match="npm ci --prefix ci"):
        allure_report.find_allure()
    with pytest.raises(UsageError, match="--allure='nope' is not an executable"):
        allure_report.find_allure("nope")


def test_a_java_allure_2_is_refused(tmp_path):
    fake = tmp_path / "allure"
    fake.write_text("#!/bin/sh\necho 2.30.0\n")
    fake.chmod(0o755)
    with pytest.raises(ReportError, match="is not Allure 3"):
        allure_report.allure_version([str(fake)])


def test_replayed_examples_count_once():
    first, replay, other = synthetic_result("a", seed=1), synthetic_result("a", seed=1), synthetic_result("b", seed=2)
    assert allure_report.distinct_cases([first, other, replay]) == [replay, other]
