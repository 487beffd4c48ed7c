"""One property test's examples: its share of the run's time, how many it ran, its failures as they happen.

``--fa2-time-budget SECONDS`` bounds the run's wall time: each of the run's T
property tests gets ``SECONDS x W / T`` (:func:`time_share`; W the xdist
workers, which run tests side by side) and stops generating once its share
is spent, however many examples its profile allows.  Hypothesis has no time
limit (``deadline`` fails one slow example instead), but it lets a test
runner's skip exception end a run at once: an example that passed and finds
the share spent raises :class:`ShareSpent` (a ``unittest.SkipTest``) as it
ends, and the plugin ends the test there, passing, with the examples it ran.
It is raised at the end, once the example has drawn all it draws: an example
that stopped drawing early would contradict the earlier ones, which
Hypothesis reports as a flaky strategy.  So a test overruns its share by at
most one example.  It stops no test that has failed, whose shrinking
Hypothesis bounds itself: a failure found is reported, minimal, not cut
short.  The first example always runs.

Every example that ran (not discarded by Hypothesis) is counted, and the
summary gives each property's count (:class:`Counts`), with how many ran
after the test's first failure (Hypothesis searching on, then shrinking).  A failing example is
written to the failure log as it fails (:mod:`properties.failure_log`).
"""

from __future__ import annotations

import dataclasses
import time
import unittest
from typing import Any

from hypothesis.errors import UnsatisfiedAssumption

from fa2_verify.properties.declaration import DeviceLost, DeviceOutOfMemory
from fa2_verify.properties.failure_log import FailureLog


class ShareSpent(unittest.SkipTest):
    """The test's time share is spent: ends its Hypothesis run at once (a test runner's skip exception, which
    Hypothesis re-raises untouched); the plugin turns it into the test's normal end."""


def time_share(budget: float, tests: int, workers: int) -> float:
    """Each of ``tests`` property tests' seconds of a run of ``budget`` seconds on ``workers`` processes."""
    return budget * max(1, workers) / max(1, tests)


def is_failure(error: BaseException) -> bool:
    """Whether an example that raised ``error`` failed (not discarded by ``reject``/``assume``, nor stopped)."""
    return isinstance(error, (Exception, DeviceLost, DeviceOutOfMemory)) and not isinstance(error, UnsatisfiedAssumption)


@dataclasses.dataclass
class Pacing:
    """The examples of property test ``test``: ``share`` seconds (``None``: no limit), failures to ``log``.

    Each example calls :meth:`begin`, then :meth:`ended`; :meth:`finish` ends the test.
    """

    test: str = ""
    share: float | None = None
    log: FailureLog | None = None
    examples: int = 0
    #: Examples run once the test had failed: Hypothesis' search for other failures, and its shrinking.
    after_failure: int = 0
    stopped: bool = False
    _started: float | None = None
    _failing: bool = False
    _last: dict[str, tuple[BaseException, str]] = dataclasses.field(default_factory=dict)

    def begin(self) -> None:
        """An example starts (the first starts the test's clock)."""
        if self._started is None:
            self._started = time.monotonic()

    def ended(self, error: BaseException | None, reproduction: str) -> None:
        """The example is over (``error``: what it raised); count it, and log a failure of a new class now.
        :class:`ShareSpent` when it passed and the share is spent (never once the test has failed)."""
        if error is not None and not is_failure(error):
            return
        self.examples += 1
        self.after_failure += self._failing
        if error is None:
            if self.share is not None and not self._failing:
                assert self._started is not None, "begin() starts the clock before the first example ends"
                if time.monotonic() - self._started >= self.share:
                    self.stopped = True
                    raise ShareSpent(
                        f"{self.test}: its time share of {self.share:.3g} s is spent after {self.examples} examples"
                    )
            return
        self._failing = True
        name = type(error).__name__
        if name not in self._last and self.log is not None:
            self.log.write(stage="found", test=self.test, error=error, reproduction=reproduction)
        self._last[name] = (error, reproduction)

    def finish(self) -> dict[str, Any]:
        """The test is over: log each failure class's last example; the test's counts, JSON-ready."""
        if self.log is not None:
            for error, reproduction in self._last.values():
                self.log.write(stage="last", test=self.test, error=error, reproduction=reproduction)
        seconds = time.monotonic() - self._started if self._started is not None else 0.0
        return {"examples": self.examples, "after_failure": self.after_failure, "seconds": seconds,
                "share": self.share, "stopped": self.stopped}


class Counts:
    """Each property's examples over its dtype tests, for the run's summary (one line per property)."""

    def __init__(self) -> None:
        self.properties: dict[str, dict[str, dict[str, Any]]] = {}

    def add(self, test: str, counts: dict[str, Any]) -> None:
        """Merge ``test``'s (``test_<property>[<dtype>]``) :meth:`Pacing.finish`."""
        prop, _, dtype = test.partition("[")
        self.properties.setdefault(prop, {})[dtype.rstrip("]") or "-"] = counts

    def lines(self) -> list[str]:
        lines = []
        for prop, shards in sorted(self.properties.items()):
            examples = sum(counts["examples"] for counts in shards.values())
            seconds = sum(counts["seconds"] for counts in shards.values())
            each = ", ".join(f"{dtype} {counts['examples']}" for dtype, counts in shards.items())
            line = f"examples of {prop}: {examples} in {seconds:.1f} s ({each})"
            shrinking = sum(counts["after_failure"] for counts in shards.values())
            if shrinking:
                line += f", {shrinking} of them after a failure (searching on, and shrinking)"
            stopped = [dtype for dtype, counts in shards.items() if counts["stopped"]]
            if stopped:
                share = next(counts["share"] for counts in shards.values() if counts["stopped"])
                line += f"; stopped at its time share of {share:.3g} s: {', '.join(stopped)}"
            lines.append(line)
        return lines
