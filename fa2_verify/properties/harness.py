"""How a property test is declared, checked and searched.

A property test is ``test_<quantity>_<invariant>`` (STYLE rule 7), decorated
with :func:`property_test`: it takes the ``suite`` fixture and Hypothesis'
``data``, draws a case, runs the kernel and makes one assertion,
``assert verdict.passed, verdict.message``.  The decorator applies the
selected profile's settings and records which capabilities the property
needs; the plugin skips it, as unsupported and with the reason, when the
kernel lacks one (STYLE rule 6: never inside the test body).

:func:`search` runs one property test under other settings outside pytest,
stopping at the first failing example: the mutant test and
``benchmarks/bench_mutants.py`` use it.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Callable

import pytest
from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import FlakyFailure
from hypothesis import strategies as st

from fa2_verify.properties import profiles
from fa2_verify.properties.plugin import MARKER
from fa2_verify.properties.session import Suite
from fa2_verify.properties.validation import check_choices

#: Capabilities a property can require (attributes of core.contract.Capabilities).
REQUIREMENTS: tuple[str, ...] = ("backward", "deterministic_backward", "causal", "window", "gqa", "varlen")

#: The modules holding the property tests, in the order :func:`property_tests` lists them.
PROPERTY_MODULES: tuple[str, ...] = (
    "fa2_verify.properties.test_golden",
    "fa2_verify.properties.test_metamorphic",
    "fa2_verify.properties.test_determinism",
)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of checking one example: ``message`` explains a failure (and how to reproduce it)."""

    passed: bool
    message: str = ""


def property_test(*, requires: tuple[str, ...] = ()) -> Callable:
    """Declare a property test: ``@given(data=st.data())`` under the selected profile's settings."""
    needed = check_choices("requires", requires, REQUIREMENTS) if requires else ()

    def decorate(test: Callable) -> Callable:
        wrapped = given(data=st.data())(settings(profiles.selected_settings())(test))
        wrapped.fa2_requires = needed
        return getattr(pytest.mark, MARKER)(requires=needed)(wrapped)

    return decorate


def missing_requirement(test: Callable, suite: Suite) -> str | None:
    """Why ``suite``'s kernel cannot run ``test`` here (unavailable, or a capability it lacks), or ``None``."""
    reason = suite.kernel.unavailable_reason(suite.device)
    if reason is not None:
        return f"{suite.kernel.name} cannot run here: {reason}"
    for capability in getattr(test, "fa2_requires", ()):
        if not getattr(suite.kernel.capabilities, capability):
            return f"{suite.kernel.name} lacks the capability {capability!r}"
    return None


def property_tests() -> list[Callable]:
    """Every property test, in module order then definition order."""
    tests = []
    for module_name in PROPERTY_MODULES:
        module = importlib.import_module(module_name)
        tests += [value for name, value in vars(module).items() if name.startswith("test_") and hasattr(value, "fa2_requires")]
    return tests


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """How a search for a failing example ended."""

    test: str
    caught: bool
    skipped: str | None
    examples: int
    seconds: float
    message: str


def _message(failure: BaseException) -> str:
    """The failure's text; for a flaky failure, that of the first failing run it wraps."""
    if isinstance(failure, FlakyFailure):
        return "failed once, passed on replay (nondeterministic): " + str(failure.exceptions[0])
    return str(failure)


def catch_settings(profile: profiles.Profile) -> settings:
    """``profile``'s settings for hunting a known-broken kernel: stop at the first failure, no shrinking."""
    base = profiles.settings_for(profile, database_dir=None)
    return settings(
        base,
        phases=tuple(phase for phase in base.phases if phase not in (Phase.shrink, Phase.explain)),
        report_multiple_bugs=False,
        print_blob=False,
    )


def search(test: Callable, suite: Suite, search_settings: settings, *, seed: int | None = None) -> SearchResult:
    """Run property ``test`` against ``suite`` under ``search_settings``; stop at its first failure.

    ``seed`` fixes Hypothesis' random seed (for settings that are not derandomized).

    A failure is an ``AssertionError`` from the property (a failed
    ``Verdict``; the checks turn a kernel's exceptions into those), also when
    it did not repeat on Hypothesis' replay (``FlakyFailure``: a
    nondeterministic kernel).  Anything else, such as a
    :class:`~core.errors.Fa2VerifyError` from fa2-verify itself, propagates.
    """
    name = test.__name__
    reason = missing_requirement(test, suite)
    if reason is not None:
        return SearchResult(name, False, reason, 0, 0.0, "")
    inner = test.hypothesis.inner_test
    examples = 0
    first_failure: tuple[int, float] | None = None

    def counted(suite: Suite, data: st.DataObject) -> None:
        nonlocal examples, first_failure
        examples += 1
        try:
            inner(suite, data)
        except AssertionError:
            if first_failure is None:
                first_failure = (examples, time.perf_counter() - start)
            raise

    runner = given(data=st.data())(settings(search_settings)(counted))
    if seed is not None:
        runner = hypothesis_seed(seed)(runner)
    start = time.perf_counter()
    try:
        runner(suite)
    except (AssertionError, FlakyFailure) as failure:
        caught_after, seconds = first_failure if first_failure is not None else (examples, time.perf_counter() - start)
        return SearchResult(name, True, None, caught_after, seconds, _message(failure))
    return SearchResult(name, False, None, examples, time.perf_counter() - start, "")
