"""``--sanitize``: a case that faulted the device is run again under compute-sanitizer, its first error named."""

from __future__ import annotations

import json
import os
import sys

import pytest

from fa2_verify.cli.main import main
from fa2_verify.verify import device_fault, sanitizer
from tests import faulting
from tests.test_device_fault import FAULTING, SPECS

#: compute-sanitizer's report of a store out of bounds (its format, abridged).
MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at 0x1f0 in store_past_the_end
=========     by thread (3,0,0) in block (1,0,0)
=========     Address 0x7f3a2c000404 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3a2c000000 of size 1028 bytes
=========
========= ERROR SUMMARY: 1 error
"""

FIRST = ("Invalid __global__ write of size 4 bytes in store_past_the_end by thread (3,0,0) in block (1,0,0), "
         "address 0x7f3a2c000404 is out of bounds")  # fmt: skip


@pytest.fixture
def working_device(monkeypatch):
    monkeypatch.setattr(faulting, "_lost", [])
    monkeypatch.setattr(device_fault, "_recorded", [])


def test_the_command_runs_repro_on_the_case_under_memcheck_with_one_error():
    spec = SPECS[1].to_dict()
    assert sanitizer.command(FAULTING, "cuda", spec) == [
        "compute-sanitizer", "--tool", "memcheck", "--print-limit", "1", sys.executable, "-m", "fa2_verify", "repro",
        "--kernel", FAULTING, "--device", "cuda", "--case", json.dumps(spec),
    ]  # fmt: skip


def test_the_first_error_is_its_access_kernel_thread_and_address():
    assert sanitizer.first_error(MEMCHECK) == FIRST
    assert sanitizer.first_error("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n") is None


def _repro(capsys, *flags: str) -> str:
    status = main(["repro", "--kernel", FAULTING, "--case", json.dumps(SPECS[1].to_dict()), *flags])
    assert status == 1
    return capsys.readouterr().out


def test_without_compute_sanitizer_on_path_a_fault_says_so_in_one_line(working_device, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    out = _repro(capsys, "--sanitize")
    assert "--sanitize: compute-sanitizer is not on PATH, so the faulting access was not located\n" in out


def test_with_compute_sanitizer_on_path_a_fault_names_its_first_error(working_device, capsys, monkeypatch, tmp_path):
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(f"#!/bin/sh\ncat <<'END'\n{MEMCHECK}END\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert f"compute-sanitizer: {FIRST}" in _repro(capsys, "--sanitize")
    monkeypatch.setattr(device_fault, "_recorded", [])
    monkeypatch.setattr(faulting, "_lost", [])
    assert "compute-sanitizer" not in _repro(capsys)
