"""properties/schedule.py: the worksteal shares, the balanced order, the estimates and the duration log."""

from __future__ import annotations

import json
import types

import pytest

from benchmarks import xdist_order
from fa2_verify.properties import schedule


def test_worksteal_shares_deal_the_remainder_to_the_last_workers():
    """As xdist's ``check_schedule`` deals a collection to idle workers: ``remaining // workers left`` each."""
    assert schedule.worksteal_shares(63, 16) == [3] + [4] * 15
    assert schedule.worksteal_shares(3, 4) == [0, 1, 1, 1]
    assert sum(schedule.worksteal_shares(63, 12)) == 63


def test_balanced_opens_each_run_with_a_long_test_and_then_a_short_one():
    estimates = [float(seconds) for seconds in (5, 90, 1, 60, 2, 30, 3, 20, 4, 10)]
    order = schedule.balanced(estimates, workers=3)
    assert sorted(order) == list(range(10))
    shares = schedule.worksteal_shares(10, 3)
    starts = [sum(shares[:worker]) for worker in range(3)]
    assert {estimates[order[start]] for start in starts} == {90.0, 60.0, 30.0}
    assert {estimates[order[start + 1]] for start in starts} == {1.0, 2.0, 3.0}
    assert estimates[order[0]] == 90.0 and estimates[order[1]] == 1.0


def test_balanced_with_fewer_tests_than_workers_keeps_every_test():
    assert sorted(schedule.balanced([3.0, 1.0, 2.0], workers=8)) == [0, 1, 2]
    assert schedule.balanced([], workers=4) == []


@pytest.mark.parametrize("workers", [4, 12, 16])
def test_balanced_ends_near_the_longest_test_where_dtype_major_does_not(workers):
    """Three costly properties of three shards each (90 s, the varlen property on a cold cache) among 54 short
    tests: dtype-major lets a worker open with two costly shards; balanced ends within the longest short test
    (32 s) of the lower bound (the longest test, or the total over the workers)."""
    durations = {f"test_p{index}[{dtype}]": (90.0 if index < 3 else 2.0 + index % 7 * 5.0)
                 for index in range(21) for dtype in ("float16", "bfloat16", "float32")}
    tests = list(durations)
    seconds = [durations[test] for test in tests]
    dtypes = [test[test.index("[") + 1 : -1] for test in tests]
    major = [seconds[i] for i in schedule.dtype_major(dtypes, ("float16", "bfloat16", "float32"))]
    balanced = [seconds[i] for i in schedule.balanced(seconds, workers)]
    bound = max(max(seconds), sum(seconds) / workers)
    assert xdist_order.makespan(balanced, workers, 0.0) <= bound + 32.0
    assert xdist_order.makespan(balanced, workers, 0.0) < xdist_order.makespan(major, workers, 0.0)


def test_estimates_are_the_longest_recorded_and_the_median_for_a_new_test():
    recorded = {"a": [10.0, 80.0, 12.0], "b": [3.0], "c": [5.0]}
    assert schedule.estimates_for(["a", "b", "c", "new"], recorded) == [80.0, 3.0, 5.0, 5.0]
    assert schedule.estimates_for(["new"], recorded) is None
    assert schedule.estimates_for(["a"], {}) is None


def test_a_tests_name_in_the_records_drops_the_directories_of_its_node_id():
    assert schedule.name_in_records("fa2_verify/properties/test_golden.py::test_dq[float16]") == "test_golden.py::test_dq[float16]"
    assert schedule.name_in_records("test_golden.py::test_dq[float16]") == "test_golden.py::test_dq[float16]"


class FakeCache:
    """pytest's ``config.cache`` interface: ``get`` and ``set`` of JSON values."""

    def __init__(self, values=None) -> None:
        self.values = dict(values or {})

    def get(self, key, default):
        return self.values.get(key, default)

    def set(self, key, value) -> None:
        self.values[key] = value


def _report(nodeid: str, duration: float, properties=()):
    return types.SimpleNamespace(nodeid=nodeid, duration=duration, user_properties=list(properties))


def test_the_log_adds_each_property_tests_phases_and_keeps_the_last_runs():
    cache = FakeCache({schedule.CACHE_KEY: {"triton cuda ci": {"test_g.py::test_a[float16]": [1.0] * schedule.HISTORY},
                                            "reference cpu dev": {"test_g.py::test_a[float16]": [7.0]}}})
    log = schedule.DurationLog(cache, "triton cuda ci", ("fa2_observed", "fa2_unsupported"))
    assert log.recorded == {"test_g.py::test_a[float16]": [1.0] * schedule.HISTORY}
    log.pytest_runtest_logreport(_report("dir/test_g.py::test_a[float16]", 2.0))
    log.pytest_runtest_logreport(_report("dir/test_g.py::test_a[float16]", 40.0, [("fa2_observed", "{}")]))
    log.pytest_runtest_logreport(_report("dir/test_g.py::test_a[float16]", 0.5))
    log.pytest_runtest_logreport(_report("dir/test_g.py::test_skipped[float16]", 0.1, [("fa2_unsupported", "why")]))
    log.pytest_runtest_logreport(_report("dir/test_other.py::test_plain", 9.0))
    log.pytest_sessionfinish()
    runs = cache.values[schedule.CACHE_KEY]
    assert runs["triton cuda ci"] == {"test_g.py::test_a[float16]": [1.0] * (schedule.HISTORY - 1) + [42.5],
                                      "test_g.py::test_skipped[float16]": [0.1]}
    assert runs["reference cpu dev"] == {"test_g.py::test_a[float16]": [7.0]}


def test_a_session_without_property_tests_records_nothing():
    cache = FakeCache()
    log = schedule.DurationLog(cache, "triton cuda ci", ("fa2_observed",))
    log.pytest_runtest_logreport(_report("test_other.py::test_plain", 9.0))
    log.pytest_sessionfinish()
    assert cache.values == {}


@pytest.mark.parametrize("stored", ["not a dict", {"triton cuda ci": "x"}, {"triton cuda ci": {"t": ["x"], "u": 3}}])
def test_unreadable_records_read_as_none(stored):
    assert schedule.recorded_durations(FakeCache({schedule.CACHE_KEY: stored}), "triton cuda ci") == {}


def test_a_durations_file_fills_in_the_tests_the_cache_has_not_recorded_and_is_not_written_back(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"triton cuda ci": {"test_g.py::test_a[float16]": [80.0],
                                                   "test_g.py::test_b[float16]": [5.0, 9.0]},
                                "reference cpu dev": {"test_g.py::test_c[float64]": [1.0]}}))
    known = schedule.durations_file(str(path), "triton cuda ci")
    assert known == {"test_g.py::test_a[float16]": [80.0], "test_g.py::test_b[float16]": [5.0, 9.0]}
    cache = FakeCache({schedule.CACHE_KEY: {"triton cuda ci": {"test_g.py::test_b[float16]": [3.0]}}})
    log = schedule.DurationLog(cache, "triton cuda ci", ("fa2_observed",), known)
    assert log.recorded == {"test_g.py::test_a[float16]": [80.0], "test_g.py::test_b[float16]": [3.0]}
    log.pytest_runtest_logreport(_report("dir/test_g.py::test_b[float16]", 4.0, [("fa2_observed", "{}")]))
    log.pytest_sessionfinish()
    assert cache.values[schedule.CACHE_KEY] == {"triton cuda ci": {"test_g.py::test_b[float16]": [3.0, 4.0]}}


@pytest.mark.parametrize(("content", "problem"), [(None, "cannot read it"), ("{", "not valid JSON"),
                                                  ("[1, 2]", "is not a mapping of run keys")])
def test_a_bad_durations_file_is_named_in_one_line(tmp_path, content, problem):
    path = tmp_path / "durations.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=problem):
        schedule.durations_file(str(path), "triton cuda ci")
