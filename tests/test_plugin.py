"""The pytest plugin end to end (``pytester``), and its small pure helpers.

Each end-to-end run is a subprocess (the plugin keeps per-process state, as
any pytest plugin that configures a session does), with the repository and
the test's own directory on ``PYTHONPATH`` so ``tests.mutants:NAME`` and a
kernel module written by the test load by ``module:attr``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase

from fa2_verify.golden import options
from fa2_verify.properties import device_pinning, inflight, plugin, profiles
from tests import autotuning, crashing

pytest_plugins = ("pytester",)

FORWARD_ONLY = '''
import dataclasses
from fa2_verify.kernels.reference import DEFERRED

class ForwardOnly:
    """The reference forward without a backward pass."""
    capabilities = dataclasses.replace(DEFERRED.capabilities, backward=False, deterministic_backward=False)

    def forward(self, q, k, v, **options):
        return DEFERRED.forward(q, k, v, **options)

KERNEL = ForwardOnly()
'''


@pytest.fixture
def run(pytester, pytestconfig, monkeypatch):
    """Run pytest in a subprocess with the plugin loaded, as an installed plugin is."""
    paths = [str(pytester.path), str(pytestconfig.rootpath), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path for path in paths if path))
    monkeypatch.setenv("FA2_VERIFY_GOLDEN_CACHE", str(pytestconfig.rootpath / options.DEFAULT_CACHE_DIR))

    def run_pytest(*args: str):
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)

    return run_pytest


BAD_OPTIONS = {
    "unknown-kernel": ("--fa2-kernel=no-such-kernel", "--fa2-kernel=no-such-kernel: unknown kernel"),
    "unknown-profile": ("--fa2-profile=weekly", "--fa2-profile=weekly: not a profile: use one of dev, ci, nightly"),
    "unknown-device": ("--fa2-kernel=reference --fa2-device=abacus", "--fa2-device=abacus: not a device"),
    "unsupported-dtype": ("--fa2-kernel=reference --fa2-dtypes=float8", "--fa2-dtypes=float8: use names from"),
    "capabilities-exit": (
        "--fa2-kernel=tests.test_registry:EXITING_CAPABILITIES", "capabilities raised SystemExit: 0"
    ),
    "unavailable-reason-interrupt": (
        "--fa2-kernel=tests.test_registry:INTERRUPTED_UNAVAILABLE_REASON", "unavailable_reason() raised KeyboardInterrupt"
    ),
    "config-exit": ("--fa2-kernel=tests.test_registry:EXITING_CONFIG", "config() raised SystemExit: 0"),
    "empty-kernel": ("--fa2-kernel=", "--fa2-kernel=: unknown kernel ''"),
    "empty-profile": ("--fa2-profile=", "--fa2-profile=: not a profile"),
    "empty-examples-dir": ("--fa2-examples-dir=", "--fa2-examples-dir=: names no directory"),
    "zero-call-timeout": ("--fa2-kernel=reference --fa2-call-timeout=0", "--fa2-call-timeout=0: '0' is not a number"),
    "zero-time-budget": ("--fa2-kernel=reference --fa2-time-budget=0", "--fa2-time-budget=0: "),
    "zero-shape-classes": ("--fa2-kernel=reference --fa2-shape-classes=0", "--fa2-shape-classes=0: is not a whole"),
    "shape-classes-without-kernel": ("--fa2-shape-classes=2", "--fa2-shape-classes needs --fa2-kernel=NAME|module:attr"),
    "empty-failures": ("--fa2-kernel=reference --fa2-failures=", "--fa2-failures=: names no file"),
    "time-budget-without-kernel": ("--fa2-time-budget=60", "--fa2-time-budget needs --fa2-kernel=NAME|module:attr"),
    "device-without-kernel": ("--fa2-device=cpu", "--fa2-device needs --fa2-kernel=NAME|module:attr"),
    "bounds-check-without-kernel": ("--fa2-bounds-check", "--fa2-bounds-check needs --fa2-kernel=NAME|module:attr"),
    "shard-zero": ("--fa2-kernel=reference --fa2-shard=0/2", "--fa2-shard=0/2: names shard 0 of 2: shards are numbered 1 to 2"),
    "shard-past-the-last": ("--fa2-kernel=reference --fa2-shard=3/2", "--fa2-shard=3/2: names shard 3 of 2"),
    "shard-not-numbers": ("--fa2-kernel=reference --fa2-shard=a/b", "--fa2-shard=a/b: is not I/N"),
    "shard-without-kernel": ("--fa2-shard=1/2", "--fa2-shard needs --fa2-kernel=NAME|module:attr"),
    "bounds-check-without-interpreter": (
        "--fa2-kernel=reference --fa2-bounds-check", "--fa2-bounds-check needs TRITON_INTERPRET=1 set before the process starts"
    ),
}


@pytest.mark.parametrize("option, message", BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_bad_option_values_are_usage_errors(run, pytester, option, message):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = run(*option.split(" "))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_an_empty_device_is_a_usage_error_not_the_default(run, pytester):
    """``--fa2-device "$UNSET"`` in a CI script names no device: it must not run on the default cpu."""
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = run("--fa2-kernel=reference", "--fa2-device=")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fa2-device=: not a device*"])


def test_the_property_suite_without_a_kernel_is_an_error_naming_the_flag(run):
    """Without --fa2-kernel nothing is verified: no property passes on a kernel the user did not name."""
    result = run("--pyargs", "fa2_verify.properties", "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["the property suite needs --fa2-kernel=NAME|module:attr*"])
    assert "test_out_within_error_model" not in result.stdout.str()


def test_a_module_that_exits_on_import_is_a_usage_error(run, pytester):
    pytester.makepyfile(exits_on_import="import sys\nsys.exit(0)\n", test_nothing="def test_nothing():\n    pass\n")
    result = run("--fa2-kernel=exits_on_import:KERNEL")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fa2-kernel=exits_on_import:KERNEL*cannot import module*SystemExit: 0*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_bounds_check_fails_a_stray_read_that_passes_without_it(run, monkeypatch):
    """``--fa2-bounds-check``: a kernel that reads one element before q fails with the access and the case;
    the same run without the flag passes (the stray value never reaches an output)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    suite = ("--pyargs", "fa2_verify.properties", "-k", "test_out_within_error_model",
             "--fa2-kernel=tests.stray_read:KERNEL", "--fa2-profile=ci", "--fa2-dtypes=float32")
    unchecked = run(*suite)
    assert unchecked.ret == pytest.ExitCode.OK, unchecked.stdout.str()[-2000:]
    checked = run(*suite, "--fa2-bounds-check")
    assert checked.ret == pytest.ExitCode.TESTS_FAILED
    checked.stdout.fnmatch_lines(["*load of 1 element(s) outside every tensor argument, the first 4 bytes before*",
                                  "*fa2-verify repro --kernel tests.stray_read:KERNEL*"])


@pytest.mark.parametrize(
    "mutant, test, raised",
    [("BACKWARD_EXITS", "test_dq_within_error_model", "backward raised SystemExit: 0"),
     ("CAUSAL_OS_EXITS", "test_out_within_error_model", "forward raised KernelExited: the kernel called os._exit(0)")],
    ids=["sys-exit", "os-exit"],
)
def test_a_kernel_that_exits_fails_the_property_naming_it(run, mutant, test, raised):
    result = run(
        "--pyargs", "fa2_verify.properties", "-k", test,
        f"--fa2-kernel=tests.mutants:{mutant}", "--fa2-profile=ci", "--fa2-dtypes=float32",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"*tests.mutants:{mutant}.{raised}*", "*1 failed*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_suite_runs_skips_missing_capabilities_and_reports_across_workers(run, pytester):
    pytester.makepyfile(forward_only=FORWARD_ONLY)
    result = run(
        "--pyargs", "fa2_verify.properties", "-k", "within_error_model", "--fa2-kernel=forward_only:KERNEL", "--fa2-profile=ci", "--fa2-dtypes=float32,float64", "-n", "2", "-rs"
    )
    result.assert_outcomes(passed=4, skipped=8)
    budget = profiles.get("ci").max_examples
    result.stdout.fnmatch_lines(
        [
            "*fa2-verify property suite*",
            f"{2 * budget} examples checked in * s of test time (* examples/s per worker)",
            "where it went: inputs * s, kernel * s, golden * s, comparison * s (kernel, golden and comparison of *)",
            "unsupported: 3 properties: forward_only:KERNEL lacks the capability 'backward'",
            "unsupported: 1 property: forward_only:KERNEL lacks the capability 'varlen'",
            f"worst lse in test_lse_within_error_model: * over {budget} examples",
            "    fa2-verify repro --kernel forward_only:KERNEL --device cpu --case *",
            f"worst out in test_out_within_error_model: * over {budget} examples",
            "SKIPPED [[]6[]] *: unsupported: forward_only:KERNEL lacks the capability 'backward'",
        ]
    )


def test_a_run_whose_every_property_is_unsupported_verified_nothing_and_does_not_exit_0(run, pytester):
    pytester.makepyfile(forward_only=FORWARD_ONLY)
    result = run("--pyargs", "fa2_verify.properties", "-k", "dq_within or dk_within", "--fa2-kernel=forward_only:KERNEL",
                 "--fa2-dtypes=float32")
    result.assert_outcomes(skipped=2)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["nothing was verified: every property test was skipped as unsupported (exit status 5)"])


def test_suite_verifies_a_bhsd_autograd_kernel_without_lse(run):
    """tests/user_kernels.py: one autograd_target call; the LSE properties are skipped with the reason."""
    kernel = "tests.user_kernels:BHSD_NO_LSE"
    result = run(
        "--pyargs", "fa2_verify.properties", "-k", "out_within or lse_within or lse_shifts or dq_within",
        f"--fa2-kernel={kernel}", "--fa2-profile=dev", "--hypothesis-seed=0", "-rs",
    )  # fmt: skip
    result.assert_outcomes(passed=4, skipped=4)
    result.stdout.fnmatch_lines(
        [f"unsupported: 2 properties: {kernel}: kernel provides no LSE", "SKIPPED [[]4[]] *kernel provides no LSE"]
    )


def test_suite_draws_only_multiples_for_a_kernel_that_needs_them(run):
    """tests/user_kernels.py: a kernel that raises on a length not a multiple of 16, declared in a plain dict."""
    result = run(
        "--pyargs", "fa2_verify.properties", "-k", "out_within or lse_within or causal_prefix",
        "--fa2-kernel=tests.user_kernels:MULTIPLE_OF_16", "--fa2-profile=dev", "--hypothesis-seed=0",
    )  # fmt: skip
    result.assert_outcomes(passed=6)


def test_alluredir_gets_one_result_per_property_with_histograms_and_data(run, pytester):
    """Each property test is one Allure result, labelled, with attachments made once per test."""
    results = pytester.path / "allure-results"
    outcome = run("--pyargs", "fa2_verify.properties", "-k", "out_within_error_model", "--fa2-kernel=reference", "--fa2-profile=dev",
                  "--fa2-dtypes=float32", f"--alluredir={results}")
    outcome.assert_outcomes(passed=1)
    (record,) = [json.loads(path.read_text()) for path in results.glob("*-result.json")]
    labels = {label["name"]: label["value"] for label in record["labels"]}
    assert labels["kernel"] == "reference" and labels["device"] == "cpu"
    attached = [attachment["name"] for attachment in record["attachments"]]
    assert "error histogram: out" in attached and len(attached) == len(set(attached))
    assert any(name.endswith(".csv") for name in attached)


SHARDED = ("test_golden.py::test_out_within_error_model[float32]", "test_golden.py::test_out_within_error_model[float16]",
           "test_golden.py::test_varlen_outputs_within_error_model[float16]",
           "test_golden.py::test_varlen_outputs_within_error_model[float32]")


def _allure_statuses(directory: pathlib.Path) -> dict[str, str]:
    results = [json.loads(path.read_text()) for path in directory.glob("*-result.json")]
    return {result["fullName"]: result["status"] for result in results}


@pytest.mark.slow
def test_two_shards_run_each_test_once_and_merge_into_the_unsharded_runs_verdicts(pytester, pytestconfig, monkeypatch):
    """``--fa2-shard 1/2`` and ``2/2`` split a ``-k`` selection of the ``ci`` profile on the recorded durations
    (the longest test alone in shard 1, the three short ones in shard 2), and their Allure results merge into
    the same tests with the same statuses as the unsharded run's (the varlen tests, skipped as unsupported,
    included)."""
    from fa2_verify.cli import main as cli
    from fa2_verify.records import allure_merge
    from tests.test_report_allure import FAKE_ALLURE_3

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(pytestconfig.rootpath)]))
    monkeypatch.setenv("FA2_VERIFY_GOLDEN_CACHE", str(pytestconfig.rootpath / options.DEFAULT_CACHE_DIR))
    recorded = {SHARDED[0]: [100.0], **{test: [1.0] for test in SHARDED[1:]}}
    (pytester.path / "durations.json").write_text(json.dumps({"reference cpu ci": recorded}))
    args = ("--pyargs", "fa2_verify.properties", "-k", "out_within_error_model or varlen",
            "--fa2-kernel=reference", "--fa2-profile=ci", "--fa2-dtypes=float16,float32",
            "--fa2-durations=durations.json")
    whole = pytester.runpytest_subprocess(*args, "--alluredir=whole")
    whole.assert_outcomes(passed=2, skipped=2)
    shards = [pytester.runpytest_subprocess(*args, f"--fa2-shard={index}/2", f"--alluredir=shard{index}")
              for index in (1, 2)]
    shards[0].assert_outcomes(passed=1)
    shards[1].assert_outcomes(passed=1, skipped=2)
    assert _allure_statuses(pytester.path / "shard1") == {"test_golden#test_out_within_error_model[float32]": "passed"}
    fake_allure = pytester.path / "fake-allure"
    fake_allure.write_text(FAKE_ALLURE_3)
    fake_allure.chmod(0o755)
    merged = pytester.path / "merged"
    assert cli.main(["report", "shard1", "shard2", "--out", "report", "--merged-results", str(merged),
                     "--allure", str(fake_allure)]) == 0
    assert len(_allure_statuses(merged)) == 4 and _allure_statuses(merged) == _allure_statuses(pytester.path / "whole")
    whole_run = allure_merge.read_run(pytester.path / "whole")
    assert whole_run == {"kernel": "reference", "device": "cpu", "profile": "ci", "dtypes": "float16,float32",
                         "shard": "1/1"}
    assert allure_merge.read_run(merged) == {**whole_run, "merged_shards": "2"}


def test_failure_shrinks_and_prints_the_one_line_reproduction(run):
    result = run("--pyargs", "fa2_verify.properties", "-k", "lse_within", "--fa2-kernel=tests.mutants:LSE_BASE2", "--fa2-profile=ci",
                 "--fa2-dtypes=float32")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*lse (float32) mismatches the golden in 1 of 1 elements*",
            "*reproduce: fa2-verify repro --kernel tests.mutants:LSE_BASE2 --device cpu --case '{*\"seqlen_k\": 1, \"seqlen_q\": 1*}'",
            "*@reproduce_failure(*",
        ]
    )


@pytest.mark.slow
def test_a_kernel_error_is_reported_once_and_hides_no_value_failure(run, pytester):
    """tests/breakers.py: CompilationError below head_dim 9 (declared) and a base-2 LSE.  The first property
    reports the error, the second leaves its head dims alone and fails on the LSE; the summary names the
    error once, in the kernel's terms; each failure is in the failure log."""
    kernel = "tests.breakers:SMALL_HEAD_DIMS_FAIL_LSE_BASE2"
    failures = pytester.path / "failures.jsonl"
    result = run("--pyargs", "fa2_verify.properties", "-k", "test_out_within_error_model or test_lse_within_error_model",
                 f"--fa2-kernel={kernel}", "--fa2-profile=ci", "--fa2-dtypes=float32", f"--fa2-failures={failures}")
    result.assert_outcomes(failed=2)
    output = result.stdout.str()
    out_failure, lse_failure = (output.split(f"_ {name}[float32] _")[1] for name in ("test_out_within_error_model",
                                                                                   "test_lse_within_error_model"))
    lse_failure = lse_failure.split("fa2-verify property suite")[0]
    assert "KernelError[forward raised CompilationError]" in out_failure.split(f"_ test_lse_within")[0]
    assert "CompilationError" not in lse_failure and "lse (float32) mismatches the golden" in lse_failure
    summary = [line for line in output.splitlines() if line.startswith("kernel error: ")]
    assert len(summary) == 1 and summary[0].startswith(
        f"kernel error: {kernel} declares head_dim 1..512; its forward raises CompilationError for head_dim <= 8 ("
    ), summary
    assert "reported once, by test_out_within_error_model[float32]" in summary[0]
    logged = [json.loads(line) for line in failures.read_text().splitlines()]
    assert {(record["test"], record["stage"], record["failure"]) for record in logged} == {
        (f"{name}[float32]", stage, failure)
        for name, failure in (("test_out_within_error_model", "KernelError[forward raised CompilationError]"),
                              ("test_lse_within_error_model", "PropertyFailure"))
        for stage in ("found", "last")
    }


def test_a_time_budget_ends_a_property_early_with_its_example_count(run):
    result = run("--pyargs", "fa2_verify.properties", "-k", "test_out_within_error_model",
                 "--fa2-kernel=reference", "--fa2-profile=ci", "--fa2-dtypes=float32", "--fa2-time-budget=0.5")
    result.assert_outcomes(passed=1)
    (line,) = [line for line in result.stdout.lines if line.startswith("examples of test_out_within_error_model: ")]
    assert line.endswith("; stopped at its time share of 0.5 s: float32"), line
    assert 1 <= int(line.split(": ")[1].split(" ")[0]) < profiles.get("ci").max_examples, line


CRASHING = "tests.crashing:ABORTS_ON_HEAD_DIM_40"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_a_kernel_that_kills_the_process_is_named_with_its_case_and_fails_the_run(pytester, pytestconfig, workers):
    """tests/crashing.py aborts in its backward on head_dim 40: the run names that case, by a reproduction that
    aborts again, and exits non-zero; with xdist in the controller's summary, without it from the watcher.

    ``subprocess.run`` with pipes, not ``runpytest_subprocess``: it waits for the watcher, which outlives pytest.
    """
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(pytestconfig.rootpath), os.environ.get("PYTHONPATH", "")]),
        "FA2_VERIFY_GOLDEN_CACHE": str(pytestconfig.rootpath / options.DEFAULT_CACHE_DIR),
    }
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "fa2_verify.properties",
        "-k", "test_dq_within_error_model", f"--fa2-kernel={CRASHING}", "--fa2-profile=ci", "--fa2-dtypes=float32",
        *workers,
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, cwd=pytester.path, env=environment, timeout=300)
    assert completed.returncode != 0
    (died,) = [line for line in (completed.stdout + completed.stderr).splitlines() if " died while running " in line]
    assert f"died while running {CRASHING} on cpu in test_dq_within_error_model[float32], on this case: " in died
    reproduction = died.split("on this case: ")[1]
    case = json.loads(reproduction.split("--case '")[1].split("'")[0])
    assert case["head_dim"] == crashing.FATAL_HEAD_DIM and case["backward"]
    replay = subprocess.run(
        [sys.executable, "-m", "fa2_verify", "repro", "--kernel", CRASHING, "--case", json.dumps(case), "--device", "cpu"],
        capture_output=True, text=True, cwd=pytester.path, env=environment, timeout=120,
    )  # fmt: skip
    assert replay.returncode == 1 and "the process running the kernel ended (signal 6, SIGABRT)" in replay.stderr


LEAVES_A_RECORD = """
from fa2_verify.properties import inflight_session

def test_leaves_a_record(pytestconfig):
    record = {"kernel": "k", "device": "cpu", "test": "test_x", "case": {}, "reproduction": "fa2-verify repro"}
    inflight_session.inflight_of(pytestconfig).begin(**record)
"""


def test_a_record_left_when_the_session_ends_is_reported_and_fails_a_run_that_passed(run, pytester):
    """A record nobody withdrew is a process that died in the kernel: named in the summary, exit status 1."""
    pytester.makepyfile(test_leaves=LEAVES_A_RECORD)
    result = run()
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*fa2-verify property suite*", "the process (main, pid *) died while running k on cpu in test_x, on this case: fa2-verify repro"]
    )


EXITS_0 = """
import ctypes

def test_exits_0():
    ctypes.CDLL(None)._exit(0)
"""


@pytest.mark.parametrize("exits", [False, True], ids=["finishes", "exits-0"])
def test_a_session_writes_its_finished_file_only_if_it_finishes(run, pytester, monkeypatch, exits):
    """``fa2-verify suite`` tells a pytest that exited 0 from one that finished by this file: a process ended
    from C (no ``os._exit`` to stand in for) exits 0 without it."""
    finished = pytester.path / "finished"
    monkeypatch.setenv(plugin.FINISHED, str(finished))
    pytester.makepyfile(test_it=EXITS_0 if exits else "def test_plain():\n    pass\n")
    result = run()
    assert result.ret == pytest.ExitCode.OK
    assert finished.exists() is not exits


WORKERS_EXIT_0 = """
import ctypes

def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        ctypes.CDLL(None)._exit(0)
"""


@pytest.mark.slow
def test_an_xdist_worker_that_exits_0_between_tests_fails_a_property_run(run, pytester):
    """xdist replaces a worker that went down outside a test and reports no failure (exit 0); in a run of the
    property suite it is one: the summary names it and the run exits 1."""
    pytester.makeconftest(WORKERS_EXIT_0)
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = run("--fa2-kernel=reference", "-n", "1", "--max-worker-restart=0")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*fa2-verify property suite*",
                                 "worker gw0 went down before the session ended (*): what it ran after its last "
                                 "report was not verified"])


def test_an_in_flight_record_lives_exactly_as_long_as_its_example(tmp_path):
    """Written before the kernel runs, replaced by the next example's, removed when the example ends."""
    session = tmp_path / "session"
    records = inflight.InFlight(session, "gw3")
    assert inflight.left_behind(session) == []
    for seed in (1, 2):
        records.begin(kernel="k", device="cpu", test="test_x", case={"seed": seed}, reproduction=f"repro {seed}")
    (record,) = inflight.left_behind(session)
    assert (record.worker, record.pid, record.case, record.reproduction) == ("gw3", os.getpid(), {"seed": 2}, "repro 2")
    assert record.message().startswith(f"the process (gw3, pid {os.getpid()}) died while running k on cpu in test_x")
    records.end()
    assert inflight.left_behind(session) == []
    records.close()
    assert not session.exists()


def test_plugin_is_inert_in_other_test_suites(run, pytester):
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = run()
    result.assert_outcomes(passed=1)
    assert "fa2-verify property suite" not in result.stdout.str()


def test_the_plugin_fixture_does_not_answer_another_suites_fixture_name(run, pytester):
    """A test of another suite asking for a ``suite`` it never defined gets pytest's "not found", not ours."""
    pytester.makepyfile(test_theirs="def test_theirs(suite):\n    pass\n")
    result = run()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'suite' not found*"])


def test_a_suite_with_its_own_device_and_kernel_options_still_starts(run, pytester):
    """The plugin's options are namespaced (``--fa2-*``), so a conftest may define ``--device`` and ``--kernel``."""
    pytester.makeconftest(
        "def pytest_addoption(parser):\n"
        "    parser.addoption('--device', default='cpu')\n"
        "    parser.addoption('--kernel', default='mine')\n"
    )
    pytester.makepyfile(
        test_own="def test_own(pytestconfig):\n"
        "    assert (pytestconfig.getoption('device'), pytestconfig.getoption('kernel')) == ('meta', 'mine')\n"
    )
    result = run("--device", "meta")
    result.assert_outcomes(passed=1)


def test_importing_the_plugin_is_cheap():
    probe = "import sys, fa2_verify.properties.plugin; print(sorted(m for m in ('torch', 'hypothesis') if m in sys.modules))"
    output = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


WORKERS = {
    "cpu-stays": ("cpu", "gw1", 4, "cpu"),
    "controller-stays": ("cuda", None, 4, "cuda"),
    "single-gpu-stays": ("cuda", "gw3", 1, "cuda"),
    "explicit-index-stays": ("cuda:1", "gw0", 4, "cuda:1"),
    "worker-pinned": ("cuda", "gw1", 4, "cuda:1"),
    "more-workers-than-gpus-wrap": ("cuda", "gw5", 4, "cuda:1"),
}


@pytest.mark.parametrize("device, worker, count, expected", WORKERS.values(), ids=WORKERS.keys())
def test_worker_device(device, worker, count, expected):
    assert device_pinning.worker_device(device, worker, count) == expected


@pytest.mark.parametrize("cpus, workers, expected", [(64, 20, 3), (2, 2, 1), (2, 4, 1), (16, 1, 16)])
def test_worker_threads_share_the_cores(cpus, workers, expected):
    assert device_pinning.worker_threads(cpus, workers) == expected


def test_worker_share_applies_to_xdist_workers_unless_omp_num_threads_is_set(monkeypatch):
    monkeypatch.delenv(device_pinning.THREADS_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert device_pinning.worker_share(None) is None
    assert device_pinning.worker_share({"workerid": "gw0", "workercount": 2}) == 4
    monkeypatch.setenv(device_pinning.THREADS_ENV, "3")
    assert device_pinning.worker_share({"workerid": "gw0", "workercount": 2}) is None


def test_golden_cache_is_shared_under_the_rootdir_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv(options.CACHE_ENV, raising=False)
    assert options.shared_cache_dir(tmp_path) == tmp_path / ".fa2-golden-cache"
    monkeypatch.setenv(options.CACHE_ENV, str(tmp_path / "mine"))
    assert options.shared_cache_dir(tmp_path) == tmp_path / "mine"


def test_ci_profile_is_derandomized_without_database_and_prints_blobs(tmp_path):
    ci = profiles.settings_for(profiles.get("ci"), database_dir=tmp_path)
    assert ci.derandomize and ci.database is None and ci.print_blob and ci.deadline is None


@pytest.mark.parametrize("name", ["dev", "nightly"])
def test_random_profiles_keep_their_database_when_ci_is_set(monkeypatch, tmp_path, name):
    monkeypatch.setenv("CI", "true")
    chosen = profiles.settings_for(profiles.get(name), database_dir=tmp_path / "examples")
    assert isinstance(chosen.database, DirectoryBasedExampleDatabase)
    assert pathlib.Path(chosen.database.path) == tmp_path / "examples" and not chosen.derandomize
    assert profiles.get("nightly").max_examples > 10 * profiles.get("ci").max_examples


def test_shards_split_the_budget_and_draw_apart():
    """One shard per dtype; their budgets add up to the profile's; under one run seed each shard has its own."""
    from fa2_verify.properties.harness import Shard, shard_seed, shards
    from fa2_verify.properties.test_golden import test_out_within_error_model as prop

    ci, dev = profiles.get("ci"), profiles.get("dev")
    split = shards(prop, ci, ("float16", "bfloat16", "float32", "float64", "float8"), run_seed=None)
    assert [shard.dtype for shard in split] == ["float16", "bfloat16", "float32", "float64", "float8"]
    assert sum(shard.max_examples for shard in split) == ci.max_examples
    assert max(shard.max_examples for shard in split) - min(shard.max_examples for shard in split) <= 1
    assert len({shard.seed for shard in split}) == len(split) and None not in {shard.seed for shard in split}
    assert shards(prop, ci, ("float32",), run_seed=7) == shards(prop, ci, ("float32",), run_seed=None)
    assert all(shard.seed is None for shard in shards(prop, dev, ("float32", "float64"), run_seed=None))
    seeded = shards(prop, dev, ("float32", "float64"), run_seed="3")
    assert seeded != shards(prop, dev, ("float32", "float64"), run_seed="4") and None not in {s.seed for s in seeded}
    assert shard_seed(prop.name, "float32", derandomize=False, run_seed="3") == seeded[0].seed
    assert shards(prop, ci, (), run_seed=None) == [Shard(None, ci.max_examples, None)]
    assert split[0].test_name(prop.name) == "test_out_within_error_model[float16]"


def test_each_dtype_is_a_test_of_its_own(run):
    """The shards are collected as ``test_<property>[<dtype>]``, in the order of --fa2-dtypes."""
    result = run("--pyargs", "fa2_verify.properties", "-k", "out_within_error_model", "--fa2-kernel=reference",
                 "--fa2-dtypes=float64,float32",
                 "--collect-only", "-q")  # fmt: skip
    result.stdout.fnmatch_lines(
        ["*test_golden.py::test_out_within_error_model[[]float64[]]", "*test_golden.py::test_out_within_error_model[[]float32[]]"]
    )


def test_the_property_tests_run_dtype_major_and_other_tests_keep_their_place(run, pytester):
    """Every property's first-dtype shard comes before any second-dtype shard (so pytest-xdist, which hands a
    worker consecutive tests, does not give one worker a property's shards back to back); a test of another
    suite collected in the same run stays where it was."""
    pytester.makepyfile(test_zz_plain="def test_plain():\n    pass\n")
    result = run("--pyargs", "fa2_verify.properties", str(pytester.path / "test_zz_plain.py"),
                 "-k", "within_error_model or plain", "--fa2-kernel=reference", "--fa2-dtypes=float64,float32",
                 "--collect-only", "-q")  # fmt: skip
    names = [line.split("::")[-1] for line in result.stdout.lines if "::" in line]
    dtypes = [name[name.index("[") + 1 : -1] for name in names if "[" in name]
    assert names[-1] == "test_plain" and len(dtypes) > 4, names
    assert dtypes == sorted(dtypes, key=("float64", "float32").index), names
    first = [name.split("[")[0] for name in names if name.endswith("[float64]")]
    assert first == [name.split("[")[0] for name in names if name.endswith("[float32]")]


ORDER_PROBE = '''
import json, os, pathlib
import pytest

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Write the final order of the collection (one file per process) and run nothing."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    pathlib.Path(f"order-{worker}.json").write_text(json.dumps([item.nodeid.split("/")[-1] for item in items]))
    items[:] = []
'''


def test_a_run_records_its_property_tests_durations_in_pytests_cache(pytester, pytestconfig, monkeypatch):
    """Without ``-p no:cacheprovider`` a run appends each property test's seconds to pytest's cache, under its
    kernel, device and profile (what the next xdist run balances on); other tests are not recorded."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(pytestconfig.rootpath)]))
    pytester.makepyfile(test_zz_plain="def test_plain():\n    pass\n")
    args = ("--pyargs", "fa2_verify.properties", str(pytester.path / "test_zz_plain.py"), "-k",
            "test_out_independent_across_batch or plain", "--fa2-kernel=reference", "--fa2-dtypes=float64")
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=2)
    stored = json.loads((pytester.path / ".pytest_cache" / "v" / "fa2_verify" / "durations").read_text())
    assert list(stored) == ["reference cpu dev"]
    (test, seconds), = stored["reference cpu dev"].items()
    assert test == "test_metamorphic.py::test_out_independent_across_batch[float64]"
    assert len(seconds) == 1 and seconds[0] > 0


def test_xdist_workers_order_the_property_tests_on_the_recorded_durations(pytester, pytestconfig, monkeypatch):
    """Under ``--dist worksteal`` the controller passes the recorded durations to its workers, and each worker
    orders the collection the same way: the longest test opens the first worker's run, the shortest follows
    (a test never recorded is estimated at the median of those recorded)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(pytestconfig.rootpath)]))
    pytester.makepyfile(order_probe=ORDER_PROBE)
    long_test, short_test = "test_golden.py::test_dq_within_error_model[float32]", "test_golden.py::test_out_within_error_model[float64]"
    recorded = {long_test: [2.0, 100.0], short_test: [0.5]}
    cache = pytester.path / ".pytest_cache" / "v" / "fa2_verify"
    cache.mkdir(parents=True)
    (cache / "durations").write_text(json.dumps({"reference cpu dev": recorded}))
    args = ("--pyargs", "fa2_verify.properties", "-p", "order_probe", "-k", "within_error_model",
            "--fa2-kernel=reference", "--fa2-dtypes=float64,float32")
    pytester.runpytest_subprocess(*args, "-n", "2", "--dist", "worksteal")
    orders = [json.loads((pytester.path / f"order-gw{worker}.json").read_text()) for worker in range(2)]
    assert orders[0] == orders[1] and len(orders[0]) > 4
    assert orders[0][:2] == [long_test, short_test]


def test_a_durations_file_orders_a_first_run_and_a_bad_one_is_a_usage_error(pytester, pytestconfig, monkeypatch):
    """``--fa2-durations FILE`` (a copy of the cache's records) orders a run whose cache holds none; a file that
    is not such a copy, or the option without ``--fa2-kernel``, is a one-line usage error."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(pytestconfig.rootpath)]))
    pytester.makepyfile(order_probe=ORDER_PROBE)
    long_test, short_test = "test_golden.py::test_dq_within_error_model[float32]", "test_golden.py::test_out_within_error_model[float64]"
    recorded = {long_test: [100.0], short_test: [0.5]}
    (pytester.path / "durations.json").write_text(json.dumps({"reference cpu dev": recorded}))
    args = ("--pyargs", "fa2_verify.properties", "-p", "order_probe", "-k", "within_error_model",
            "--fa2-kernel=reference", "--fa2-dtypes=float64,float32")
    pytester.runpytest_subprocess(*args, "-n", "2", "--dist", "worksteal", "--fa2-durations=durations.json")
    assert json.loads((pytester.path / "order-gw0.json").read_text())[:2] == [long_test, short_test]
    (pytester.path / "bad.json").write_text("[]")
    for bad in (("--fa2-durations=bad.json", "--fa2-kernel=reference"), ("--fa2-durations=durations.json",)):
        result = pytester.runpytest_subprocess("--pyargs", "fa2_verify.properties", *bad)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert "--fa2-durations" in result.stderr.str() and "Traceback" not in result.stderr.str()


@pytest.mark.slow
def test_shape_classes_bound_what_a_per_shape_kernel_compiles_and_a_budget_keeps_the_failure(run, pytester, monkeypatch):
    """tests/autotuning.py sleeps on each new shape class and scales ``out``: with ``--fa2-shape-classes=2``
    each property test compiles at most 2 classes yet runs more examples; under a budget of 2 s the lse test
    stops at its share of 1 s and the out failure is logged, found and minimal (shrinking, within its 2 classes,
    is not cut short)."""
    compiled, failures = pytester.path / "compiled.jsonl", pytester.path / "failures.jsonl"
    monkeypatch.setenv(autotuning.LOG_ENV, str(compiled))
    result = run("--pyargs", "fa2_verify.properties", "-k", "test_out_within_error_model or test_lse_within_error_model",
                 "--fa2-kernel=tests.autotuning:AUTOTUNES_OUT_OFF", "--fa2-profile=ci", "--fa2-dtypes=float32",
                 "--fa2-shape-classes=2", "--fa2-time-budget=2", f"--fa2-failures={failures}")  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    assert len(compiled.read_text().splitlines()) <= 2 * 2
    counts = {line.split(":")[0]: line for line in result.stdout.lines if line.startswith("examples of ")}
    lse = counts["examples of test_lse_within_error_model"]
    assert lse.endswith("stopped at its time share of 1 s: float32") and int(lse.split(": ")[1].split(" ")[0]) > 2, lse
    assert float(lse.split(" in ")[1].split(" s")[0]) < 1 + 2 * autotuning.TUNE_SECONDS, lse
    logged = [json.loads(line) for line in failures.read_text().splitlines()]
    assert {(record["test"], record["stage"]) for record in logged} == {
        ("test_out_within_error_model[float32]", "found"), ("test_out_within_error_model[float32]", "last")
    }
