"""What one property-suite run knows: the kernel, the device, the profile, and what it observed.

A :class:`Suite` is built once per pytest session (or worker) by the plugin
and handed to every property test.  Each example a property checks is
reported with :meth:`Suite.observe` (its score, e.g. the largest normalized
error, and its case), so the run can report how many examples it checked and
the worst case it found per property, the quantity ``hypothesis.target``
steers toward.  Each example's case is announced with :meth:`Suite.running`
before the kernel sees it and withdrawn with :meth:`Suite.finished`, so a
process that dies in the kernel leaves it behind (:mod:`properties.inflight`).
A property test runs between :meth:`Suite.start_test` and :meth:`Suite.end_test`;
each of its examples between :meth:`Suite.example_starts` (which ends the
test once its time share is spent, :mod:`properties.pacing`) and
:meth:`Suite.example_ended` (counted, a failure logged as it happens).  The
kernel's errors are tracked by :mod:`properties.kernel_errors`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from hypothesis import strategies as st

from fa2_verify.properties.cases import Limits, case_specs
from fa2_verify.properties.failure_log import FailureLog
from fa2_verify.properties.inflight import InFlight
from fa2_verify.properties.kernel_errors import KernelErrors
from fa2_verify.properties.pacing import Pacing
from fa2_verify.properties.profiles import Profile
from fa2_verify.properties.shape_classes import ShapeClasses
from fa2_verify.core.varlen import VarlenSpec
from fa2_verify.properties.varlen import varlen_specs
from fa2_verify.core.case import Case, CaseSpec, make_case
from fa2_verify.verify.metrics import decode_float, encode_float
from fa2_verify.verify.registry import LoadedKernel
from fa2_verify.verify.results import CaseResult


@dataclasses.dataclass
class Worst:
    """The highest score a label reached in one test, with the case that reached it."""

    label: str
    score: float
    examples: int
    reproduction: str

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "score": encode_float(self.score), "examples": self.examples, "reproduction": self.reproduction}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "Worst":
        return cls(record["label"], decode_float(record["score"]), int(record["examples"]), record["reproduction"])


@dataclasses.dataclass(repr=False)
class Suite:
    """The kernel under test and the run's settings.

    ``golden_options`` are passed to ``golden.compute``; ``dtypes``, if given,
    restricts the dtypes drawn (to those the kernel also supports);
    ``inflight``, if given, keeps the case of the example running on disk
    (the plugin sets it, ``test`` to the property test running now and
    ``dtype`` to the one dtype that test draws, its shard:
    :func:`properties.harness.shards`; ``None`` draws every dtype).
    ``kernel_errors``, if given, reports each distinct kernel error once in
    the run and steers the other tests away from its shape class
    (:mod:`properties.kernel_errors`; without it each test reports what it
    meets); ``failure_log``, if given, gets each failure as it happens;
    ``shape_classes``, if given, bounds the shape classes each test draws
    (:mod:`properties.shape_classes`).
    """

    kernel: LoadedKernel
    device: str
    profile: Profile
    golden_options: Any = None
    dtypes: tuple[str, ...] | None = None
    inflight: InFlight | None = None
    max_golden_seconds: float | None = None
    kernel_errors: KernelErrors | None = None
    failure_log: FailureLog | None = None
    shape_classes: ShapeClasses | None = None
    pacing: Pacing = dataclasses.field(default_factory=Pacing)
    test: str = ""
    dtype: str | None = None
    #: The reproduction of the case the example runs now (:meth:`running`), "" between examples.
    running_case: str = ""
    _worst: dict[str, Worst] = dataclasses.field(default_factory=dict)
    _unsupported: dict[str, int] = dataclasses.field(default_factory=dict)
    _results: list[CaseResult] = dataclasses.field(default_factory=list)
    _input_seconds: float = 0.0

    def __repr__(self) -> str:
        return f"Suite(kernel={self.kernel.name!r}, device={self.device!r}, profile={self.profile.name!r})"

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        """Hypothesis prints failing examples with this (else it lists every field)."""
        printer.text(repr(self))

    @property
    def limits(self) -> Limits:
        return self.profile.limits(self.device)

    def _drawn(self) -> tuple[str, ...] | None:
        return (self.dtype,) if self.dtype is not None else self.dtypes

    def cases(self, **options: Any) -> st.SearchStrategy[CaseSpec]:
        """:func:`properties.cases.case_specs` for this kernel, device and profile."""
        return case_specs(
            capabilities=self.kernel.capabilities, device=self.device, limits=self.limits, dtypes=self._drawn(),
            shape_classes=self.shape_classes, **options
        )

    def varlen_cases(self, **options: Any) -> st.SearchStrategy[VarlenSpec]:
        """:func:`properties.varlen.varlen_specs` for this kernel, device and profile."""
        return varlen_specs(
            capabilities=self.kernel.capabilities, device=self.device, limits=self.limits, dtypes=self._drawn(), **options
        )

    def observe(self, label: str, score: float, spec: CaseSpec) -> None:
        """Record one checked example: its ``score`` under ``label`` (NaN counts as +inf)."""
        score = math.inf if math.isnan(score) else float(score)
        worst = self._worst.get(label)
        if worst is None:
            worst = self._worst[label] = Worst(label, -math.inf, 0, "")
        worst.examples += 1
        if score > worst.score:
            worst.score = score
            worst.reproduction = spec.reproduction(self.kernel.name, self.device)

    def running(self, spec: CaseSpec) -> None:
        """Announce ``spec`` as the case this process runs now, before any kernel call of the example.

        The reproduction names the device (``--device``); a varlen batch has
        no one-line reproduction, so its record is its spec.
        """
        if isinstance(spec, VarlenSpec):
            reproduction = f"varlen case {spec.describe()}"
        else:
            reproduction = spec.reproduction(self.kernel.name, self.device)
        self.running_case = reproduction
        if self.kernel_errors is not None:
            self.kernel_errors.begin(spec)
        if self.inflight is not None:
            self.inflight.begin(
                kernel=self.kernel.name, device=self.device, test=self.test, case=spec.to_dict(), reproduction=reproduction
            )

    def finished(self) -> None:
        """The example is over, however it ended: withdraw its case (:meth:`running`)."""
        self.running_case = ""
        if self.kernel_errors is not None:
            self.kernel_errors.end()
        if self.inflight is not None:
            self.inflight.end()

    def decline(self, reason: str) -> None:
        """Record an example the kernel declined at run time (:class:`~core.errors.UnsupportedCase`)."""
        self._unsupported[reason] = self._unsupported.get(reason, 0) + 1
        if self.kernel_errors is not None:
            self.kernel_errors.declined()

    def reports_kernel_error(self, error: tuple[str, str], spec: CaseSpec, reason: str, reproduction: str) -> bool:
        """The kernel raised ``error`` (entry point, exception type) on ``spec``: whether this test reports it
        (:meth:`properties.kernel_errors.KernelErrors.met`; always, without ``kernel_errors``)."""
        if self.kernel_errors is None:
            return True
        return self.kernel_errors.met(error, spec, reason, reproduction)

    def start_test(self, test: str, dtype: str | None, share: float | None = None) -> None:
        """Property test ``test`` starts, drawing ``dtype`` (``None``: every dtype) for at most ``share`` seconds
        (:mod:`properties.pacing`); what earlier tests left is dropped."""
        self.test, self.dtype = test, dtype
        self.take_observations()
        self.take_results()
        self.pacing = Pacing(test, share, self.failure_log)
        if self.kernel_errors is not None:
            self.kernel_errors.start(test)
        if self.shape_classes is not None:
            self.shape_classes.start(test)

    def example_starts(self) -> None:
        """An example starts (:meth:`properties.pacing.Pacing.begin`)."""
        self.pacing.begin()

    def example_ended(self, error: BaseException | None) -> None:
        """The example is over, ``error`` what it raised: withdraw its case (:meth:`finished`), count it, log a
        failure; :class:`~properties.pacing.ShareSpent` when it passed and the test's time share is spent."""
        reproduction = self.running_case
        self.finished()
        self.pacing.ended(error, reproduction)

    def end_test(self) -> dict[str, Any]:
        """The test is over: :meth:`take_observations`, with its example counts (``pacing``), its seconds per
        phase (``phases``: ``inputs`` built by :meth:`case`, and the kernel, golden and comparison seconds of the
        cases compared with the golden, summed over the results kept, :meth:`keep`) and, if tracked, its kernel
        errors (``kernel_errors``, with the kernel's name and declared head dims)."""
        phases = {"inputs": self._input_seconds}
        observed = self.take_observations()
        observed["pacing"] = self.pacing.finish()
        for result in self._results:
            for phase, seconds in result.seconds.items():
                phases[phase] = phases.get(phase, 0.0) + seconds
        observed["phases"] = phases
        if self.kernel_errors is not None:
            observed["kernel_errors"] = {
                **self.kernel_errors.take(),
                "kernel": self.kernel.name,
                "declared": list(self.kernel.capabilities.head_dims_on(self.device)),
            }
        return observed

    def case(self, spec: CaseSpec) -> Case:
        """The inputs of ``spec`` on the suite's device (:func:`core.case.make_case`), their seconds counted in
        the test's ``inputs`` phase (:meth:`end_test`)."""
        started = time.perf_counter()
        case = make_case(spec, self.device)
        self._input_seconds += time.perf_counter() - started
        return case

    def keep(self, result: CaseResult) -> None:
        """Keep a comparison against the golden for the test's report (Allure distributions)."""
        self._results.append(result)

    def take_results(self) -> list[CaseResult]:
        """The results kept since the last call (one test's); then start afresh."""
        results, self._results = self._results, []
        return results

    def take_observations(self) -> dict[str, Any]:
        """What was observed since the last call (one test's), as JSON-ready data; then start afresh."""
        observed = {
            "worst": [worst.to_dict() for worst in self._worst.values()],
            "unsupported": dict(self._unsupported),
        }
        self._worst, self._unsupported, self._input_seconds = {}, {}, 0.0
        return observed


def build_suite(config: Any) -> Suite:
    """The :class:`Suite` of a pytest session (the plugin's ``fa2_suite`` fixture), from its options
    (:mod:`properties.options`): a kernel that does not load is the usage error naming ``--fa2-kernel``."""
    from fa2_verify.core.errors import Fa2VerifyError
    from fa2_verify.golden.options import GoldenOptions, shared_cache_dir
    from fa2_verify.properties import profiles
    from fa2_verify.properties.inflight_session import inflight_of
    from fa2_verify.properties.kernel_errors import SHARED_FILE
    from fa2_verify.properties.options import of, usage
    from fa2_verify.app.targets import load_target

    options = of(config)
    try:
        kernel = load_target(options["kernel"])
    except Fa2VerifyError as exc:
        raise usage("--fa2-kernel", options["kernel"], str(exc)) from None
    return Suite(
        kernel=kernel,
        device=options["device"],
        profile=profiles.get(options["profile"]),
        golden_options=GoldenOptions(cache_dir=shared_cache_dir(config.rootpath)),
        dtypes=options["dtypes"],
        inflight=inflight_of(config),
        max_golden_seconds=options["max_golden_seconds"],
        kernel_errors=KernelErrors(inflight_of(config).directory / SHARED_FILE),
        failure_log=FailureLog(options["failures"], kernel.name, options["device"]) if options["failures"] else None,
        shape_classes=ShapeClasses(options["shape_classes"]) if options["shape_classes"] else None,
    )
