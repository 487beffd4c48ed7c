"""pytest plugin: where each property test's wall time goes, written as JSON lines per process.

Loaded by ``benchmarks/suite_time.py`` with ``-p benchmarks.suite_phases
--suite-time-dir DIR`` (without ``--suite-time-dir`` it does nothing).  In
every process that runs tests (each pytest-xdist worker, or the single
process without xdist), before any test runs, it wraps the functions that do
each phase, in their home module and wherever an already imported module of
fa2_verify or Triton holds them under a name of its own (``from ... import``):

* ``compile``: Triton's compiler entry (``triton.compiler.compiler.compile``,
  a cache hit included: loading a cached kernel) and the loading of a
  compiled kernel onto the device (``CompiledKernel._init_handles``);
* ``kernel``: every call of an entry point, :func:`verify.kernel_call.call_entry`
  (the call, synchronised, with the contract's poisoning and input checks),
  less any compile inside it;
* ``golden``: :func:`golden.api.compute`;
* ``comparison``: the error model's bounds, the naive low-precision attention,
  :func:`verify.metrics.compare`, :func:`properties.relations.compare_runs`
  and the dQ spread bound, less any golden inside them;
* ``inputs``: :func:`core.case.make_case` (drawing the case's tensors).

Each phase's time is exclusive (:class:`benchmarks.phase_clock.PhaseClock`),
with ``torch.cuda.synchronize()`` at every boundary once CUDA is in use.  The
examples a test ran are the calls of ``Suite.finished`` (once per example,
however it ends).  A test's wall time is its whole pytest protocol (setup,
call, teardown); what the phases leave of it is Hypothesis and the harness.
One line per test, and at the end one for the process's time outside tests
(startup, collection, loading the kernel), go to ``DIR/<worker>.jsonl``; a
target this copy of fa2_verify lacks is named in that last line.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import pkgutil
import sys
import time
from typing import Any

import pytest

from benchmarks.phase_clock import PhaseClock

#: The record of a process's time outside any test.
OUTSIDE = "(outside tests)"

#: (module, attribute path, phase) of every timed function.
TARGETS: tuple[tuple[str, str, str], ...] = (
    ("triton.compiler.compiler", "compile", "compile"),
    ("triton.compiler.compiler", "CompiledKernel._init_handles", "compile"),
    ("fa2_verify.verify.kernel_call", "call_entry", "kernel"),
    ("fa2_verify.golden.api", "compute", "golden"),
    ("fa2_verify.verify.error_model", "first_order_bounds", "comparison"),
    ("fa2_verify.verify.lowprec", "naive_attention", "comparison"),
    ("fa2_verify.verify.metrics", "compare", "comparison"),
    ("fa2_verify.properties.relations", "compare_runs", "comparison"),
    ("fa2_verify.properties.determinism", "dq_spread_bound", "comparison"),
    ("fa2_verify.core.case", "make_case", "inputs"),
)

#: Called once at the end of every example.
EXAMPLE_END = ("fa2_verify.properties.session", "Suite.finished")

#: Packages whose modules may hold a timed function under their own name.
_REBOUND = ("fa2_verify", "triton")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("suite-time").addoption(
        "--suite-time-dir", default=None, metavar="DIR", help="write each test's time per phase to DIR/<worker>.jsonl"
    )


def _cuda_sync() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _resolve(module_name: str, path: str) -> tuple[Any, str, Any]:
    """``(owner, attribute, value)`` of ``module_name`` + ``path`` (``Class.method`` allowed); raises if absent."""
    owner = importlib.import_module(module_name)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    return owner, name, getattr(owner, name)


def _import_property_modules() -> None:
    """Import every module of the property suite, so their own names for timed functions can be rebound."""
    import fa2_verify.properties as properties

    for module in pkgutil.iter_modules(properties.__path__):
        importlib.import_module(f"{properties.__name__}.{module.name}")


def _rebind(original: Any, replacement: Any) -> None:
    """Point every module-level name in fa2_verify and Triton that holds ``original`` at ``replacement``."""
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in _REBOUND:
            continue
        for attribute, value in list(vars(module).items()):
            if value is original:
                setattr(module, attribute, replacement)


class SuitePhases:
    """The per-process recorder: wraps the targets, times each test, writes the JSON lines."""

    def __init__(self, directory: pathlib.Path, worker: str) -> None:
        self.path = directory / f"{worker}.jsonl"
        self.worker = worker
        self.clock = PhaseClock(sync=_cuda_sync)
        self.started = time.perf_counter()
        self.examples = 0
        self.in_tests = 0.0
        self.outside: dict[str, float] = {}
        self.examples_outside = 0
        self.outcomes: dict[str, str] = {}
        self.missing = self._install()

    def _install(self) -> list[str]:
        """Wrap every target; the ones this fa2_verify or Triton lacks, as ``module:path``."""
        missing = []
        try:
            _import_property_modules()
        except ImportError as exc:
            missing.append(f"fa2_verify.properties ({exc})")
        for module_name, path, phase in TARGETS:
            try:
                owner, name, original = _resolve(module_name, path)
            except (ImportError, AttributeError):
                missing.append(f"{module_name}:{path}")
                continue
            timed = self.clock.timed(phase, original)
            setattr(owner, name, timed)
            _rebind(original, timed)
        try:
            owner, name, finished = _resolve(*EXAMPLE_END)
        except (ImportError, AttributeError):
            missing.append(":".join(EXAMPLE_END))
        else:
            setattr(owner, name, self._counted(finished))
        return missing

    def _counted(self, finished: Any) -> Any:
        def counted(*args, **kwargs):
            self.examples += 1
            return finished(*args, **kwargs)

        return counted

    def _write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    def _take(self) -> tuple[dict[str, float], int]:
        examples, self.examples = self.examples, 0
        return self.clock.take(), examples

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        phases, examples = self._take()
        self._add_outside(phases, examples)
        started = time.perf_counter()
        try:
            return (yield)
        finally:
            seconds = time.perf_counter() - started
            self.in_tests += seconds
            phases, examples = self._take()
            self._write({
                "test": item.nodeid, "worker": self.worker, "seconds": seconds, "phases": phases,
                "examples": examples, "outcome": self.outcomes.pop(item.nodeid, "passed"),
            })  # fmt: skip

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
        elif report.skipped and self.outcomes.get(report.nodeid) != "failed":
            self.outcomes[report.nodeid] = "skipped"

    def _add_outside(self, phases: dict[str, float], examples: int) -> None:
        for phase, seconds in phases.items():
            self.outside[phase] = self.outside.get(phase, 0.0) + seconds
        self.examples_outside += examples

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._add_outside(*self._take())
        import fa2_verify

        session_seconds = time.perf_counter() - self.started
        self._write({
            "test": OUTSIDE, "worker": self.worker, "seconds": session_seconds - self.in_tests,
            "phases": self.outside, "examples": self.examples_outside, "outcome": "",
            "session_seconds": session_seconds, "package": os.path.dirname(fa2_verify.__file__),
            "missing": self.missing,
        })  # fmt: skip


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    directory = config.getoption("suite_time_dir")
    if directory is None:
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None and config.getoption("numprocesses", None):
        return  # the xdist controller runs no test
    worker = workerinput["workerid"] if workerinput is not None else "main"
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config.pluginmanager.register(SuitePhases(path, worker), "suite-phases")
