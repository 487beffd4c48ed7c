"""benchmarks/suite_time.py: its clock, its aggregation, its options, and one small pass end to end.

Nothing here asserts how long anything takes: the clock runs on a fake time
source, and the end-to-end pass checks only that each phase's time was
recorded under the test that spent it.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import types

import pytest

from benchmarks import suite_table, suite_time
from benchmarks.phase_clock import PhaseClock
from benchmarks.suite_phases import OUTSIDE, _rebind
from fa2_verify.core.errors import UsageError

REPO = pathlib.Path(__file__).resolve().parent.parent


class FakeTime:
    """A clock that advances only when told: ``tick(s)``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


def test_a_nested_phase_is_charged_only_to_itself():
    time = FakeTime()
    clock = PhaseClock(now=time)

    def compile_():
        time.tick(3.0)

    def kernel():
        time.tick(1.0)
        timed_compile()
        time.tick(0.5)

    timed_compile, timed_kernel = clock.timed("compile", compile_), clock.timed("kernel", kernel)
    timed_kernel()
    assert clock.take() == {"kernel": 1.5, "compile": 3.0}
    assert clock.take() == {}


def test_the_same_phase_nested_in_itself_counts_its_time_once():
    time = FakeTime()
    clock = PhaseClock(now=time)
    inner = clock.timed("golden", lambda: time.tick(2.0))
    outer = clock.timed("golden", lambda: (time.tick(1.0), inner()))
    outer()
    assert clock.take() == {"golden": 3.0}


def test_a_raising_call_is_charged_and_its_exception_propagates():
    time = FakeTime()
    clock = PhaseClock(now=time)

    def fails():
        time.tick(2.0)
        raise ValueError("kernel error")

    with pytest.raises(ValueError, match="kernel error"):
        clock.timed("kernel", fails)()
    assert clock.take() == {"kernel": 2.0}


def test_sync_runs_at_every_phase_boundary():
    boundaries = []
    clock = PhaseClock(now=FakeTime(), sync=lambda: boundaries.append("sync"))
    clock.timed("kernel", lambda: boundaries.append("call"))()
    assert boundaries == ["sync", "call", "sync"]


def test_calls_on_another_thread_are_not_timed():
    time = FakeTime()
    clock = PhaseClock(now=time)
    timed = clock.timed("compile", lambda: time.tick(5.0))
    thread = threading.Thread(target=timed)
    thread.start()
    thread.join()
    assert clock.take() == {}


def test_rebind_replaces_a_name_imported_into_another_module(monkeypatch):
    def original():
        pass

    home, importer, elsewhere = (types.ModuleType(name) for name in ("fa2_verify._home", "fa2_verify._user", "other"))
    home.function, importer.alias, elsewhere.alias = original, original, original
    for module in (home, importer, elsewhere):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    replacement = object()
    _rebind(original, replacement)
    assert home.function is replacement and importer.alias is replacement
    assert elsewhere.alias is original  # only fa2_verify's and Triton's modules are rebound


def _record(test, seconds, examples=0, outcome="passed", **phases):
    return {"test": test, "worker": "gw0", "seconds": seconds, "phases": phases, "examples": examples,
            "outcome": outcome}  # fmt: skip


RECORDS = [
    _record("p.py::test_fast", 2.0, 4, kernel=1.0, golden=0.5),
    _record("p.py::test_slow", 10.0, 5, "failed", compile=6.0, kernel=2.0, comparison=1.0),
    _record("p.py::test_slow", 1.0, 1, "passed", kernel=0.5),
    {**_record(OUTSIDE, 3.0, 0, "", compile=1.0), "package": "/a/fa2_verify", "missing": ["m:f"]},
    {**_record(OUTSIDE, 2.0, 0, ""), "worker": "gw1", "package": "/a/fa2_verify", "missing": []},
]


def test_aggregate_sums_per_test_slowest_first_with_the_rest_as_hypothesis():
    result = suite_table.aggregate(RECORDS)
    assert [row["test"] for row in result["tests"]] == ["p.py::test_slow", "p.py::test_fast"]
    slow = result["tests"][0]
    assert slow["seconds"] == 11.0 and slow["examples"] == 6 and slow["outcome"] == "failed"
    assert slow["phases"] == {"compile": 6.0, "kernel": 2.5, "golden": 0.0, "comparison": 1.0, "inputs": 0.0}
    assert slow[suite_table.REST] == pytest.approx(1.5)
    assert result["outside"]["seconds"] == 5.0 and result["outside"]["processes"] == 2
    assert result["total"]["seconds"] == 18.0 and result["total"]["examples"] == 10
    assert result["total"]["phases"]["compile"] == 7.0
    assert result["missing"] == ["m:f"] and result["packages"] == ["/a/fa2_verify"]


def test_markdown_has_a_row_per_test_then_outside_and_total():
    lines = suite_table.markdown(suite_table.aggregate(RECORDS)).splitlines()
    assert lines[0].startswith("| property | outcome | examples | wall s | compile s | kernel s |")
    assert [line.split(" | ")[0].lstrip("| ") for line in lines[2:]] == ["test_slow", "test_fast", OUTSIDE, "total"]
    assert "| 11.0 (61%) | 6.0 | 2.5 |" in lines[2]


def test_a_record_file_with_a_bad_line_is_a_one_line_error(tmp_path):
    (tmp_path / "gw0.jsonl").write_text(json.dumps(RECORDS[0]) + "\n{not json\n")
    with pytest.raises(UsageError, match=r"gw0.jsonl:2: not a suite-time record"):
        suite_table.read_records(tmp_path)


def test_options_after_a_double_dash_go_to_pytest():
    args = suite_time.parse(["--out", "o", "--passes", "warm", "--", "-k", "test_out", "--hypothesis-seed=1"])
    assert args.passes == ("warm",) and args.pytest_args == ["-k", "test_out", "--hypothesis-seed=1"]
    command = suite_time.pytest_command(args, pathlib.Path("records"), pathlib.Path("examples"), pathlib.Path("pc"))
    assert command[-3:] == ["-k", "test_out", "--hypothesis-seed=1"]
    assert ["-o", "cache_dir=pc"] == command[command.index("-o") : command.index("-o") + 2]
    assert ["-n", "12"] == command[command.index("-n") : command.index("-n") + 2]
    assert "benchmarks.suite_phases" in command


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--passes", "hot"], "--passes=hot: use cold, warm and cold-known"),
        (["--workers", "-1"], "--workers=-1"),
        (["--package-root", "/nonexistent"], "holds no fa2_verify package"),
    ],
)
def test_bad_options_are_one_line_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        suite_time.parse(["--out", "o", *argv])


def test_a_package_root_with_its_own_benchmarks_is_refused(tmp_path):
    (tmp_path / "fa2_verify").mkdir()
    (tmp_path / "fa2_verify" / "__init__.py").write_text("")
    (tmp_path / "benchmarks").mkdir()
    with pytest.raises(UsageError, match="would shadow"):
        suite_time.parse(["--out", "o", "--package-root", str(tmp_path)])


def test_the_cold_pass_refuses_a_given_cache_that_is_not_empty_and_empties_its_own(tmp_path):
    given = tmp_path / "given"
    given.mkdir()
    (given / "kernel.cubin").write_text("x")
    args = suite_time.parse(["--out", str(tmp_path), "--triton-cache", str(given)])
    for name in ("cold", "cold-known"):
        with pytest.raises(UsageError, match=f"the {name} pass needs an empty cache"):
            suite_time.triton_cache(args, tmp_path, name)
    assert suite_time.triton_cache(args, tmp_path, "warm") == given
    own = suite_time.parse(["--out", str(tmp_path)])
    (tmp_path / "triton-cache").mkdir()
    (tmp_path / "triton-cache" / "old").write_text("x")
    assert not any(suite_time.triton_cache(own, tmp_path, "cold").iterdir())
    (tmp_path / "triton-cache" / "old").write_text("x")
    assert not any(suite_time.triton_cache(own, tmp_path, "cold-known").iterdir())


@pytest.mark.slow
def test_a_pass_records_each_phase_under_the_property_that_spent_it_in_the_package_root_given(tmp_path):
    """The reference kernel on the CPU, one property, no xdist, a copy of the package as --package-root:
    that copy runs, and its kernel, golden, comparison and inputs time are recorded under the property."""
    root = tmp_path / "before"
    shutil.copytree(REPO / "fa2_verify", root / "fa2_verify", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "out"
    command = [sys.executable, str(REPO / "benchmarks" / "suite_time.py"), "--kernel", "reference", "--device", "cpu",
               "--profile", "dev", "--workers", "0", "--passes", "warm", "--package-root", str(root),
               "--out", str(out), "--", "-k", "test_out_within_error_model", "--fa2-dtypes=float32"]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    times = json.loads((out / "times.json").read_text())
    (warm,) = times["passes"]
    (row,) = warm["tests"]
    assert row["test"].endswith("::test_out_within_error_model[float32]") and row["outcome"] == "passed"
    assert row["examples"] > 0
    assert all(row["phases"][phase] > 0 for phase in ("kernel", "golden", "comparison", "inputs"))
    assert warm["packages"] == [str(root / "fa2_verify")]
    assert all(target.startswith("triton") for target in warm["missing"])  # Triton's only where it is absent
    assert "test_out_within_error_model" in (out / "table.md").read_text()
    assert completed.stdout.rstrip().splitlines()[-1].startswith("warm: ")


def test_time_limit_interrupts_a_pass_and_says_so(tmp_path):
    """A pass over its --time-limit gets SIGINT (pytest then reports what finished) and is marked stopped."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with (tmp_path / "log").open("w") as log:
        status, stopped = suite_time._run_limited(sleeper, tmp_path, dict(os.environ), log, 0.5)
    assert stopped and status != 0
    with (tmp_path / "log").open("w") as log:
        assert suite_time._run_limited([sys.executable, "-c", "pass"], tmp_path, dict(os.environ), log, 30) == (0, False)
    assert "stopped by --time-limit" in suite_time._stopped({"stopped_at_limit": True})
