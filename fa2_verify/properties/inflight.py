"""The case a property test is running, kept on disk while it runs, so a process that dies in the kernel names it.

A kernel that kills its process (a segfault or an abort, as PyTorch's cuDNN
SDPA backward does on an H100: docs/targets.md) raises nothing that the
harness could catch, report or shrink.  So before an example's first kernel
call the harness writes the example's case, as the one-line reproduction that
a failure prints (:meth:`core.case.CaseSpec.reproduction`), to this process's
in-flight file, ``<session directory>/inflight-<worker>-<pid>.json``
(atomically, :func:`core.atomic.write_bytes_atomic`, without an ``fsync``: it
must outlive its writer, not the machine), and removes it when the
example ends, however it ends (:class:`InFlight`).  A file still there when
the session is over was left by a process that died during that example:

* with pytest-xdist the controller outlives its workers; it reads the files
  at the end of the session (:func:`left_behind`), reports each in its
  terminal summary and fails the run (:mod:`properties.summary`);
* without xdist the process that dies is pytest itself, so the first record
  starts a watcher process (:func:`watch`) that waits for pytest to exit and
  then prints the records left behind on stderr.  pytest's exit status is
  then the signal's (134 for an abort, 139 for a segfault), or whatever a
  native library passed to ``exit`` (a kernel's ``os._exit`` raises instead,
  :mod:`verify.user_code`; ``fa2-verify suite`` fails a pytest that exits 0
  before its session finished).

Python's ``faulthandler`` (enabled by pytest) prints the dying process's
traceback, which says where in the kernel it died; the record says on which
case.

This module imports only the standard library and :mod:`core.atomic`, so the
watcher starts without torch or Hypothesis.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Callable, ContextManager

from fa2_verify.core.atomic import write_bytes_atomic

#: Name prefix of an in-flight file.
PREFIX = "inflight-"


@dataclasses.dataclass(frozen=True)
class Record:
    """What one process was running: the kernel on its device, the test, and the case's reproduction."""

    kernel: str
    device: str
    test: str
    worker: str
    pid: int
    case: dict[str, Any]
    reproduction: str

    def message(self) -> str:
        """``the process (WORKER, pid PID) died while running KERNEL on DEVICE in TEST, on this case: REPRO``."""
        return (
            f"the process ({self.worker}, pid {self.pid}) died while running {self.kernel} on {self.device} "
            f"in {self.test}, on this case: {self.reproduction}"
        )


def session_directory() -> pathlib.Path:
    """A fresh directory name for one session's in-flight files (created by the first record)."""
    return pathlib.Path(tempfile.gettempdir()) / f"fa2-verify-inflight-{os.getpid()}-{secrets.token_hex(4)}"


def left_behind(directory: pathlib.Path) -> list[Record]:
    """The records in ``directory``, by file name: each is a process that died during an example."""
    if not directory.is_dir():
        return []
    return [Record(**json.loads(path.read_text())) for path in sorted(directory.glob(f"{PREFIX}*.json"))]


@dataclasses.dataclass
class InFlight:
    """This process's in-flight file in ``directory``.

    With ``watch_within``, the first record starts the watcher (:func:`watch`)
    inside that context: the plugin passes pytest's "capture off" context, so
    the watcher inherits the terminal's stderr, not a capture file that dies
    with pytest.
    """

    directory: pathlib.Path
    worker: str
    watch_within: Callable[[], ContextManager[None]] | None = None
    _watcher: subprocess.Popen | None = dataclasses.field(default=None, repr=False)

    @property
    def path(self) -> pathlib.Path:
        return self.directory / f"{PREFIX}{self.worker}-{os.getpid()}.json"

    def begin(self, *, kernel: str, device: str, test: str, case: dict[str, Any], reproduction: str) -> None:
        """Record the case about to run (replacing the record of this process's previous example, if any)."""
        record = Record(kernel, device, test, self.worker, os.getpid(), case, reproduction)
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.watch_within is not None and self._watcher is None:
            with self.watch_within():
                self._watcher = _start_watcher(self.directory)
        write_bytes_atomic(self.path, json.dumps(dataclasses.asdict(record)).encode(), overwrite=True, sync=False)

    def end(self) -> None:
        """The example is over: remove the record."""
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        """The session is over: remove the directory, then let the watcher find nothing and exit."""
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._watcher is not None:
            self._watcher.communicate()
            self._watcher = None


def _start_watcher(directory: pathlib.Path) -> subprocess.Popen:
    """``python -m fa2_verify.properties.inflight DIRECTORY``, reading a pipe that only this process writes to.

    In its own session, so a Ctrl-C at the terminal does not reach it; with
    this package's parent directory first on its path, so it imports this
    very module.
    """
    package_parent = str(pathlib.Path(__file__).resolve().parents[2])
    path = os.pathsep.join(part for part in (package_parent, os.environ.get("PYTHONPATH", "")) if part)
    return subprocess.Popen(
        [sys.executable, "-m", "fa2_verify.properties.inflight", str(directory)],
        stdin=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
        start_new_session=True,
    )


def watch(directory: pathlib.Path) -> None:
    """Wait for the parent to exit (end of file on stdin), then print each record left in ``directory`` on stderr."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.buffer.read()
    for record in left_behind(directory):
        print(f"fa2-verify: {record.message()}", file=sys.stderr, flush=True)
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    watch(pathlib.Path(sys.argv[1]))
