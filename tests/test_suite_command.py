"""``fa2-verify suite``: the pytest command line it builds and its exit statuses."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from fa2_verify import properties
from fa2_verify.properties import plugin
from fa2_verify.cli.main import build_parser, main
from fa2_verify.cli.commands import suite
from fa2_verify.cli.commands.suite import pytest_arguments


def test_options_and_extra_arguments_reach_pytest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(
        ["suite", "--kernel", "triton", "--device", "cuda", "--profile", "nightly", "--dtypes", "float16", "--", "-n", "8", "-k", "dq"]
    )
    assert pytest_arguments(args) == [
        str(pathlib.Path(properties.__file__).parent),
        f"--rootdir={tmp_path}",
        "--fa2-kernel=triton",
        "--fa2-device=cuda",
        "--fa2-profile=nightly",
        "--fa2-dtypes=float16",
        "-n",
        "8",
        "-k",
        "dq",
    ]


def test_an_empty_dtypes_list_reaches_the_plugin_to_be_refused(tmp_path, monkeypatch):
    """``--dtypes "$UNSET"`` names no dtype: passed on (the plugin refuses it), never dropped for "all dtypes"."""
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["suite", "--kernel", "reference", "--dtypes", ""])
    assert pytest_arguments(args)[-1] == "--fa2-dtypes="


def test_a_usage_error_exits_2(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    assert main(["suite", "--kernel", "no-such-kernel"]) == 2
    assert "--fa2-kernel=no-such-kernel: unknown kernel" in capfd.readouterr().err


def test_a_passing_kernel_exits_0(tmp_path, monkeypatch, pytestconfig):
    """Slow by design: the command really runs the property suite in a pytest subprocess (one property, 60 examples)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(pytestconfig.rootpath))
    monkeypatch.setenv("FA2_VERIFY_GOLDEN_CACHE", str(pytestconfig.rootpath / ".fa2-golden-cache"))
    assert main(["suite", "--kernel", "reference", "--profile", "ci", "--", "-q", "-p", "no:cacheprovider", "-k", "lse_within"]) == 0


def _pytest_that(status: int, *, finishes: bool):
    """A stand-in for ``subprocess.run`` of pytest: exits with ``status``, its session finished or not."""

    def run(args, **kwargs):
        if finishes:
            pathlib.Path(kwargs["env"][plugin.FINISHED]).write_text("finished\n")
        return subprocess.CompletedProcess(args, status)

    return run


@pytest.mark.parametrize("pytest_status, status", [(0, 0), (1, 1), (2, 2), (3, 2), (4, 2), (5, 2), (-11, 2)])
def test_pytest_statuses_map_to_pass_fail_or_error(monkeypatch, capfd, pytest_status, status):
    monkeypatch.setattr(suite.subprocess, "run", _pytest_that(pytest_status, finishes=True))
    assert main(["suite", "--kernel", "reference"]) == status
    err = capfd.readouterr().err
    if status == 2:
        assert err.count("\n") == 1 and f"pytest exited with status {pytest_status} (" in err and "nothing was verified" in err
    else:
        assert err == ""


def test_a_pytest_that_exits_0_before_its_session_finished_fails_in_one_line(monkeypatch, capfd):
    """A kernel that ended pytest's process with status 0 (no in-flight record reaches pytest's status)."""
    monkeypatch.setattr(suite.subprocess, "run", _pytest_that(0, finishes=False))
    assert main(["suite", "--kernel", "reference"]) == 1
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "pytest exited with status 0 before its session finished" in err



@pytest.mark.slow
def test_a_kernel_that_exits_0_from_c_fails_the_suite(tmp_path, monkeypatch, pytestconfig, capfd):
    """tests/crashing.py ends pytest's process with status 0 on head_dim 40: the command fails in one line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(pytestconfig.rootpath))
    monkeypatch.setenv("FA2_VERIFY_GOLDEN_CACHE", str(pytestconfig.rootpath / ".fa2-golden-cache"))
    argv = ["suite", "--kernel", "tests.crashing:EXITS_0_ON_HEAD_DIM_40", "--profile", "ci", "--dtypes", "float32",
            "--", "-q", "-p", "no:cacheprovider", "-k", "test_dq_within_error_model"]
    status = main(argv)
    captured = capfd.readouterr()
    # pytest's own output in the message: a status 1 without the line is a property that failed before head_dim 40
    ended_early = "fa2-verify: error: pytest exited with status 0 before its session finished"
    assert status == 1 and ended_early in captured.err, captured.out[-4000:] + captured.err[-2000:]
