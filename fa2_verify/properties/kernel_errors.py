"""A kernel error at a declared shape: a failure class of its own, reported once, its shape class left alone.

The strategies draw only what the kernel declares, so an exception its entry
point raises (a Triton ``CompilationError`` at a head dim it declares, an
assertion on its tiles) is a mismatch between its capabilities and what it
runs.  Left as one more :class:`~properties.declaration.PropertyFailure`,
every property met it, shrank to it, and stopped looking soon after (Hypothesis
generates about twice the calls of its first failure, then shrinks): the
value bugs of a kernel with such an error surfaced in few properties.  So:

* each distinct error, its entry point and exception type, fails as a
  subclass of :class:`~properties.declaration.KernelError` of its own
  (:func:`failure_class`), which Hypothesis searches and shrinks apart from
  the value and mask failures (docs/properties.md, "Kernel errors");
* the first property test of the run that meets it reports it (fails with
  its minimal case); another test that meets it discards the example
  (``reject``), so its examples go to the rest of the declared space;
* its **shape class**, ``(head_dim, dtype)`` of the case that raised, is
  not drawn again by the later tests of the run: an example of such a class
  is discarded before the kernel runs.  The classes a test avoids are fixed
  when it starts, so a failure it is shrinking cannot turn into a discarded
  example mid-way (Hypothesis would call that flaky);
* the processes of a session share what they met through a file in the
  session's directory (:data:`SHARED_FILE`, one JSON line per error and shape
  class, appended, :func:`core.atomic.append_line`), read when a test starts;
* the run's summary lists each distinct error once, in the kernel's terms
  (:class:`Summary`): "declares head_dim 1..256; its forward raises
  CompilationError for head_dim <= 8 (...)", the bound stated only when every
  head dim drawn up to it raised and every one drawn above it ran.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterable
from typing import Any

from fa2_verify.core.atomic import append_line
from fa2_verify.core.case import CaseSpec
from fa2_verify.properties.declaration import KernelError

#: The file, in the session's directory (:mod:`properties.inflight`), where its processes note the errors met.
SHARED_FILE = "kernel-errors.jsonl"

#: ``(head_dim, dtype)``: the shape class of a case, left alone by later tests once an error was met in it.
ShapeClass = tuple[int, str]
#: ``(entry point, exception type)``: what tells two kernel errors apart.
ErrorKey = tuple[str, str]

_failure_classes: dict[ErrorKey, type[KernelError]] = {}


def shape_class(spec: CaseSpec) -> ShapeClass:
    """``(head_dim, dtype)`` of ``spec`` (a packed batch's shared head dim and dtype)."""
    return spec.head_dim, spec.dtype


def failure_class(error: ErrorKey) -> type[KernelError]:
    """The :class:`KernelError` subclass of one distinct error, ``KernelError[forward raised CompilationError]``:
    Hypothesis tells failures apart by exception type, so each distinct error is searched and shrunk apart."""
    if error not in _failure_classes:
        name = f"KernelError[{error[0]} raised {error[1]}]"
        namespace = {"__module__": KernelError.__module__, "__qualname__": name, "error": error}
        _failure_classes[error] = type(name, (KernelError,), namespace)
    return _failure_classes[error]


def ranges(values: Iterable[int]) -> str:
    """``1..8, 16, 32..64``: sorted integers with their runs of consecutive values joined."""
    runs: list[list[int]] = []
    for value in sorted(set(values)):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ", ".join(str(low) if low == high else f"{low}..{high}" for low, high in runs)


@dataclasses.dataclass
class KernelErrors:
    """What one process knows of the kernel's errors, and what the property test running now met.

    ``shared``: the session's file of errors met (:data:`SHARED_FILE`), or
    ``None`` (one process, as :func:`properties.harness.search` runs).
    A test calls :meth:`start`, then per example :meth:`blocked` and
    :meth:`begin` before the kernel runs, :meth:`met` when it raised,
    :meth:`end` after; :meth:`take` gives the test's report.
    """

    shared: pathlib.Path | None = None
    test: str = ""
    #: error -> the test that reports it (this process's, and those read from ``shared``).
    _owners: dict[ErrorKey, str] = dataclasses.field(default_factory=dict)
    #: shape class -> the first error met in it.
    _classes: dict[ShapeClass, ErrorKey] = dataclasses.field(default_factory=dict)
    #: The classes this test leaves alone, fixed when it started.
    _blocked: dict[ShapeClass, ErrorKey] = dataclasses.field(default_factory=dict)
    _met: dict[ErrorKey, dict[str, Any]] = dataclasses.field(default_factory=dict)
    _ran: set[ShapeClass] = dataclasses.field(default_factory=set)
    _skipped: int = 0
    _example: ShapeClass | None = None

    def start(self, test: str) -> None:
        """Test ``test`` starts: read what the session's other processes met, fix the classes it leaves alone."""
        self.test, self._met, self._ran, self._skipped, self._example = test, {}, set(), 0, None
        for record in self._read_shared():
            error = (record["entry"], record["raised"])
            self._owners.setdefault(error, record["test"])
            self._classes.setdefault((record["head_dim"], record["dtype"]), error)
        self._blocked = {cls: error for cls, error in self._classes.items() if self._owners[error] != test}

    def _read_shared(self) -> list[dict[str, Any]]:
        if self.shared is None or not self.shared.is_file():
            return []
        return [json.loads(line) for line in self.shared.read_text().splitlines() if line.endswith("}")]

    def blocked(self, spec: CaseSpec) -> ErrorKey | None:
        """The error another test met in ``spec``'s shape class, before this test started (the example is then
        not run, and counted); ``None`` if this test runs the class."""
        error = self._blocked.get(shape_class(spec))
        if error is not None:
            self._skipped += 1
        return error

    def begin(self, spec: CaseSpec) -> None:
        """An example of ``spec`` is about to run the kernel."""
        self._example = shape_class(spec)

    def declined(self) -> None:
        """The example did not run the kernel on its case (declined as unsupported)."""
        self._example = None

    def end(self) -> None:
        """The example is over; if it ran without a kernel error, its shape class ran."""
        if self._example is not None:
            self._ran.add(self._example)
        self._example = None

    def met(self, error: ErrorKey, spec: CaseSpec, message: str, reproduction: str) -> bool:
        """The kernel raised ``error`` on ``spec``: record it; ``True`` when this test reports it (it met it first
        in the run, or is the one that did), ``False`` when another test does (the example is then discarded)."""
        self._example = None
        owner = self._owners.setdefault(error, self.test)
        cls = shape_class(spec)
        if cls not in self._classes:
            self._classes[cls] = error
            if self.shared is not None:
                self.shared.parent.mkdir(parents=True, exist_ok=True)
                line = {"entry": error[0], "raised": error[1], "head_dim": cls[0], "dtype": cls[1], "test": owner}
                append_line(self.shared, json.dumps(line), sync=False)
        record = self._met.setdefault(
            error, {"entry": error[0], "raised": error[1], "reported_by": owner, "classes": [], "examples": 0}
        )
        record["examples"] += 1
        if list(cls) not in record["classes"]:
            record["classes"].append(list(cls))
        reports = owner == self.test
        if reports:
            record["message"], record["minimal"] = message.splitlines()[0], reproduction
        else:
            self._skipped += 1
        return reports

    def take(self) -> dict[str, Any]:
        """This test's report, JSON-ready: the errors it met, the shape classes that ran, the examples it left."""
        return {
            "errors": list(self._met.values()),
            "ran": sorted(list(cls) for cls in self._ran),
            "skipped": self._skipped,
        }


class Summary:
    """The run's kernel errors, from every test's :meth:`KernelErrors.take` (on the xdist controller, from every
    worker): each distinct error once, in the kernel's terms."""

    def __init__(self) -> None:
        self.errors: dict[ErrorKey, dict[str, Any]] = {}
        self.ran: set[ShapeClass] = set()
        self.skipped = 0
        self.kernel = ""
        self.declared: list[int] = []

    def add(self, report: dict[str, Any]) -> None:
        """Merge one test's report (:meth:`properties.session.Suite.take_observations`' ``kernel_errors``)."""
        self.kernel, self.declared = report["kernel"], report["declared"]
        self.ran |= {(head_dim, dtype) for head_dim, dtype in report["ran"]}
        self.skipped += report["skipped"]
        for record in report["errors"]:
            merged = self.errors.setdefault((record["entry"], record["raised"]), {"classes": set(), "examples": 0})
            merged["classes"] |= {(head_dim, dtype) for head_dim, dtype in record["classes"]}
            merged["examples"] += record["examples"]
            if "minimal" in record:
                merged.update(reported_by=record["reported_by"], minimal=record["minimal"], message=record["message"])
            merged.setdefault("reported_by", record["reported_by"])

    def where(self, classes: set[ShapeClass]) -> str:
        """Where an error raised, as its head dims: ``for head_dim <= 8`` when every head dim drawn up to the
        largest that raised raised and every one drawn above it ran (with the same dtypes), else the list."""
        dtypes = sorted({dtype for _, dtype in classes})
        raised = {head_dim for head_dim, _ in classes}
        ran = {head_dim for head_dim, dtype in self.ran if dtype in dtypes}
        drawn = f"head_dim {ranges(raised)} with {', '.join(dtypes)}"
        bound = max(raised)
        if ran and not any(head_dim <= bound for head_dim in ran):
            return f"for head_dim <= {bound} (raised at {drawn}; ran at every head_dim drawn above it, {min(ran)} to {max(ran)})"
        return f"at {drawn}"

    def lines(self) -> list[str]:
        lines = []
        for (entry, raised), merged in sorted(self.errors.items()):
            lines.append(
                f"kernel error: {self.kernel} declares head_dim {ranges(self.declared)}; its {entry} raises {raised} "
                f"{self.where(merged['classes'])}, in {merged['examples']} example(s); reported once, by "
                f"{merged['reported_by']}: {merged.get('message', '')}"
            )
            if "minimal" in merged:
                lines.append(f"    {merged['minimal']}")
        if self.skipped:
            lines.append(
                f"kernel errors: {self.skipped} example(s) of other property tests left the shape classes "
                "(head_dim, dtype) where an error was met"
            )
        return lines
