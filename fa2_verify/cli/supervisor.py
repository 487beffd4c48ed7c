"""The ``fa2-verify`` command as installed: the command line runs in a child process that must say it finished.

A kernel is user code in the verifier's own process, and a process can end
without raising anything the verifier could catch: a native library calls
``exit(0)``, the kernel sends its process a signal, or closes its output.
:mod:`verify.user_code` stands in for ``os._exit``; for the rest, the
command (the console script ``fa2-verify`` and ``python -m fa2_verify``)
runs the same command line again (``sys.orig_argv``) in a child process,
with the standard streams inherited and the write end of a pipe whose
number is in :data:`STATUS_FD`.  The child runs :func:`cli.main.main` and,
at its very end, once its output is flushed, writes its exit status to the
pipe (:func:`run_child`).  The parent (this module: no torch, so one extra
interpreter start) exits with that status when the child exited with it too;
otherwise (an exit without the report, a signal, an exit other than the
status reported) it prints one line, ``fa2-verify: error: the process
running the kernel ended (exit 0) before run finished; nothing after the
last announced case was verified``, and exits 1, a kernel failure.

A command whose kernel lost the device goes on in a fresh process
(:func:`cli.child.rerun`, :mod:`verify.continuation`): the child replaces itself
(``os.execve`` of the same command line, keeping its pid and the pipe), so
the parent waits for it and reads its report as before, and the lost CUDA
context and the memory it holds go with the old image.

SIGINT, SIGTERM and SIGHUP sent to the parent are passed on to the child
(unless the parent started with them ignored: the child inherits that).  A
Ctrl-C at the terminal reaches both, so the child gets SIGINT twice within
moments; it acts on the first only (:class:`_FirstSigint`) and stops with
status 130 and its one line, as an unsupervised run does.  A child ended by
a signal the parent passed on ends the parent with 128 + that signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Callable

from fa2_verify.cli.child import STATUS_FD, child_status_fd

#: Signals the parent passes on to the child.
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main() -> int:
    """The console script: the supervising parent, or, in the child (:data:`STATUS_FD` set), the command."""
    status_fd = os.environ.pop(STATUS_FD, None)
    if status_fd is not None:
        return run_child(int(status_fd), sys.argv[1:])
    return supervise([sys.executable, *sys.orig_argv[1:]], command_name(sys.argv[1:]))


def command_name(argv: list[str]) -> str:
    """The subcommand ``argv`` names (its first word that is not an option), for the one-line error."""
    return next((word for word in argv if not word.startswith("-")), "the command")


def supervise(child_command: list[str], command: str) -> int:
    """Run ``child_command`` as the child, passing signals on; the status this process exits with."""
    import subprocess

    read_end, write_end = os.pipe()
    received: list[int] = []
    child: list[subprocess.Popen] = []

    def pass_on(signum: int, frame) -> None:
        received.append(signum)
        if child and child[0].returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child[0].pid, signum)

    previous = {signum: signal.getsignal(signum) for signum in PASSED_ON}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, pass_on)
    try:
        child.append(subprocess.Popen(child_command, env={**os.environ, STATUS_FD: str(write_end)},
                                      pass_fds=(write_end,)))
        os.close(write_end)
        for pending in received:
            os.kill(child[0].pid, pending)
        returncode = child[0].wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    os.set_blocking(read_end, False)
    try:
        report = os.read(read_end, 64)
    except BlockingIOError:
        report = b""
    os.close(read_end)
    reported = int(report) if report.strip().lstrip(b"-").isdigit() else None
    status, line = verdict(reported, returncode, command, passed_on=received)
    if line is not None:
        print(line, file=sys.stderr, flush=True)
    return status


def verdict(reported: int | None, returncode: int, command: str, *, passed_on: list[int]) -> tuple[int, str | None]:
    """The parent's exit status, and its one line if any, for a child that reported ``reported`` (``None``:
    nothing) and ended with ``returncode`` (``-N``: signal N)."""
    if reported is not None and returncode == reported:
        return reported, None
    if returncode < 0 and -returncode in passed_on:
        name = signal.Signals(-returncode).name
        return 128 - returncode, f"fa2-verify: interrupted ({name}): nothing was verified to completion"
    ended = f"signal {-returncode}, {signal.Signals(-returncode).name}" if returncode < 0 else f"exit {returncode}"
    if reported is not None:
        return max(reported, 1), (
            f"fa2-verify: error: the process running the kernel ended ({ended}) after {command} finished with "
            f"status {reported}: its output may be incomplete"
        )
    return 1, (
        f"fa2-verify: error: the process running the kernel ended ({ended}) before {command} finished; "
        "nothing after the last announced case was verified"
    )


class _FirstSigint:
    """The child's SIGINT handler: ``KeyboardInterrupt`` for a SIGINT, none for one that follows it within
    :attr:`WINDOW` seconds (the same Ctrl-C, from the terminal and passed on by the parent)."""

    WINDOW = 1.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last: float | None = None

    def __call__(self, signum: int, frame) -> None:
        now = self.clock()
        if self.last is not None and now - self.last < self.WINDOW:
            return
        self.last = now
        raise KeyboardInterrupt


def run_child(status_fd: int, argv: list[str]) -> int:
    """The command (:func:`cli.main.main`), then its status written to ``status_fd``, once stdout and stderr
    are flushed and only if ``status_fd`` is still the pipe it was (the kernel may have closed it).  An
    exception that escapes the command (a traceback: the kernel closed stdout, say) reports nothing."""
    pipe = os.fstat(status_fd)
    child_status_fd.append(status_fd)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _FirstSigint())
    from fa2_verify.cli.main import main as command

    try:
        status = command(argv)
    except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    _report(status_fd, pipe, status)
    return status


def _report(status_fd: int, pipe: os.stat_result, status: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        current = os.fstat(status_fd)
    except (OSError, ValueError):
        return
    if (current.st_dev, current.st_ino) == (pipe.st_dev, pipe.st_ino):
        with contextlib.suppress(OSError):
            os.write(status_fd, f"{status}\n".encode())
