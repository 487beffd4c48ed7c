"""A kernel error at a declared shape is a failure class of its own, reported once, its shape class left alone.

``tests.breakers:SMALL_HEAD_DIMS_FAIL_LSE_BASE2`` declares every head dim but
raises ``CompilationError`` below 9, and writes its LSE in base 2 (a value
bug): one search reports the two apart; a second test of the run discards
the error's examples and finds the value bug on the rest
(docs/properties.md, "Kernel errors").
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fa2_verify.core.case import CaseSpec
from fa2_verify.properties import golden_checks, kernel_errors, profiles
from fa2_verify.properties.declaration import KernelError, PropertyFailure
from fa2_verify.properties.kernel_errors import KernelErrors, Summary, failure_class
from fa2_verify.properties.session import Suite
from fa2_verify.verify.kernel_call import raised_error
from fa2_verify.verify.registry import LoadedKernel
from tests import breakers

KERNEL = "tests.breakers:SMALL_HEAD_DIMS_FAIL_LSE_BASE2"
#: Head dims 8 and 4 raise the kernel's CompilationError; 16 runs, with its LSE wrong.
RAISES_8, RAISES_4, WRONG_LSE = (CaseSpec(1, 2, 3, 1, 1, head_dim, "float32", backward=False) for head_dim in (8, 4, 16))
COMPILATION_ERROR = failure_class(("forward", "CompilationError"))


@pytest.fixture
def suite(tmp_path) -> Suite:
    kernel = LoadedKernel(KERNEL, breakers.SMALL_HEAD_DIMS_FAIL_LSE_BASE2)
    return Suite(kernel, "cpu", profiles.get("ci"), kernel_errors=KernelErrors(tmp_path / kernel_errors.SHARED_FILE))


def _search(suite: Suite, specs: list[CaseSpec]) -> None:
    """Hypothesis' search (shrinking, every bug reported) over ``specs`` with the check of ``lse``."""

    @settings(database=None, max_examples=10, report_multiple_bugs=True, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(specs))
    def search(spec: CaseSpec) -> None:
        try:
            golden_checks.against_golden(suite, spec, "lse")
        finally:
            suite.finished()

    search()


def test_each_distinct_error_has_its_own_failure_class():
    assert failure_class(("forward", "CompilationError")) is COMPILATION_ERROR
    assert issubclass(COMPILATION_ERROR, KernelError) and issubclass(COMPILATION_ERROR, PropertyFailure)
    assert failure_class(("forward", "AssertionError")) is not COMPILATION_ERROR
    assert failure_class(("backward", "CompilationError")) is not COMPILATION_ERROR


def test_the_entry_and_exception_a_kernel_raised_are_read_from_the_reason():
    assert raised_error("status error: k:X.forward raised CompilationError: at 1:2", "k:X") == ("forward", "CompilationError")
    assert raised_error("k:X.backward raised SystemExit", "k:X") == ("backward", "SystemExit")
    assert raised_error("k:X.forward modified its input q in place", "k:X") is None


def test_one_search_reports_the_kernel_error_and_the_value_bug_apart(suite):
    suite.start_test("test_a", "float32")
    with pytest.raises(ExceptionGroup) as raised:
        _search(suite, [RAISES_8, WRONG_LSE])
    kinds = sorted(type(error).__name__ for error in raised.value.exceptions)
    assert kinds == ["KernelError[forward raised CompilationError]", "PropertyFailure"]
    error = next(error for error in raised.value.exceptions if isinstance(error, KernelError))
    assert str(error).startswith(f"{KERNEL} declares head_dim 1..512 and float32 on cpu, but its forward raised "
                                 "CompilationError at head_dim 8: a mismatch between its capabilities")


def test_a_later_test_leaves_the_error_to_the_first_and_its_shape_classes_alone(suite):
    """The first test reports the error; the second discards every example that meets it, at the shape class
    already met (before the kernel runs) or at another, and fails on the value bug alone."""
    suite.start_test("test_a", "float32")
    with pytest.raises(COMPILATION_ERROR):
        _search(suite, [RAISES_8])
    suite.end_test()
    suite.start_test("test_b", "float32")
    with pytest.raises(PropertyFailure) as raised:
        _search(suite, [RAISES_8, RAISES_4, WRONG_LSE])
    assert type(raised.value) is PropertyFailure and "lse (float32) mismatches the golden" in str(raised.value)
    report = suite.end_test()["kernel_errors"]
    (met,) = report["errors"]
    assert met["reported_by"] == "test_a" and "minimal" not in met and met["classes"] == [[4, "float32"]]
    assert report["skipped"] >= 2 and report["ran"] == [[16, "float32"]]


def test_another_process_of_the_session_learns_the_error_from_the_shared_file(suite):
    suite.start_test("test_a", "float32")
    with pytest.raises(COMPILATION_ERROR):
        _search(suite, [RAISES_8])
    worker = KernelErrors(suite.kernel_errors.shared)
    worker.start("test_b")
    assert worker.blocked(RAISES_8) == ("forward", "CompilationError")
    assert worker.blocked(WRONG_LSE) is None
    assert not worker.met(("forward", "CompilationError"), RAISES_4, "raised", "repro")


def _report(errors, ran, skipped=0):
    return {"errors": errors, "ran": ran, "skipped": skipped, "kernel": "k", "declared": list(range(1, 257))}


def test_the_summary_lists_each_error_once_with_the_bound_the_data_allow():
    first = {"entry": "forward", "raised": "CompilationError", "reported_by": "test_a", "examples": 2,
             "classes": [[8, "float16"], [2, "float16"]], "message": "k.forward raised CompilationError", "minimal": "repro"}
    second = {"entry": "forward", "raised": "CompilationError", "reported_by": "test_a", "examples": 1,
              "classes": [[5, "float16"]]}
    summary = Summary()
    summary.add(_report([first], [[9, "float16"], [64, "float16"]]))
    summary.add(_report([second], [[12, "float32"]], skipped=3))
    lines = summary.lines()
    assert lines[0] == (
        "kernel error: k declares head_dim 1..256; its forward raises CompilationError for head_dim <= 8 (raised at "
        "head_dim 2, 5, 8 with float16; ran at every head_dim drawn above it, 9 to 64), in 3 example(s); reported "
        "once, by test_a: k.forward raised CompilationError"
    )
    assert lines[1:] == ["    repro", "kernel errors: 3 example(s) of other property tests left the shape classes "
                         "(head_dim, dtype) where an error was met"]
    summary.add(_report([], [[4, "float16"]]))
    assert "raises CompilationError at head_dim 2, 5, 8 with float16, in 3" in summary.lines()[0]
