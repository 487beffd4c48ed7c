"""The property suite's terminal summary, and the run's exit status where it verified nothing.

A property needing a capability the kernel lacks (or a kernel that cannot run
here) is skipped with the reason and counted as unsupported; the summary lists
those counts, how many examples were checked per second and where the seconds
went (building inputs; the kernel, golden and comparison of the cases compared
with the golden), the examples and
kernel errors of each property (:mod:`properties.pacing`,
:mod:`properties.kernel_errors`) and the worst case found per property.  A run
in which every property test was skipped so verified nothing: it exits 5, not
0.  A process that died in the kernel (its in-flight record left behind,
:mod:`properties.inflight_session`) or an xdist worker that went down fails
the run.  Each test hands its part to the summary in its report's
``user_properties``: :data:`UNSUPPORTED` at setup, :data:`OBSERVED` at the call.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fa2_verify.properties.inflight import Record, left_behind
from fa2_verify.properties.inflight_session import inflight_of

#: A test's ``user_properties`` key for the reason it was skipped as unsupported.
UNSUPPORTED = "fa2_unsupported"
#: A test's ``user_properties`` key for what it observed (:meth:`properties.session.Suite.end_test`, as JSON).
OBSERVED = "fa2_observed"


class Summary:
    """Counts and worst cases gathered from test reports (on the xdist controller, from every worker),
    the processes that died in the kernel (their in-flight records, :mod:`properties.inflight`), and, in a
    ``property_run`` (``--fa2-kernel`` given), the xdist workers that went down before the session ended."""

    def __init__(self, *, property_run: bool = False) -> None:
        self.property_run = property_run
        self.died: list[Record] = []
        self.workers_down: list[str] = []
        self.unsupported: dict[str, set[str]] = {}
        self.declined: dict[str, int] = {}
        self.examples = 0
        self.seconds = 0.0
        self.phases: dict[str, float] = {}
        self.worst: dict[tuple[str, str], dict[str, Any]] = {}
        self.verified = 0
        self.nothing_verified = False
        self.counts: Any = None
        self.kernel_errors: Any = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        prop = report.nodeid.split("::")[-1].split("[")[0]
        for key, value in report.user_properties:
            if key == UNSUPPORTED and report.when == "setup":
                assert isinstance(value, str), "runtest records the unsupported reason as a string"
                self.unsupported.setdefault(value, set()).add(prop)
            elif key == OBSERVED and report.when == "call":
                self.verified += report.passed
                self.seconds += report.duration
                assert isinstance(value, str), "runtest records the observations as JSON text"
                observed = json.loads(value)
                records = observed["worst"]
                self.examples += max((record["examples"] for record in records), default=0)
                for phase, seconds in observed["phases"].items():
                    self.phases[phase] = self.phases.get(phase, 0.0) + seconds
                for reason, count in observed["unsupported"].items():
                    self.declined[reason] = self.declined.get(reason, 0) + count
                for record in records:
                    self._merge((prop, record["label"]), record)
                self._add_counts(report.nodeid.split("::")[-1], observed)

    def _add_counts(self, test: str, observed: dict[str, Any]) -> None:
        """The test's examples (:class:`properties.pacing.Counts`) and kernel errors
        (:class:`properties.kernel_errors.Summary`)."""
        from fa2_verify.properties.kernel_errors import Summary as KernelErrorSummary
        from fa2_verify.properties.pacing import Counts

        if self.counts is None:
            self.counts, self.kernel_errors = Counts(), KernelErrorSummary()
        self.counts.add(test, observed["pacing"])
        if "kernel_errors" in observed:
            self.kernel_errors.add(observed["kernel_errors"])

    def _merge(self, key: tuple[str, str], record: dict[str, Any]) -> None:
        """Keep the worst record of a property's label over its dtype shards, counting every shard's examples."""
        current = self.worst.get(key)
        if current is None:
            self.worst[key] = dict(record)
            return
        examples = current["examples"] + record["examples"]
        if float(record["score"]) > float(current["score"]):
            current = self.worst[key] = dict(record)
        current["examples"] = examples

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """pytest-xdist, on the controller: a worker ended without finishing (``error``, e.g. "Not properly
        terminated" for one that exited, with status 0 too) fails a property run, even between two tests."""
        if error is not None and self.property_run:
            self.workers_down.append(f"worker {node.gateway.id} went down before the session ended ({error})")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Collect the records left behind (not on an xdist worker: its controller does) and fail the run if any,
        or if a worker went down;
        a run whose property tests were all skipped as unsupported verified nothing, and does not exit 0 either
        (status 5, pytest's "nothing collected"), as ``fa2-verify run`` exits 2 when no case is supported."""
        if hasattr(session.config, "workerinput"):
            return
        inflight = inflight_of(session.config)
        self.died = left_behind(inflight.directory)
        inflight.close()
        if (self.died or self.workers_down) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.unsupported and not self.verified and session.exitstatus == pytest.ExitCode.OK:
            self.nothing_verified = True
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED

    def lines(self) -> list[str]:
        lines = [record.message() for record in self.died]
        lines += [f"{down}: what it ran after its last report was not verified" for down in self.workers_down]
        if self.nothing_verified:
            lines.append("nothing was verified: every property test was skipped as unsupported (exit status 5)")
        if self.examples:
            rate = self.examples / self.seconds if self.seconds else float("inf")
            lines.append(
                f"{self.examples} examples checked in {self.seconds:.1f} s of test time ({rate:.2f} examples/s per worker)"
            )
        if self.phases:
            spent = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.phases.items())
            lines.append(f"where it went: {spent} (kernel, golden and comparison of the cases compared with the golden)")
        if self.counts is not None:
            lines += self.kernel_errors.lines() + self.counts.lines()
        for reason, properties in sorted(self.unsupported.items()):
            lines.append(f"unsupported: {len(properties)} propert{'y' if len(properties) == 1 else 'ies'}: {reason}")
        for reason, count in sorted(self.declined.items()):
            lines.append(f"unsupported: {count} example(s) declined (by the kernel, or too large for the memory free): "
                         f"{reason}")
        for (test, label), record in sorted(self.worst.items()):
            lines.append(f"worst {label} in {test}: {float(record['score']):.3g} over {record['examples']} examples")
            lines.append(f"    {record['reproduction']}")
        return lines

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = self.lines()
        if lines:
            terminalreporter.section("fa2-verify property suite")
            for line in lines:
                terminalreporter.write_line(line)
