"""A kernel that faults its device, or hangs, is a verdict on its case, and the run survives it.

The fault is simulated on the CPU (tests/faulting.py): the kernel raises the
error a lost CUDA context raises, on head_dim 40 and then in every call of its
process, as a lost context does; a fresh process runs it as the reference.
``fa2-verify run`` charges the fault to the case, and runs the cases after it
in a fresh process, with the cases done carried over (verify.continuation).
A call that hangs past ``--call-timeout`` ends the command, naming the call and
its case (verify.watchdog).  The GPU counterpart is lab/device/device-fault.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import torch

from fa2_verify.cli import child
from fa2_verify.cli.main import main
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.verify import continuation, device_fault, watchdog
from fa2_verify.verify.check import check_case, run_cases
from fa2_verify.verify.metrics import describe_failure
from fa2_verify.verify.registry import load_kernel
from tests import faulting
from tests.test_supervisor import _fa2_verify, ended

FAULTING = "tests.faulting:FAULTS_ON_HEAD_DIM_40"
#: Small cases: the second (head_dim 40) faults.
SPECS = (
    CaseSpec(1, 3, 5, 2, 1, 32, "float32", seed=1, backward=True, name="before"),
    CaseSpec(1, 3, 5, 2, 1, faulting.FATAL_HEAD_DIM, "float32", seed=2, backward=True, name="faulting"),
    CaseSpec(1, 4, 3, 2, 2, 32, "float32", seed=3, backward=True, name="after"),
)


@pytest.fixture
def working_device(monkeypatch):
    """A process whose (simulated) device has not faulted; whatever the test faults is forgotten after it."""
    monkeypatch.setattr(faulting, "_lost", [])
    monkeypatch.setattr(device_fault, "_recorded", [])


@pytest.mark.parametrize("marker", device_fault.FAULT_MARKERS)
def test_each_sticky_device_error_is_a_fault(marker):
    assert device_fault.is_device_fault(torch.AcceleratorError(f"{marker} was encountered"))
    assert device_fault.is_device_fault(RuntimeError(f"{marker} was encountered"))


@pytest.mark.parametrize(
    "error", [RuntimeError("CUDA error: out of memory"), ValueError("CUDA error: an illegal memory access"),
              RuntimeError("shapes do not match")], ids=["out-of-memory", "not-a-runtime-error", "ordinary"],
)  # fmt: skip
def test_other_errors_are_not_faults(error):
    assert not device_fault.is_device_fault(error)


def test_a_fault_is_the_error_of_its_call_and_case_and_marks_the_process(working_device):
    kernel = load_kernel(FAULTING)
    result = check_case(kernel, make_case(SPECS[1], "cpu"))
    assert result.status == "error"
    assert result.reason == f"{FAULTING}.forward faulted the device: RuntimeError: {faulting.FAULT}"
    assert describe_failure(result).endswith(SPECS[1].reproduction(FAULTING, "cpu"))
    assert device_fault.recorded() == result.reason


def test_a_case_loop_goes_on_from_the_journal_of_the_process_that_faulted(working_device, monkeypatch):
    kernel = load_kernel(FAULTING)
    with continuation.carried_over(), pytest.raises(continuation.DeviceFaulted) as raised:
        run_cases(kernel, SPECS, "cpu")
    assert str(raised.value).startswith(f"the device faulted in case faulting ({FAULTING}.forward faulted the device")
    journal = raised.value.save()
    monkeypatch.setattr(faulting, "_lost", [])  # the fresh process
    monkeypatch.setattr(device_fault, "_recorded", [])
    monkeypatch.setenv(continuation.ENV, str(journal))
    announced = []
    with continuation.carried_over():
        run = run_cases(kernel, SPECS, "cpu", starting=lambda index, spec: announced.append(spec.name))
    assert announced == ["after"] and not journal.parent.exists() and continuation.ENV not in os.environ
    assert [(case.spec.name, case.status) for case in run.cases] == [
        ("before", "passed"), ("faulting", "error"), ("after", "passed")]
    assert "faulted the device" in run.cases[1].reason and run.cases[0].seconds["kernel"] >= 0


def test_outside_a_command_a_fault_is_the_case_error_and_the_loop_ends_without_continuing(working_device):
    run = run_cases(load_kernel(FAULTING), SPECS, "cpu")
    assert [case.status for case in run.cases] == ["passed", "error", "error"]


def test_run_verifies_every_other_case_in_a_fresh_process_and_fails():
    completed = _fa2_verify("run", "--kernel", FAULTING, "--case", "fp32-none-gqa", "--case", "fp32-window-mqa")
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr.splitlines() == [
        "fa2-verify: running case 1 of 2: fp32-none-gqa",
        f"fa2-verify: the device faulted in case fp32-none-gqa ({FAULTING}.forward faulted the device: "
        f"RuntimeError: {faulting.FAULT}); the cases after it run in a fresh process",
        "fa2-verify: running case 2 of 2: fp32-window-mqa",
    ]
    assert "fp32-none-gqa                  -      float32" in completed.stdout
    assert "fa2-verify repro --kernel tests.faulting:FAULTS_ON_HEAD_DIM_40 --device cpu" in completed.stdout
    assert f"{FAULTING} on cpu: 1 passed, 0 failed, 1 errors" in completed.stdout


def test_repro_of_the_faulting_case_fails_naming_the_fault(working_device, capsys):
    assert main(["repro", "--kernel", FAULTING, "--case", json.dumps(SPECS[1].to_dict())]) == 1
    assert f"{FAULTING}.forward faulted the device: RuntimeError: {faulting.FAULT}" in capsys.readouterr().out


def test_outside_the_supervisor_the_command_reruns_as_python_m_fa2_verify(monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda argv, env: calls.append((argv, env)) or subprocess.CompletedProcess(argv, 1))
    assert child.rerun(["run", "--kernel", "reference"], {continuation.ENV: "/tmp/x"}) == 1
    [(argv, env)] = calls
    assert argv[1:] == ["-m", "fa2_verify", "run", "--kernel", "reference"] and env[continuation.ENV] == "/tmp/x"


def test_the_watchdog_ends_a_call_that_runs_past_the_limit_naming_it(monkeypatch, capsys):
    ended_with = []
    monkeypatch.setattr(watchdog, "end_process", ended_with.append)
    monkeypatch.setattr(watchdog, "_limit", [0.05])
    with watchdog.watched("forward on case X"):
        pass
    time.sleep(0.1)
    assert ended_with == []
    with watchdog.watched("backward on case Y"):
        time.sleep(0.3)
    assert ended_with == [1]
    assert capsys.readouterr().err == "fa2-verify: error: kernel call exceeded 0.05 s: backward on case Y\n"


def test_a_hung_kernel_call_ends_the_command_naming_the_call_and_its_case():
    spec = SPECS[1]
    completed = _fa2_verify("repro", "--kernel", "tests.faulting:HANGS_ON_HEAD_DIM_40", "--call-timeout", "1",
                            "--case", json.dumps(spec.to_dict()))  # fmt: skip
    assert completed.returncode == 1 and completed.stdout == ""
    assert completed.stderr.splitlines() == [
        "fa2-verify: error: kernel call exceeded 1 s: forward on case "
        + spec.reproduction("tests.faulting:HANGS_ON_HEAD_DIM_40", "cpu"),
        ended("exit 1", "repro"),
    ]


def test_a_call_timeout_that_is_not_a_positive_number_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["run", "--kernel", "reference", "--call-timeout", "0"])
    assert raised.value.code == 2 and "--call-timeout: '0' is not a number of seconds > 0" in capsys.readouterr().err
