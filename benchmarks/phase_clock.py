"""Exclusive wall time per phase, for nested timed calls (the suite-time plugin's clock).

A phase entered inside another one (Triton compiling inside a kernel call,
the golden inside the error model's bounds) is charged only to itself: when
it leaves, its elapsed time is taken off its parent's.  The phase totals of a
span of work therefore add up to at most its wall time, never more, and the
rest of that wall time is what no timed function accounts for.

``sync`` runs at every phase boundary: on CUDA it is ``torch.cuda.synchronize``,
so asynchronous work launched in one phase is charged to that phase and not
to whichever phase happens to wait for it next.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class PhaseClock:
    """Totals of exclusive time per phase name since the last :meth:`take`."""

    def __init__(self, now: Callable[[], float] = time.perf_counter, sync: Callable[[], None] = lambda: None) -> None:
        self._now = now
        self._sync = sync
        #: Open phases, innermost last: [name, start, time spent in nested phases].
        self._open: list[list] = []
        self._totals: dict[str, float] = {}
        self._thread = threading.get_ident()

    def enter(self, phase: str) -> None:
        self._sync()
        self._open.append([phase, self._now(), 0.0])

    def leave(self) -> None:
        self._sync()
        phase, started, nested = self._open.pop()
        elapsed = self._now() - started
        self._totals[phase] = self._totals.get(phase, 0.0) + elapsed - nested
        if self._open:
            self._open[-1][2] += elapsed

    def take(self) -> dict[str, float]:
        """The totals of the phases left since the last call, and start again from zero."""
        totals, self._totals = self._totals, {}
        return totals

    def timed(self, phase: str, function: Callable) -> Callable:
        """``function``, its calls charged to ``phase`` (a raising call too).

        Only calls on the clock's own thread are timed: a call on another
        thread (a background compile) overlaps the main thread's phases, and
        charging it would count the same seconds twice.
        """

        def timed_call(*args, **kwargs):
            if threading.get_ident() != self._thread:
                return function(*args, **kwargs)
            self.enter(phase)
            try:
                return function(*args, **kwargs)
            finally:
                self.leave()

        timed_call.__wrapped__ = function
        timed_call.__name__ = getattr(function, "__name__", "timed_call")
        timed_call.__doc__ = getattr(function, "__doc__", None)
        return timed_call
