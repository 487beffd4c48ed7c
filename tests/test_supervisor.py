"""The ``fa2-verify`` command as installed (``cli.supervisor``): a kernel that ends the process without
raising (a native ``exit(0)``, a signal to itself, its output closed) makes the command fail in one line,
never exit 0; the command's own statuses and Ctrl-C pass through unchanged.

End to end, each test runs ``python -m fa2_verify`` on a small case; the kernels that end the process are
``tests.crashing`` (on head_dim 40) and this module's (loaded as ``tests.test_supervisor:NAME``).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from fa2_verify.cli import supervisor
from fa2_verify.kernels.reference import DEFERRED
from tests import crashing
from tests.helpers import default_sigint

REPO = pathlib.Path(__file__).resolve().parents[1]
#: A case on which the kernels of tests.crashing end the process (head_dim 40), and one on which they pass.
FATAL = {"batch": 1, "seqlen_q": 2, "seqlen_k": 2, "heads_q": 1, "heads_kv": 1, "head_dim": crashing.FATAL_HEAD_DIM,
         "dtype": "float32", "backward": True}  # fmt: skip
HARMLESS = {**FATAL, "head_dim": 32}
#: The environment variable holding the test runner's pid, which no kernel here signals.
RUNNER_PID = "FA2_VERIFY_TEST_RUNNER_PID"


class EndsItsProcess:
    """The reference whose forward ends the process by ``how`` without raising: ``sigkill`` (a signal to
    itself), ``close-stdout`` (printing the table fails: a traceback), ``sigterm-parent`` (SIGTERM to the
    supervising parent, as a user's ``kill`` would be), ``ctrl-c-group`` (SIGINT to the whole process
    group, as a Ctrl-C at the terminal reaches the parent and the child alike)."""

    capabilities = DEFERRED.capabilities

    def __init__(self, how: str) -> None:
        self.how = how

    def forward(self, q, k, v, **masking):
        if self.how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.how == "close-stdout":
            os.close(1)
        elif self.how == "sigterm-parent":
            if os.getppid() == int(os.environ[RUNNER_PID]):
                raise RuntimeError("no supervisor: this kernel would terminate the test runner")
            os.kill(os.getppid(), signal.SIGTERM)
            signal.pause()
        elif self.how == "ctrl-c-group":
            os.killpg(0, signal.SIGINT)
        return DEFERRED.forward(q, k, v, **masking)


SIGKILL = EndsItsProcess("sigkill")
CLOSES_STDOUT = EndsItsProcess("close-stdout")
TERMINATES_ITS_PARENT = EndsItsProcess("sigterm-parent")
CTRL_C_AT_THE_TERMINAL = EndsItsProcess("ctrl-c-group")


def _fa2_verify(*argv: str, cwd: pathlib.Path = REPO, path: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python -m fa2_verify ARGV`` in its own session (a signal to its group reaches nothing else), SIGINT
    at its default whatever this process inherited."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *path]), RUNNER_PID: str(os.getpid())}
    return subprocess.run([sys.executable, "-m", "fa2_verify", *argv], capture_output=True, text=True,
                          env=environment, cwd=cwd, timeout=120, start_new_session=True, preexec_fn=default_sigint)


def _last_line(completed: subprocess.CompletedProcess) -> str:
    return completed.stderr.splitlines()[-1]


def ended(how: str, command: str) -> str:
    return (f"fa2-verify: error: the process running the kernel ended ({how}) before {command} finished; "
            "nothing after the last announced case was verified")


@pytest.mark.parametrize(
    "kernel, how",
    [("tests.crashing:EXITS_0_ON_HEAD_DIM_40", "exit 0"), ("tests.crashing:ABORTS_ON_HEAD_DIM_40", "signal 6, SIGABRT"),
     ("tests.test_supervisor:SIGKILL", "signal 9, SIGKILL"), ("tests.test_supervisor:CLOSES_STDOUT", "exit 1")],
    ids=["native-exit-0", "abort", "sigkill", "closes-stdout"],
)
def test_repro_fails_in_one_line_when_the_kernel_ends_the_process(kernel, how):
    completed = _fa2_verify("repro", "--kernel", kernel, "--case", json.dumps(FATAL))
    assert completed.returncode == 1 and completed.stdout == ""
    assert _last_line(completed) == ended(how, "repro")


def test_run_writes_no_report_and_fails_when_the_kernel_exits_0(tmp_path):
    completed = _fa2_verify("run", "--kernel", "tests.crashing:EXITS_0_ON_HEAD_DIM_40", "--case", "fp32-none-gqa",
                            "--report", str(tmp_path))  # fmt: skip
    assert completed.returncode == 1 and not (tmp_path / "tolerance.json").exists()
    assert completed.stderr.splitlines()[-2:] == ["fa2-verify: running case 1 of 1: fp32-none-gqa", ended("exit 0", "run")]


def test_kernels_fails_when_a_module_exits_0_on_import(tmp_path):
    (tmp_path / "exits_on_import.py").write_text("import ctypes\nctypes.CDLL(None)._exit(0)\n")
    completed = _fa2_verify("kernels", "exits_on_import:KERNEL", path=(str(tmp_path),))
    assert completed.returncode == 1 and completed.stdout == ""
    assert completed.stderr.splitlines() == [ended("exit 0", "kernels")]


def test_a_kernel_that_passes_exits_0_and_a_usage_error_2():
    passed = _fa2_verify("repro", "--kernel", "tests.crashing:EXITS_0_ON_HEAD_DIM_40", "--case", json.dumps(HARMLESS))
    assert passed.returncode == 0 and passed.stderr == "" and "passed" in passed.stdout
    usage = _fa2_verify("repro", "--kernel", "reference")
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1 and "--case" in usage.stderr


@pytest.mark.parametrize(
    "kernel, status, line",
    [("tests.test_supervisor:CTRL_C_AT_THE_TERMINAL", 130, "fa2-verify: interrupted: nothing was verified to completion"),
     ("tests.test_supervisor:TERMINATES_ITS_PARENT", 143, "fa2-verify: interrupted (SIGTERM): nothing was verified to completion")],
    ids=["ctrl-c-at-the-terminal", "sigterm-to-the-command"],
)
def test_a_signal_to_the_command_stops_the_run_in_one_line(kernel, status, line):
    """A Ctrl-C reaches the parent and the child: the child stops once (status 130), not twice over."""
    completed = _fa2_verify("repro", "--kernel", kernel, "--case", json.dumps(HARMLESS))
    assert completed.returncode == status and completed.stdout == ""
    assert completed.stderr.splitlines() == [line]


@pytest.mark.parametrize(
    "reported, returncode, passed_on, expected",
    [(0, 0, [], (0, None)), (1, 1, [], (1, None)), (2, 2, [], (2, None)), (130, 130, [2], (130, None)),
     (None, 0, [], (1, "ended (exit 0) before run finished")),
     (None, -9, [], (1, "ended (signal 9, SIGKILL) before run finished")),
     (None, 3, [], (1, "ended (exit 3) before run finished")),
     (0, 120, [], (1, "ended (exit 120) after run finished with status 0")),
     (None, -15, [15], (143, "interrupted (SIGTERM)")), (None, -15, [], (1, "ended (signal 15, SIGTERM)"))],
)
def test_the_verdict_passes_a_reported_status_and_nothing_else(reported, returncode, passed_on, expected):
    status, line = supervisor.verdict(reported, returncode, "run", passed_on=passed_on)
    assert status == expected[0]
    if expected[1] is None:
        assert line is None
    else:
        assert expected[1] in line and "\n" not in line


def test_a_second_sigint_within_moments_is_the_same_ctrl_c():
    now = [100.0]
    handler = supervisor._FirstSigint(clock=lambda: now[0])
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, None)
    now[0] += 0.01
    handler(signal.SIGINT, None)
    now[0] += supervisor._FirstSigint.WINDOW
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, None)


def test_the_supervising_parent_imports_no_torch():
    code = "import sys, fa2_verify.cli.supervisor; print('torch' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    assert completed.stdout == "False\n"
