"""A kernel call that hangs: past a per-call limit, the process ends with one line naming the call and its case.

A GPU kernel that never finishes (a loop whose bound is wrong, a spin on a
flag no block sets) leaves the synchronize that ends every entry-point call
(:mod:`verify.kernel_call`) waiting for ever, and nothing in Python can
interrupt it.  So each call runs under :func:`watched`: a daemon timer that,
when the call has run :func:`call_timeout` seconds, prints
``fa2-verify: error: kernel call exceeded N s: forward on case <reproduction>``
on stderr and ends the process with status 1 (the real ``os._exit``,
:func:`verify.user_code.end_process`).  The ``fa2-verify`` supervisor then
reports the command as ended before it finished (:mod:`cli.supervisor`); in
the property suite the worker goes down with its in-flight case named
(:mod:`properties.inflight`).

The limit is the process's: ``--call-timeout`` of ``run``, ``repro``,
``baseline`` and ``gate``, ``--fa2-call-timeout`` of the property suite, by
default :data:`DEFAULT_CALL_TIMEOUT`, generous: a kernel call that compiles
its kernel first (Triton, FlexAttention) takes seconds to a minute, and the
slowest whole test of the CI suite, golden included, about 110 s (ci/durations.json).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

from fa2_verify.verify.user_code import end_process

#: Seconds a kernel call may run before the process ends, unless set otherwise.
DEFAULT_CALL_TIMEOUT = 600.0

_limit = [DEFAULT_CALL_TIMEOUT]


def set_call_timeout(seconds: float) -> None:
    """Make ``seconds`` the limit of every later kernel call of this process."""
    _limit[0] = seconds


def call_timeout() -> float:
    """The limit of a kernel call in this process, in seconds."""
    return _limit[0]


def _expire(seconds: float, call: str) -> None:
    print(f"fa2-verify: error: kernel call exceeded {seconds:g} s: {call}", file=sys.stderr, flush=True)
    end_process(1)


@contextlib.contextmanager
def watched(call: str) -> Iterator[None]:
    """Run the block, ending the process (module docstring) if it lasts longer than :func:`call_timeout`;
    ``call`` names it in the line printed, e.g. ``forward on case fa2-verify repro ...``."""
    seconds = call_timeout()
    timer = threading.Timer(seconds, _expire, (seconds, call))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
