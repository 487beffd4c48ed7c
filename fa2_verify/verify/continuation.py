"""A case loop that outlives a device fault: the cases done go to a fresh process, which runs the rest.

Once a kernel has faulted the device (:mod:`verify.device_fault`) this process
can run nothing more on it, yet the cases after the faulting one must still
be verified and the report must hold them all.  So each case of
:func:`verify.check.run_cases` goes through :func:`case_results`.  Within a
command (:func:`carried_over`, which :func:`cli.main.main` wraps around every
command) each case's results are journaled, in order; when a case has faulted
the device, the loop raises :class:`DeviceFaulted` and the command writes the
journal to a file in a new temporary directory (:meth:`DeviceFaulted.save`)
and runs its own command line again in a fresh process, :data:`ENV` naming the
file (:func:`cli.child.rerun`).  There the journal's cases, met in the same
order, are taken from the file instead of run (the faulting one as the error
it was, the fault named), and the rest run; the file and its directory are
removed once read.  A second fault repeats this, each process at least one
case further on, so the loop ends.  Outside a command (``run_cases`` called as a
library) nothing is journaled and a fault is the case's error, as any other
failure of the kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Callable, Iterator

from fa2_verify.core.case import CaseSpec
from fa2_verify.verify import device_fault
from fa2_verify.verify.results import CaseResult

#: The environment variable naming the journal a fresh process continues from.
ENV = "FA2_VERIFY_CONTINUE"

#: A journaled case: its spec (``to_dict``) and its results.
Entry = tuple[dict[str, Any], list[CaseResult]]


class DeviceFaulted(Exception):
    """A case of the loop faulted the device; ``journal`` holds every case this command has done, that one
    included, for the fresh process to continue from."""

    def __init__(self, fault: str, case: str, journal: list[Entry]) -> None:
        super().__init__(f"the device faulted in case {case} ({fault})")
        self.journal = journal

    def save(self) -> pathlib.Path:
        """The journal, written to a file in a new temporary directory (read and removed by :func:`carried_over`)."""
        path = pathlib.Path(tempfile.mkdtemp(prefix="fa2-verify-continue-")) / "journal.json"
        entries = [
            {"spec": key, "results": [{"result": result.to_dict(), "seconds": result.seconds} for result in results]}
            for key, results in self.journal
        ]
        path.write_text(json.dumps(entries))
        return path


def _load(path: pathlib.Path) -> list[Entry]:
    entries = json.loads(path.read_text())
    shutil.rmtree(path.parent, ignore_errors=True)
    return [
        (entry["spec"], [dataclasses.replace(CaseResult.from_dict(item["result"]), seconds=item["seconds"])
                         for item in entry["results"]])
        for entry in entries
    ]  # fmt: skip


@dataclasses.dataclass
class _Journal:
    carried: list[Entry]
    done: list[Entry] = dataclasses.field(default_factory=list)


_active: list[_Journal] = []


@contextlib.contextmanager
def carried_over() -> Iterator[None]:
    """Journal the case loops run in the block, continuing from the journal :data:`ENV` names, if set
    (taken out of the environment, and removed once read)."""
    path = os.environ.pop(ENV, None)
    _active.append(_Journal(_load(pathlib.Path(path)) if path else []))
    try:
        yield
    finally:
        _active.pop()


def case_results(spec: CaseSpec, label: str, run: Callable[[], list[CaseResult]]) -> list[CaseResult]:
    """``run()``, the results of case ``spec`` (named ``label``), or the journal's results of it when a faulted
    process ran it; :class:`DeviceFaulted` once the device has faulted, in a command (module docstring)."""
    if not _active:
        return run()
    journal, key = _active[-1], json.loads(json.dumps(spec.to_dict()))
    index = len(journal.done)
    carried = index < len(journal.carried) and journal.carried[index][0] == key
    results = journal.carried[index][1] if carried else run()
    journal.done.append((key, results))
    fault = device_fault.recorded()
    if fault is not None:
        raise DeviceFaulted(fault, label, list(journal.done))
    return results
