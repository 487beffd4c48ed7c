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
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator, TypeVar

Result = TypeVar("Result")


class UserCodeRaised(Exception):
    """User code raised ``raised``; the message is ``"<type>: <message>"``, or the type alone without a message."""

    def __init__(self, raised: BaseException) -> None:
        detail = str(raised)
        super().__init__(f"{type(raised).__name__}: {detail}" if detail else type(raised).__name__)
        self.raised = raised


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

    A SIGINT during the call ends it in ``KeyboardInterrupt`` (module docstring).
    """
    received: list[int] = []
    raised: BaseException | None = None
    with _sigint_noted(received):
        try:
            result = call()
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from user code are its failures too
            raised = exc
    if received:
        if isinstance(raised, KeyboardInterrupt):
            raise raised
        raise KeyboardInterrupt("interrupted (SIGINT) while the kernel ran") from raised
    if raised is None:
        return result
    if isinstance(raised, passthrough):
        raise raised
    raise UserCodeRaised(raised) from raised
