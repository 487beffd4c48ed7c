"""The ``triton`` kernels on CPU under the Triton interpreter (docs/triton-kernel.md).

Each test runs one check of :mod:`tests.triton_interpreter_checks` in a child
process with ``TRITON_INTERPRET=1`` set before Triton is imported, so this
module never changes the mode of other tests (or of GPU runs in the same
worker).  A check fails with its own assertion message, shown here.

These are among the suite's slowest tests (docs/benchmarks.md, "The
project's own tests"): each child imports torch and Triton, and the
interpreter runs every tile operation in NumPy.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def run_check(name: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    code = f"from tests.triton_interpreter_checks import {name}; {name}()"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize(
    "check",
    [
        "forward_backward_match_naive",
        "deterministic_backward_matches_and_repeats",
        "comparison_fails_on_wrong_mask",
        "empty_rows_are_zero_with_infinite_lse",
        "varlen_matches_per_sequence",
        "strided_inputs_give_identical_results",
        "registry_and_capabilities_under_interpreter",
        "bench_check_section_passes_and_fails_a_wrong_mask",
        "reads_and_writes_stay_in_bounds",
        "bounds_check_fails_on_a_read_before_a_tensor",
        "fused_bound_weights_equal_the_dense_equations",
        "fused_golden_passes_equal_the_torch_evaluation",
    ],
)
def test_interpreter_check(check: str) -> None:
    """The named check of tests/triton_interpreter_checks.py passes under TRITON_INTERPRET=1."""
    result = run_check(check)
    assert result.returncode == 0, f"{check} failed:\n{result.stderr[-4000:]}"


def test_check_fails_outside_the_interpreter() -> None:
    """A check that raises fails its run: without TRITON_INTERPRET=1 the checks refuse to start."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("TRITON_INTERPRET", None)
    code = "from tests.triton_interpreter_checks import _kernel; _kernel()"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0 and "TRITON_INTERPRET=1" in result.stderr
