"""Turning property declarations into tests, and searching one outside pytest.

A property is declared once (:mod:`properties.declaration`); :func:`build_test`
makes it a Hypothesis test, ``@given(data=st.data())`` under the settings it is
handed (the plugin passes the session's profile, docs/properties.md), marked
with the capabilities it needs so the plugin skips it, as unsupported and with
the reason, when the kernel lacks one (docs/properties.md, "Capabilities, not
skips": never inside the test body).  The plugin builds one test per dtype
the run draws (:func:`shards`), which share the profile's examples, so that
pytest-xdist spreads one property over several workers and each worker
compiles the kernel variants of one dtype only.

:func:`search` runs one property under other settings outside pytest,
stopping at the first failing example: the mutant tests and
``benchmarks/bench_mutants.py`` use it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import time
from typing import Callable, Protocol

import pytest
from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure

from fa2_verify.core.contract import Capabilities
from fa2_verify.properties import profiles, verdicts
from fa2_verify.properties.declaration import MARKER, Property, PropertyFailure, attach
from fa2_verify.properties.session import Suite

#: The modules declaring the properties, in the order :func:`declared_properties` lists them.
PROPERTY_MODULES: tuple[str, ...] = (
    "fa2_verify.properties.test_golden",
    "fa2_verify.properties.test_metamorphic",
    "fa2_verify.properties.test_determinism",
)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One test of a property: its examples drawn with one ``dtype`` (``None``: every dtype).

    ``max_examples`` is the shard's part of the profile's budget; ``seed``
    seeds its search (``None``: Hypothesis' own fresh randomness).
    """

    dtype: str | None
    max_examples: int
    seed: int | None

    def test_name(self, property_name: str) -> str:
        """``test_<property>[<dtype>]``, the pytest name of this shard."""
        return property_name if self.dtype is None else f"{property_name}[{self.dtype}]"


def shard_seed(property_name: str, dtype: str, *, derandomize: bool, run_seed: object) -> int | None:
    """The seed of one shard's search: a digest of the run's seed, the property and the dtype.

    The shards of a property differ only in the dtype they draw, so under one
    seed (a derandomized profile, or ``--hypothesis-seed``) they would all draw
    the same shapes, values and masks: mixing the dtype in keeps them apart.
    A derandomized profile ignores ``--hypothesis-seed``, as Hypothesis does.
    Without either, ``None``: every shard draws from fresh randomness.
    """
    if not derandomize and run_seed is None:
        return None
    base = "derandomized" if derandomize else str(run_seed)
    return int.from_bytes(hashlib.sha256(f"{base}|{property_name}|{dtype}".encode()).digest()[:8], "big")


def shards(prop: Property, profile: profiles.Profile, dtypes: tuple[str, ...], run_seed: object) -> list[Shard]:
    """One :class:`Shard` per dtype of ``dtypes``, splitting ``profile.max_examples`` as evenly as can be
    (the first ``max_examples % len(dtypes)`` shards get one more), so a run checks as many examples
    as one unsharded test would.  No dtype (a kernel that cannot run here): one shard drawing every dtype."""
    if not dtypes:
        return [Shard(None, profile.max_examples, None)]
    share, extra = divmod(profile.max_examples, len(dtypes))
    return [
        Shard(dtype, share + (index < extra), shard_seed(prop.name, dtype, derandomize=profile.derandomize,
                                                          run_seed=run_seed))
        for index, dtype in enumerate(dtypes)
    ]  # fmt: skip


def build_test(prop: Property, test_settings: settings, shard: Shard) -> Callable:
    """``prop``'s ``shard`` as a pytest test taking the plugin's ``fa2_suite`` fixture: Hypothesis draws
    ``data`` under ``test_settings`` with the shard's budget and seed; the plugin makes the suite draw the
    shard's dtype.

    Each example starts with :meth:`Suite.example_starts` and ends with
    :meth:`Suite.example_ended`, however it ends, so the case it announced is
    withdrawn (:mod:`properties.inflight`), it is counted, a failure is
    logged as it happens, and, once the test's time share is spent, the test
    ends there, passing (:mod:`properties.pacing`); one whose own
    work on the GPU found it full ends as :class:`~properties.declaration.DeviceOutOfMemory`
    (:func:`verdicts.harness_out_of_memory`).  The test
    takes the declaration's name and docstring but not its signature
    (``__wrapped__`` is dropped): pytest and Hypothesis read the arguments
    through ``__wrapped__``, and the declaration's ``suite`` is not the
    fixture's name (the plugin loads into every pytest run, so its fixture
    is prefixed like its options).
    """

    def example(fa2_suite: Suite, data: st.DataObject) -> None:
        fa2_suite.example_starts()
        try:
            try:
                prop.check(fa2_suite, data)
            except RuntimeError as error:  # torch.OutOfMemoryError and AcceleratorError are RuntimeErrors
                verdicts.harness_out_of_memory(fa2_suite, error)
                raise
        except BaseException as error:
            fa2_suite.example_ended(error)
            raise
        fa2_suite.example_ended(None)

    wrapped = functools.update_wrapper(example, prop.check,
                                       assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    del wrapped.__wrapped__
    test = settings(test_settings, max_examples=shard.max_examples)(given(data=st.data())(wrapped))
    if shard.seed is not None:
        test = hypothesis_seed(shard.seed)(test)
    attach(test, prop, shard.dtype)
    return getattr(pytest.mark, MARKER)(requires=prop.requires)(test)


class _Kernel(Protocol):
    """What :func:`missing_requirement` reads of a kernel: a loaded one, or :mod:`properties.draws`' stand-in."""

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def unavailable_reason(self, device: str | None = None) -> str | None: ...


class _KernelOnDevice(Protocol):
    """What :func:`missing_requirement` reads of a suite: a :class:`Suite`, or :mod:`properties.draws`' stand-in."""

    @property
    def kernel(self) -> _Kernel: ...

    @property
    def device(self) -> str: ...


def missing_requirement(prop: Property, suite: _KernelOnDevice) -> str | None:
    """Why ``suite``'s kernel cannot run ``prop`` here (unavailable, or a capability it lacks), or ``None``."""
    reason = suite.kernel.unavailable_reason(suite.device)
    if reason is not None:
        return f"{suite.kernel.name} cannot run here: {reason}"
    missing_outputs = suite.kernel.capabilities.missing_outputs()
    for capability in prop.requires:
        if capability in missing_outputs:
            return f"{suite.kernel.name}: {missing_outputs[capability]}"
        if not getattr(suite.kernel.capabilities, capability):
            return f"{suite.kernel.name} lacks the capability {capability!r}"
    return None


def declared_properties() -> list[Property]:
    """Every declared property, in module order then declaration order."""
    declared = []
    for module_name in PROPERTY_MODULES:
        module = importlib.import_module(module_name)
        declared += [value for value in vars(module).values() if isinstance(value, Property)]
    return declared


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


def search(prop: Property, suite: Suite, search_settings: settings, *, seed: int | None = None) -> SearchResult:
    """Run ``prop`` against ``suite`` under ``search_settings``; stop at its first failure.

    ``seed`` fixes Hypothesis' random seed (for settings that are not derandomized).

    A failure is a :class:`~properties.declaration.PropertyFailure` (the
    checks turn a kernel's exceptions into those), also when it did not repeat
    on Hypothesis' replay (``FlakyFailure``: a nondeterministic kernel).
    Anything else, such as a :class:`~core.errors.Fa2VerifyError` from
    fa2-verify itself or a bare ``AssertionError`` of the harness, propagates.
    """
    reason = missing_requirement(prop, suite)
    if reason is not None:
        return SearchResult(prop.name, False, reason, 0, 0.0, "")
    examples = 0
    first_failure: tuple[int, float] | None = None

    def counted(suite: Suite, data: st.DataObject) -> None:
        nonlocal examples, first_failure
        examples += 1
        try:
            prop.check(suite, data)
        except PropertyFailure:
            if first_failure is None:
                first_failure = (examples, time.perf_counter() - start)
            raise

    runner = given(data=st.data())(settings(search_settings)(counted))
    if seed is not None:
        runner = hypothesis_seed(seed)(runner)
    start = time.perf_counter()
    try:
        runner(suite)
    except (PropertyFailure, FlakyFailure) as failure:
        caught_after, seconds = first_failure if first_failure is not None else (examples, time.perf_counter() - start)
        return SearchResult(prop.name, True, None, caught_after, seconds, _message(failure))
    return SearchResult(prop.name, False, None, examples, time.perf_counter() - start, "")
