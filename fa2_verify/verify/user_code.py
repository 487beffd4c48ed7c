"""Calling the code under test: whatever it raises comes back as one exception the caller can name.

A kernel target is user code: importing its module, its entry points
(``forward``, ``backward`` and the varlen pair) and its hooks
(``capabilities``, ``unavailable_reason()``, ``config()``).  Any of them may
raise any :class:`BaseException`, not only an :class:`Exception`: a launch
wrapper that calls ``sys.exit(0)`` raises :class:`SystemExit`, one that joins a
worker thread or process pool may re-raise its :class:`KeyboardInterrupt`.
Left to propagate, ``SystemExit(0)`` would end fa2-verify with status 0 and
nothing verified.  :func:`call_user_code` turns every one of them into a
:class:`UserCodeRaised`, which the caller reports with the hook's name
(:class:`verify.kernel_call.KernelFailure` for an entry point,
:class:`~core.errors.KernelLoadError` for the import and the hooks).

The one exception it lets through is a Ctrl-C the user presses.  Python
delivers SIGINT to the main thread only, as a ``KeyboardInterrupt`` raised
wherever that thread is, most often inside the kernel, so the exception alone
cannot tell the user's Ctrl-C from a kernel's.  While user code runs in the
main thread, a SIGINT handler notes that the signal arrived and then calls the
handler it stands in for (Python's, which raises ``KeyboardInterrupt``).  If
the signal arrived during the call, the call ends in ``KeyboardInterrupt``
whatever the user code raised or returned, and the run stops as asked.  A
``KeyboardInterrupt`` raised while no SIGINT arrived is the kernel's own, and
is reported as its failure.

Nor may user code end the process with ``os._exit`` (a launch wrapper that
exits where a C++ one would call ``exit(0)``): while it runs, ``os._exit`` and
``posix._exit`` raise :class:`KernelExited` instead, in whichever thread of
this process calls them, and the call fails with it even if the user code
caught it.  A process forked by the user code exits as before.  What this
cannot stand in for (a native library's ``exit``, a signal, the process
closing its own output) the ``fa2-verify`` supervisor catches
(:mod:`cli.supervisor`).
"""

from __future__ import annotations

import contextlib
import os
import posix
import signal
import threading
from typing import Callable, Iterator, NoReturn, TypeVar

Result = TypeVar("Result")


class UserCodeRaised(Exception):
    """User code raised ``raised``; the message is ``"<type>: <message>"``, or the type alone without a message."""

    def __init__(self, raised: BaseException) -> None:
        detail = str(raised)
        super().__init__(f"{type(raised).__name__}: {detail}" if detail else type(raised).__name__)
        self.raised = raised


class KernelExited(BaseException):
    """User code called ``os._exit(status)``; a :class:`BaseException`, as :class:`SystemExit` is, so that
    an ``except Exception`` in the user code does not take it for one of its own errors."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the kernel called os._exit({status})")
        self.status = status


#: The real ``os._exit``; the calls running now: the process each runs in, and the statuses its user code
#: passed to the stand-in.
_REAL_EXIT = os._exit
_running: list[tuple[int, list[int]]] = []
_running_lock = threading.Lock()


def end_process(status: int) -> None:
    """End this process now with ``status``: the real ``os._exit``, even while user code runs (the
    watchdog of a hung kernel call, :mod:`verify.watchdog`)."""
    _REAL_EXIT(status)


def _stand_in(status: int) -> NoReturn:
    """``os._exit`` while user code runs: note ``status`` for every call running in this process and raise
    :class:`KernelExited`; in a process forked from it (no call runs there), the real exit."""
    with _running_lock:
        noted = [exited for pid, exited in _running if pid == os.getpid()]
    if not noted:
        _REAL_EXIT(status)
    for exited in noted:
        exited.append(status)
    raise KernelExited(status)


@contextlib.contextmanager
def _exit_raises(exited: list[int]) -> Iterator[None]:
    """In the block, ``os._exit(status)`` (also as ``posix._exit``), in any thread of this process, appends
    ``status`` to ``exited`` and raises :class:`KernelExited`; the real one is back once no call runs."""
    entry = (os.getpid(), exited)
    with _running_lock:
        _running.append(entry)
        os._exit = posix._exit = _stand_in
    try:
        yield
    finally:
        with _running_lock:
            del _running[next(index for index, running in enumerate(_running) if running is entry)]
            if not _running:
                os._exit = posix._exit = _REAL_EXIT


@contextlib.contextmanager
def _sigint_noted(received: list[int]) -> Iterator[None]:
    """Append to ``received`` each SIGINT that arrives in the block, then handle it as before.

    Only in the main thread (the only one Python delivers signals to), and only
    while SIGINT has a Python handler, which is what raises ``KeyboardInterrupt``.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return

    def note(signum, frame):
        received.append(signum)
        previous(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def call_user_code(call: Callable[[], Result], *, passthrough: tuple[type[BaseException], ...] = ()) -> Result:
    """``call()``; what it raises, unless of a ``passthrough`` type, as :class:`UserCodeRaised`.

    A SIGINT during the call ends it in ``KeyboardInterrupt``; a call of ``os._exit`` fails it with
    :class:`KernelExited` (module docstring).
    """
    received: list[int] = []
    exited: list[int] = []
    raised: BaseException | None = None
    with _sigint_noted(received), _exit_raises(exited):
        try:
            result = call()
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from user code are its failures too
            raised = exc
    if exited and not isinstance(raised, KernelExited):
        raised = KernelExited(exited[0])
    if received:
        if isinstance(raised, KeyboardInterrupt):
            raise raised
        raise KeyboardInterrupt("interrupted (SIGINT) while the kernel ran") from raised
    if raised is None:
        return result
    if isinstance(raised, passthrough):
        raise raised
    raise UserCodeRaised(raised) from raised
