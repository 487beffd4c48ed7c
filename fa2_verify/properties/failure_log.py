"""Failures written as they happen: one JSON line per failure, so a run cut off still has what it found.

``--fa2-failures FILE`` (default ``failures.jsonl`` in the examples directory,
``--fa2-examples-dir`` or ``<rootdir>/.fa2-examples``, when that directory
exists; else none) names the file.  Each failing example of a new failure
class in a property test appends a line as it fails (``"stage": "found"``,
the case as drawn, before shrinking), and the test's end one line per class
with the last failing example Hypothesis tried (``"stage": "last"``: the
minimal case it reports).  A line is one ``write`` to a file opened with
``O_APPEND``, then ``fsync`` (:func:`core.atomic.append_line`): xdist workers
append to one file without interleaving, and a run that CI kills mid-shrink
keeps its findings.  Lines are appended to what the file holds (each names
its time, process and test), never overwriting it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
from typing import Any

from fa2_verify.core.atomic import append_line

#: The file's name in the examples directory when ``--fa2-failures`` is not given.
DEFAULT_NAME = "failures.jsonl"


def failures_path(option: str | None, examples_dir: pathlib.Path) -> pathlib.Path | None:
    """The file ``--fa2-failures`` names, else :data:`DEFAULT_NAME` in ``examples_dir`` if it exists, else ``None``;
    ``ValueError`` naming the problem for an empty value, a directory, or a file whose directory is missing."""
    if option is None:
        return examples_dir / DEFAULT_NAME if examples_dir.is_dir() else None
    path = pathlib.Path(option)
    if option == "":
        raise ValueError("names no file: pass a file, or leave the option out")
    if path.is_dir():
        raise ValueError("is a directory: name the file to append to")
    if not path.parent.is_dir():
        raise ValueError(f"its directory {path.parent} does not exist")
    return path


@dataclasses.dataclass(frozen=True)
class FailureLog:
    """Appends failure records to ``path``, each naming the ``kernel`` and ``device``."""

    path: pathlib.Path
    kernel: str
    device: str

    def write(self, *, stage: str, test: str, error: BaseException, reproduction: str) -> None:
        """One line: ``stage`` (``found`` or ``last``), the test, the failure's class and message, the case."""
        record: dict[str, Any] = {
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "pid": os.getpid(),
            "stage": stage,
            "test": test,
            "kernel": self.kernel,
            "device": self.device,
            "failure": type(error).__name__,
            "message": str(error),
            "reproduction": reproduction,
        }
        append_line(self.path, json.dumps(record))
