"""Allure results of runner shards merged into one run (records/allure_merge.py, `fa2-verify report A B ...`).

The shards here are written by hand, as the property plugin writes them (a
result per test, an attachment, ``environment.properties``);
tests/test_plugin.py merges the results of a real two-shard run.
"""

from __future__ import annotations

import json
import pathlib
from uuid import uuid4

import pytest

from fa2_verify.cli import main as cli
from fa2_verify.core.errors import UsageError
from fa2_verify.records import allure_merge
from tests.test_report_allure import FAKE_ALLURE_3

RUN = {"kernel": "reference", "device": "cpu", "profile": "ci", "dtypes": "float32"}


def shard_results(directory: pathlib.Path, shard: str | None, tests: dict[str, str], **run: str) -> pathlib.Path:
    """A results directory of ``tests`` (name -> status), described as shard ``shard`` of a run of ``RUN``
    (``run`` overriding it; no description when ``shard`` is None)."""
    directory.mkdir()
    for name, status in tests.items():
        uuid = f"{uuid4()}"
        (directory / f"{uuid}-result.json").write_text(json.dumps(
            {"name": name, "fullName": f"test_golden#{name}", "status": status,
             "attachments": [{"name": "data", "source": f"{uuid}-attachment.json", "type": "application/json"}]}))
        (directory / f"{uuid}-attachment.json").write_text("{}")
    if shard is not None:
        allure_merge.write_run(directory, {**RUN, **run, "shard": shard})
    return directory


def statuses(directory: pathlib.Path) -> dict[str, str]:
    results = [json.loads(path.read_text()) for path in directory.glob("*-result.json")]
    return {result["fullName"]: result["status"] for result in results}


@pytest.fixture
def two_shards(tmp_path) -> list[pathlib.Path]:
    return [shard_results(tmp_path / "s1", "1/2", {"test_a[float32]": "passed", "test_b[float32]": "failed"}),
            shard_results(tmp_path / "s2", "2/2", {"test_c[float32]": "skipped"})]


def test_two_shards_merge_into_the_whole_run(two_shards, tmp_path):
    merge = allure_merge.plan(two_shards)
    allure_merge.write_merged(merge, tmp_path / "merged")
    assert statuses(tmp_path / "merged") == {"test_golden#test_a[float32]": "passed",
                                             "test_golden#test_b[float32]": "failed",
                                             "test_golden#test_c[float32]": "skipped"}
    assert len(list((tmp_path / "merged").glob("*-attachment.json"))) == 3
    merged = allure_merge.read_run(tmp_path / "merged")
    assert merged == {**RUN, "shard": "1/1", "merged_shards": "2"}
    assert allure_merge.plan([tmp_path / "merged"]).run == RUN


def _refused(directories) -> str:
    with pytest.raises(UsageError) as info:
        allure_merge.plan(directories)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("key, value", [("kernel", "triton"), ("profile", "nightly"), ("device", "cuda"),
                                        ("dtypes", "float16")])
def test_shards_of_two_runs_are_refused(tmp_path, key, value):
    first = shard_results(tmp_path / "s1", "1/2", {"test_a": "passed"})
    other = shard_results(tmp_path / "s2", "2/2", {"test_b": "passed"}, **{key: value})
    assert f"is a run of {key} {value!r} and results={first} of {key} {RUN[key]!r}" in _refused([first, other])


def test_a_test_in_two_shards_is_refused(tmp_path):
    first = shard_results(tmp_path / "s1", "1/2", {"test_a": "passed", "test_b": "passed"})
    second = shard_results(tmp_path / "s2", "2/2", {"test_b": "failed"})
    assert _refused([first, second]).startswith(f"test test_golden#test_b is in results={first} and results={second}")


def test_the_same_shard_twice_a_missing_shard_or_two_splits_are_refused(tmp_path):
    one = shard_results(tmp_path / "one", "1/3", {"test_a": "passed"})
    again = shard_results(tmp_path / "again", "1/3", {"test_b": "passed"})
    three = shard_results(tmp_path / "three", "3/3", {"test_c": "passed"})
    other_split = shard_results(tmp_path / "other", "2/2", {"test_d": "passed"})
    assert "are both shard 1/3" in _refused([one, again, three])
    assert _refused([one, three]).startswith("shard 2/3 missing (given: 1/3, 3/3)")
    assert _refused([one]).startswith("shard 2/3, 3/3 missing")
    assert f"results={other_split} is shard 2/2 and results={one} shard 1/3" in _refused([one, other_split])


def test_results_that_say_no_run_merge_only_alone(tmp_path):
    plain = shard_results(tmp_path / "plain", None, {"test_a": "passed"})
    shard = shard_results(tmp_path / "s1", "1/1", {"test_b": "passed"})
    assert allure_merge.plan([plain]).run is None
    assert f"results={plain} has no environment.properties" in _refused([shard, plain])
    (tmp_path / "empty").mkdir()
    assert "holds no Allure results" in _refused([shard, tmp_path / "empty"])


def test_a_description_without_a_shard_or_with_a_bad_one_is_refused(tmp_path):
    directory = shard_results(tmp_path / "s1", "1/1", {"test_a": "passed"})
    (directory / allure_merge.RUN_FILE).write_text("kernel=reference\n")
    assert "names no device, profile, dtypes, shard" in _refused([directory])
    allure_merge.write_run(directory, {**RUN, "shard": "3/2"})
    assert "shard=3/2 names shard 3 of 2" in _refused([directory])


def test_a_kernel_name_with_backslashes_and_line_breaks_reads_back(tmp_path):
    directory = shard_results(tmp_path / "s1", "1/1", {"test_a": "passed"}, kernel=" my\\kernels:K\nx")
    assert allure_merge.read_run(directory)["kernel"] == " my\\kernels:K\nx"


def test_two_different_files_of_one_name_are_refused(two_shards, tmp_path):
    for directory, text in zip(two_shards, ("[]", '[{"name": "mine"}]')):
        (directory / "categories.json").write_text(text)
    with pytest.raises(UsageError, match="both hold a different categories.json"):
        allure_merge.write_merged(allure_merge.plan(two_shards), tmp_path / "merged")
    (two_shards[1] / "categories.json").write_text("[]")
    allure_merge.write_merged(allure_merge.plan(two_shards), tmp_path / "merged-again")
    assert (tmp_path / "merged-again" / "categories.json").read_text() == "[]"


@pytest.fixture
def fake_allure(tmp_path) -> str:
    fake = tmp_path / "fake-allure"
    fake.write_text(FAKE_ALLURE_3)
    fake.chmod(0o755)
    return str(fake)


def test_report_merges_several_shards_and_keeps_the_merged_results(two_shards, tmp_path, fake_allure, capsys):
    merged, report = tmp_path / "merged", tmp_path / "report"
    argv = ["report", *map(str, two_shards), "--out", str(report), "--merged-results", str(merged), "--allure", fake_allure]
    assert cli.main(argv) == 0
    assert (report / "index.html").read_text() == "new\n" and len(statuses(merged)) == 3
    capsys.readouterr()
    assert cli.main(argv[:4] + argv[6:]) == 2, "an existing --out needs --overwrite"
    assert cli.main(["report", *map(str, two_shards), "--out", str(tmp_path / "r2"), "--allure", fake_allure]) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["fake-allure", "merged", "r2", "report", "s1", "s2"]


@pytest.mark.parametrize("arguments, message", [
    (lambda s: [s[0], s[0]], "are both shard 1/2"),
    (lambda s: [s[0]], "shard 2/2 missing"),
    (lambda s: [*s, "--merged-results", s[0]], "--merged-results="),
    (lambda s: [*s, "--merged-results", "report/merged"], "--merged-results=report/merged"),
])
def test_report_refuses_shards_that_are_not_one_run_and_outputs_that_hold_an_input(
    two_shards, tmp_path, fake_allure, capsys, monkeypatch, arguments, message
):
    monkeypatch.chdir(tmp_path)
    argv = ["report", *arguments([str(path.name) for path in two_shards]), "--out", "report", "--allure", fake_allure]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1, captured.err
    assert not (tmp_path / "report").exists() and statuses(two_shards[0])
