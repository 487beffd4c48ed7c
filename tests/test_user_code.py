"""``verify.user_code.call_user_code``: user code that calls ``os._exit`` fails the call instead of ending
the process, from any thread and even if it catches the exception; a process it forks still exits."""

from __future__ import annotations

import ctypes
import os
import posix
import threading

import pytest

from fa2_verify.verify.user_code import KernelExited, UserCodeRaised, call_user_code

REAL_EXIT = os._exit


def _exits_with(module, status: int):
    """User code that ends the process through ``module._exit`` (looked up when it runs, as user code does)."""

    def user_code():
        module._exit(status)
        return "survived"

    return user_code


def _swallows_its_exit():
    try:
        os._exit(0)
    except BaseException:  # a launch wrapper's blanket handler
        pass
    return "outputs"


def _exits_in_a_thread():
    worker = threading.Thread(target=os._exit, args=(0,))
    worker.start()
    worker.join()
    return "outputs"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's KernelExited
@pytest.mark.parametrize(
    "user_code, status",
    [(_exits_with(os, 0), 0), (_exits_with(posix, 3), 3), (_swallows_its_exit, 0), (_exits_in_a_thread, 0)],
    ids=["os-exit", "posix-exit", "caught-by-the-user-code", "in-a-thread"],
)
def test_an_exit_from_user_code_fails_the_call(user_code, status):
    with pytest.raises(UserCodeRaised, match=rf"^KernelExited: the kernel called os._exit\({status}\)$") as raised:
        call_user_code(user_code)
    assert isinstance(raised.value.raised, KernelExited) and raised.value.raised.status == status
    assert os._exit is REAL_EXIT and posix._exit is REAL_EXIT


def test_user_code_that_does_not_exit_returns_and_the_real_exit_is_back():
    assert call_user_code(lambda: os._exit is not REAL_EXIT) is True
    assert os._exit is REAL_EXIT and posix._exit is REAL_EXIT


def test_a_process_forked_by_user_code_still_exits():
    """A forked child (a worker pool's) ends with its ``os._exit``; had it raised there, the child would run on
    in a copy of this test process, so it ends by the C library's ``_exit(99)`` instead."""

    def forks():
        pid = os.fork()
        if pid == 0:
            try:
                os._exit(7)
            finally:
                ctypes.CDLL(None)._exit(99)
        return os.waitpid(pid, 0)[1]

    assert os.waitstatus_to_exitcode(call_user_code(forks)) == 7
