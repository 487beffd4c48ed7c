"""A suite that finishes and keeps what it found: time shares, example counts, failures written as they happen.

A property test built by ``harness.build_test`` stops generating once its
time share is spent (:class:`~properties.pacing.ShareSpent` ends Hypothesis'
run; the plugin ends the test there), never while it fails; each failure is a
JSON line in the failure log before the test ends (docs/properties.md, "Time
budget, example counts and the failure log").
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import strategies as st

from fa2_verify.core.atomic import append_line
from fa2_verify.properties import harness, profiles
from fa2_verify.properties.declaration import Property, PropertyFailure
from fa2_verify.properties.failure_log import DEFAULT_NAME, FailureLog, failures_path
from fa2_verify.properties.pacing import Counts, ShareSpent, time_share
from fa2_verify.properties.session import Suite
from fa2_verify.verify.registry import load_kernel

SHARD = harness.Shard(dtype=None, max_examples=50, seed=1)


def _test(check) -> object:
    prop = Property(name="test_x_holds", invariant="x", check=check, breaker="")
    return harness.build_test(prop, profiles.settings_for(profiles.get("ci"), database_dir=None), SHARD)


def _suite(log=None) -> Suite:
    return Suite(load_kernel("reference"), "cpu", profiles.get("ci"), failure_log=log)


def _slow(suite, data) -> None:
    data.draw(st.integers(0, 100))
    time.sleep(0.02)


def test_a_spent_share_ends_the_test_with_the_examples_it_ran():
    suite = _suite()
    suite.start_test("test_x_holds", None, share=0.1)
    with pytest.raises(ShareSpent, match="its time share of 0.1 s is spent after"):
        _test(_slow)(suite)
    counts = suite.end_test()["pacing"]
    assert counts["stopped"] and 1 <= counts["examples"] < SHARD.max_examples


def test_without_a_share_every_example_runs():
    suite = _suite()
    suite.start_test("test_x_holds", None)

    def quick(suite, data):
        data.draw(st.integers(0, 100))

    _test(quick)(suite)
    counts = suite.end_test()["pacing"]
    assert counts["examples"] == SHARD.max_examples and not counts["stopped"]


def test_a_failing_test_is_not_cut_short_and_its_failure_is_logged_as_it_happens(tmp_path):
    """The failure is found, then shrunk past the share; its line is in the file before the next example."""
    log = FailureLog(tmp_path / "failures.jsonl", "reference", "cpu")
    seen_in_file = []

    def fails(suite, data):
        if log.path.exists():
            seen_in_file.append([json.loads(line)["stage"] for line in log.path.read_text().splitlines()])
        time.sleep(0.01)
        raise PropertyFailure(f"x = {data.draw(st.integers(0, 100))}")

    suite = _suite(log)
    suite.start_test("test_x_holds", None, share=0.01)
    with pytest.raises(PropertyFailure, match="x = 0"):
        _test(fails)(suite)
    assert seen_in_file and seen_in_file[0] == ["found"]
    assert suite.end_test()["pacing"]["examples"] > 1
    records = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert [record["stage"] for record in records] == ["found", "last"]
    assert {record["failure"] for record in records} == {"PropertyFailure"} and records[0]["test"] == "test_x_holds"


def test_the_run_budget_is_shared_by_the_tests_over_the_workers():
    assert time_share(60.0, tests=30, workers=1) == 2.0
    assert time_share(60.0, tests=30, workers=2) == 4.0


def test_the_summary_gives_each_property_its_examples_and_where_the_share_stopped_it():
    counts = Counts()
    counts.add("test_x[float16]", {"examples": 7, "after_failure": 0, "seconds": 2.0, "share": 2.0, "stopped": True})
    counts.add("test_x[float32]", {"examples": 20, "after_failure": 5, "seconds": 1.5, "share": 2.0, "stopped": False})
    assert counts.lines() == [
        "examples of test_x: 27 in 3.5 s (float16 7, float32 20), 5 of them after a failure (searching on, and "
        "shrinking); stopped at its time share of 2 s: float16"
    ]


def test_the_failure_log_is_the_option_else_the_examples_dir_if_it_exists(tmp_path):
    assert failures_path(None, tmp_path) == tmp_path / DEFAULT_NAME
    assert failures_path(None, tmp_path / "absent") is None
    assert failures_path(str(tmp_path / "f.jsonl"), tmp_path / "absent") == tmp_path / "f.jsonl"
    for bad, problem in [("", "names no file"), (str(tmp_path), "is a directory"),
                         (str(tmp_path / "absent" / "f.jsonl"), "does not exist")]:
        with pytest.raises(ValueError, match=problem):
            failures_path(bad, tmp_path)


def test_append_line_keeps_what_the_file_holds(tmp_path):
    target = tmp_path / "log.jsonl"
    target.write_text('{"a": 1}\n')
    append_line(target, '{"b": 2}')
    append_line(target, '{"c": 3}\n', sync=False)
    assert target.read_text() == '{"a": 1}\n{"b": 2}\n{"c": 3}\n'
