"""The pytest plugin of the property suite (entry point ``pytest11: fa2_verify``).

``pytest --pyargs fa2_verify.properties --fa2-kernel=NAME|module:attr [--fa2-device=cpu|cuda] [--fa2-profile=dev|ci|nightly|scale]``
runs every property test against one kernel target (``--fa2-dtypes`` limits
the dtypes drawn, ``--fa2-examples-dir`` moves the example database).

* Options live in one group, ``fa2-verify``; a bad value (an empty one
  included) is a ``pytest.UsageError`` naming the flag.  They are checked
  (and the kernel loaded) at startup only when given, so other test suites
  pay nothing.  ``--fa2-kernel`` has no default: without it a property test
  is a collection error naming the flag, never a pass on a kernel nobody
  named, and ``--fa2-device``/``--fa2-dtypes`` without it are usage errors.
* Everything the plugin adds to a pytest run is prefixed (``--fa2-*``
  options, the ``fa2_property`` marker, the ``fa2_suite`` fixture): it loads
  into every pytest run of the environment, and must not shadow a name of
  another test suite.
* With pytest-xdist on CUDA, worker ``gwI`` runs on ``cuda:(I mod GPUs)``
  (:func:`worker_device`): ``-n <number of GPUs>`` gives each worker its own
  GPU, and a multiple of it several workers per GPU.
* Each xdist worker takes an equal share of the CPU threads
  (:func:`worker_threads`) unless ``OMP_NUM_THREADS`` is set.
* Each run records its property tests' durations in pytest's cache, and
  under ``--dist worksteal`` the workers order the tests on the durations
  recorded before, so that no worker holds two long ones
  (:mod:`properties.schedule`); without them, dtype-major.  ``--fa2-shard I/N``
  first keeps the I-th of N balanced groups (:mod:`properties.runner_shards`),
  and under ``--alluredir`` the run is described in its results for
  ``fa2-verify report`` to merge the shards (:mod:`verify.allure_merge`).
* Workers share the golden cache: ``FA2_VERIFY_GOLDEN_CACHE`` if set, else
  ``<rootdir>/.fa2-golden-cache``.
* A property needing a capability the kernel lacks (or a kernel that cannot
  run here) is skipped with the reason and counted as unsupported; the
  terminal summary lists those counts, how many examples were checked per
  second, and the worst case found per property.  A run in which every
  property test was skipped so verified nothing: it exits 5, not 0.
* A kernel that kills its process still names the case: each process keeps
  the case of the example it runs in an in-flight file (:mod:`properties.inflight`)
  in one directory per session, which xdist workers get from the controller
  (:func:`pytest_configure_node`).  A file left when the session ends is
  reported in the terminal summary ("the process ... died while running ...")
  and fails the run; without xdist a watcher process prints it after pytest died.
  A kernel's ``os._exit`` fails its example instead (:mod:`verify.user_code`).
  Run by ``fa2-verify suite``, the session writes the file named by
  :data:`FINISHED` as it ends, so a pytest that exits 0 without it (a kernel
  ended the process some other way) fails the command.

* A kernel error at a declared shape is reported once, by the first test
  that meets it, and later tests leave its ``(head_dim, dtype)`` alone
  (:mod:`properties.kernel_errors`); ``--fa2-time-budget`` ends each test
  once its share of the run's time is spent, the summary counts each
  property's examples, and ``--fa2-failures`` gets each failure as it
  happens (:mod:`properties.pacing`, :mod:`properties.failure_log`);
  ``--fa2-shape-classes N`` bounds the shape classes each test draws, for a
  kernel that compiles per shape (:mod:`properties.shape_classes`).

Importing this module is cheap: it is loaded into every pytest run, so torch,
Hypothesis and the kernels are imported only when a property test needs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
from typing import Any

import pytest

from fa2_verify.core.runner_shard import WHOLE_RUN, RunnerShard
from fa2_verify.properties import profiles, runner_shards, schedule
from fa2_verify.properties.declaration import MARKER, Property
from fa2_verify.properties.inflight import InFlight, Record, left_behind, session_directory
from fa2_verify.verify.watchdog import DEFAULT_CALL_TIMEOUT, set_call_timeout

EXAMPLES_DIR = ".fa2-examples"
DEFAULT_DEVICE = "cpu"
#: The property tests run only on a kernel named on the command line: never on a default the user did not ask for.
KERNEL_REQUIRED = "--fa2-kernel=NAME|module:attr, the kernel under test (e.g. --fa2-kernel=reference)"
THREADS_ENV = "OMP_NUM_THREADS"
#: The key of the session's in-flight directory in an xdist worker's ``workerinput``.
INFLIGHT_DIR = "fa2_inflight_dir"
#: The environment variable ``fa2-verify suite`` sets to a file the session writes as it ends (not on an xdist
#: worker): a pytest that exits 0 without writing it died on the way.
FINISHED = "FA2_VERIFY_SESSION_FINISHED"
#: The key of the recorded test durations in an xdist worker's ``workerinput`` (:mod:`properties.schedule`).
DURATIONS = "fa2_durations"

_UNSUPPORTED = "fa2_unsupported"
_OBSERVED = "fa2_observed"
_DURATION_LOG = "fa2-verify-durations"
_options_key = pytest.StashKey["dict[str, Any]"]()
_inflight_key = pytest.StashKey[InFlight]()
_dtypes_key = pytest.StashKey["tuple[str, ...]"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fa2-verify", "fa2-verify property suite")
    group.addoption(
        "--fa2-kernel",
        default=None,
        metavar="NAME",
        help="kernel under test: a bundled name (reference, torch-flash, triton, flash-attn) or module:attr "
        "(required to run the property tests)",
    )
    group.addoption(
        "--fa2-device",
        default=None,
        metavar="DEVICE",
        help=f"device to run the kernel on: cpu, cuda or cuda:N (default {DEFAULT_DEVICE}); "
        "with -n and cuda, worker gwI runs on cuda:I",
    )
    group.addoption(
        "--fa2-profile",
        default=None,
        metavar="NAME",
        help=f"property-suite profile: {', '.join(profiles.PROFILES)} (default dev)",
    )
    group.addoption(
        "--fa2-dtypes",
        default=None,
        metavar="LIST",
        help="comma-separated dtypes to draw (default: every dtype the kernel supports on the device)",
    )
    group.addoption(
        "--fa2-bounds-check",
        action="store_true",
        default=False,
        help="with TRITON_INTERPRET=1: fail any example whose Triton kernel touches memory outside its tensor "
        "arguments (a load past a tensor that faults a GPU only where the page is unmapped)",
    )
    group.addoption(
        "--fa2-durations",
        default=None,
        metavar="FILE",
        help="property-test durations recorded elsewhere, for the tests pytest's cache has not recorded: a copy "
        f"of <cache>/v/{schedule.CACHE_KEY} (e.g. kept in the repository for fresh CI runners); "
        "--dist worksteal orders the tests on them",
    )
    group.addoption(
        "--fa2-shard",
        default=None,
        metavar="I/N",
        help="run shard I of N balanced groups of the property tests (on the --fa2-durations records), the same "
        "groups on every runner, so N runners with 1/N .. N/N run every test once",
    )
    group.addoption(
        "--fa2-max-golden-seconds",
        default=None,
        metavar="S",
        help="decline, as unsupported, a drawn case whose golden and comparison are estimated to take longer "
        "(default 600; the size guard, fa2_verify.verify.memory.require_fits)",
    )
    group.addoption(
        "--fa2-call-timeout",
        default=None,
        metavar="S",
        help="end the test process, naming the call and its case, when one kernel call runs longer, as a hung "
        f"GPU kernel does (default {DEFAULT_CALL_TIMEOUT:g}; fa2_verify.verify.watchdog)",
    )
    group.addoption(
        "--fa2-time-budget",
        default=None,
        metavar="SECONDS",
        help="wall time of the run: each property test stops generating once its share is spent "
        "(SECONDS x workers / tests; fa2_verify.properties.pacing), reporting the examples it ran",
    )
    group.addoption(
        "--fa2-shape-classes",
        default=None,
        metavar="N",
        help="draw at most N shape classes (dtype, head dim, mask kind, sequence lengths rounded up to a power "
        "of two) per property test and process, for kernels that compile per shape "
        "(fa2_verify.properties.shape_classes)",
    )
    group.addoption(
        "--fa2-failures",
        default=None,
        metavar="FILE",
        help="append each failure to FILE as it happens, one JSON line (default failures.jsonl in the examples "
        "directory, if it exists)",
    )
    group.addoption(
        "--fa2-examples-dir",
        default=None,
        metavar="DIR",
        help=f"Hypothesis example database of the dev and nightly profiles (default <rootdir>/{EXAMPLES_DIR}); "
        "keep it as a CI artifact to replay earlier failures",
    )


def worker_device(device: str, worker_id: str | None, device_count: int) -> str:
    """The device a pytest-xdist worker uses: ``cuda`` on worker ``gwI`` of a multi-GPU host is ``cuda:I``.

    An explicit index (``cuda:1``), the CPU, the controller (``worker_id`` None)
    and single-GPU hosts keep ``device`` as given.
    """
    if device != "cuda" or worker_id is None or device_count < 2:
        return device
    return f"cuda:{int(worker_id.removeprefix('gw')) % device_count}"


def worker_threads(cpu_count: int, worker_count: int) -> int:
    """CPU threads for one of ``worker_count`` xdist workers: an equal share of the cores, at least 1.

    Each worker runs the golden on the CPU; with PyTorch's default (every core
    per process) the workers would oversubscribe the machine.  Setting
    ``OMP_NUM_THREADS`` overrides this.
    """
    return max(1, cpu_count // max(1, worker_count))


def worker_share(workerinput: dict[str, Any] | None) -> int | None:
    """:func:`worker_threads` for this xdist worker; ``None`` outside a worker or when ``OMP_NUM_THREADS`` is set."""
    if workerinput is None or THREADS_ENV in os.environ:
        return None
    return worker_threads(os.cpu_count() or 1, int(workerinput.get("workercount", 1)))


def _usage(flag: str, value: object, problem: str) -> pytest.UsageError:
    return pytest.UsageError(f"{flag}={value}: {problem}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(requires=()): a property test of fa2-verify, skipped as unsupported when the kernel lacks "
        "a required capability",
    )
    profile_name = config.getoption("fa2_profile")
    profile_name = "dev" if profile_name is None else profile_name
    if profile_name not in profiles.PROFILES:
        raise _usage("--fa2-profile", profile_name, f"not a profile: use one of {', '.join(profiles.PROFILES)}")
    examples = config.getoption("fa2_examples_dir")
    if examples == "":
        raise _usage("--fa2-examples-dir", examples, "names no directory: pass a directory, or leave the option out")
    database_dir = pathlib.Path(examples) if examples is not None else config.rootpath / EXAMPLES_DIR
    kernel_name = config.getoption("fa2_kernel")
    device_option = config.getoption("fa2_device")
    dtypes_option = config.getoption("fa2_dtypes")
    dtypes = tuple(name for name in dtypes_option.split(",") if name) if dtypes_option is not None else None
    device = DEFAULT_DEVICE if device_option is None else device_option
    bounds_check = config.getoption("fa2_bounds_check")
    durations = config.getoption("fa2_durations")
    max_golden_seconds = _seconds_option("--fa2-max-golden-seconds", config.getoption("fa2_max_golden_seconds"))
    call_timeout = _seconds_option("--fa2-call-timeout", config.getoption("fa2_call_timeout"))
    time_budget = _seconds_option("--fa2-time-budget", config.getoption("fa2_time_budget"))
    failures = config.getoption("fa2_failures")
    shape_classes = _count_option("--fa2-shape-classes", config.getoption("fa2_shape_classes"))
    shard = _shard_option(config.getoption("fa2_shard"))
    if kernel_name is None:
        alone = next(
            (flag for flag, value in (("--fa2-device", device_option), ("--fa2-dtypes", dtypes_option),
                                      ("--fa2-bounds-check", bounds_check or None),
                                      ("--fa2-durations", durations),
                                      ("--fa2-max-golden-seconds", max_golden_seconds),
                                      ("--fa2-call-timeout", call_timeout),
                                      ("--fa2-time-budget", time_budget), ("--fa2-failures", failures),
                                      ("--fa2-shape-classes", shape_classes),
                                      ("--fa2-shard", shard))
             if value is not None),
            None,
        )
        if alone is not None:
            raise pytest.UsageError(f"{alone} needs {KERNEL_REQUIRED}")
    else:
        workerinput = getattr(config, "workerinput", None)
        runs_tests = workerinput is not None or not config.getoption("numprocesses", None)
        device = _validate_target(kernel_name, device, dtypes, workerinput, pin=runs_tests)
        if bounds_check:
            _check_bounds(config, enter=runs_tests)
        if call_timeout is not None:
            set_call_timeout(call_timeout)
    run_device = DEFAULT_DEVICE if device_option is None else device_option
    config.stash[_options_key] = {
        "kernel": kernel_name,
        "device": device,
        "run_device": run_device,
        "shard": shard,
        "profile": profile_name,
        "dtypes": dtypes,
        "database_dir": database_dir,
        "max_golden_seconds": max_golden_seconds,
        "time_budget": time_budget,
        "shape_classes": shape_classes,
        "failures": _failures_option(failures, database_dir) if kernel_name is not None else None,
    }
    config.stash[_inflight_key] = _inflight(config)
    config.pluginmanager.register(Summary(property_run=kernel_name is not None), "fa2-verify-summary")
    cache = getattr(config, "cache", None)
    if cache is None and durations is not None:
        raise pytest.UsageError("--fa2-durations needs pytest's cache: drop -p no:cacheprovider")
    key = schedule.run_key(kernel_name or "", run_device, profile_name)
    if shard is not None:
        runs = _durations_runs(durations) if durations is not None else {}
        config.pluginmanager.register(runner_shards.ShardSelection(shard, runs, key, _order), "fa2-verify-shard")
    if kernel_name is not None and cache is not None and not hasattr(config, "workerinput"):
        known = _durations_option(durations, key)
        config.pluginmanager.register(schedule.DurationLog(cache, key, (_OBSERVED, _UNSUPPORTED), known),
                                      _DURATION_LOG)


def _seconds_option(flag: str, text: str | None) -> float | None:
    """``--fa2-max-golden-seconds``, ``--fa2-call-timeout``, ``--fa2-time-budget``: a finite number of seconds
    > 0 (``None`` without the option)."""
    if text is None:
        return None
    from argparse import ArgumentTypeError

    from fa2_verify.verify.golden_time import positive_seconds

    try:
        return positive_seconds(text)
    except ArgumentTypeError as exc:
        raise _usage(flag, text, str(exc)) from None


def _count_option(flag: str, text: str | None) -> int | None:
    """``--fa2-shape-classes``: a whole number >= 1 (``None`` without the option)."""
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise _usage(flag, text, "is not a whole number >= 1")
    return int(text)


def _failures_option(option: str | None, examples_dir: pathlib.Path) -> pathlib.Path | None:
    """``--fa2-failures``: the failure log (:func:`properties.failure_log.failures_path`)."""
    from fa2_verify.properties.failure_log import failures_path

    try:
        return failures_path(option, examples_dir)
    except ValueError as exc:
        raise _usage("--fa2-failures", option, str(exc)) from None


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under ``--alluredir``, describe a property run in its Allure results (not on an xdist worker): kernel,
    device, profile, dtypes and runner shard, what ``fa2-verify report`` checks before merging the results
    of several shards (:mod:`verify.allure_merge`)."""
    config = session.config
    alluredir = config.getoption("allure_report_dir", None)
    options = config.stash.get(_options_key, None)
    if not alluredir or options is None or options["kernel"] is None or hasattr(config, "workerinput"):
        return
    from fa2_verify.verify.allure_merge import write_run

    dtypes = options["dtypes"]
    write_run(pathlib.Path(alluredir), {
        "kernel": options["kernel"], "device": options["run_device"], "profile": options["profile"],
        "dtypes": ",".join(dtypes) if dtypes is not None else "all the kernel runs",
        "shard": str(options["shard"] or WHOLE_RUN),
    })


def _shard_option(text: str | None) -> RunnerShard | None:
    """``--fa2-shard``: shard I of N (``None`` without the option)."""
    if text is None:
        return None
    try:
        return RunnerShard.parse(text)
    except ValueError as exc:
        raise _usage("--fa2-shard", text, str(exc)) from None


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session is over: write the file :data:`FINISHED` names, if set (not on an xdist worker)."""
    finished = os.environ.get(FINISHED)
    if finished and not hasattr(config, "workerinput"):
        pathlib.Path(finished).write_text("finished\n")


def _durations_option(path: str | None, key: str) -> dict[str, list[float]]:
    """``--fa2-durations``: the durations the file holds for runs of ``key`` (none without the option)."""
    return {} if path is None else _durations_runs(path).get(key, {})


def _durations_runs(path: str) -> dict[str, dict[str, list[float]]]:
    """``--fa2-durations``: every kind of run's records in the file (:func:`schedule.file_runs`)."""
    try:
        return schedule.file_runs(path)
    except ValueError as exc:
        raise _usage("--fa2-durations", path, str(exc)) from None


def _check_bounds(config: pytest.Config, *, enter: bool) -> None:
    """``--fa2-bounds-check``: every Triton kernel the interpreter runs in this process is bounds-checked
    until the session ends (:func:`verify.interpreter_bounds.bounds_checked`); an access outside the
    kernel's tensors raises in the kernel call, which fails the example with its reproduction."""
    from fa2_verify.core.errors import UsageError
    from fa2_verify.verify.interpreter_bounds import bounds_checked, require_interpreter

    checked = contextlib.ExitStack()
    try:
        require_interpreter("--fa2-bounds-check")
        if enter:
            checked.enter_context(bounds_checked())
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.add_cleanup(checked.close)


def _inflight(config: pytest.Config) -> InFlight:
    """This process's in-flight file: a worker's in its controller's directory, else in a fresh one.

    A process that runs tests without xdist is the one that would die, so its
    first record starts the watcher (:func:`properties.inflight.watch`), with
    pytest's output capture suspended so that it writes to the terminal.
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return InFlight(pathlib.Path(workerinput[INFLIGHT_DIR]), workerinput["workerid"])
    if config.getoption("numprocesses", None):
        return InFlight(session_directory(), "main")
    capture = config.pluginmanager.get_plugin("capturemanager")
    uncaptured = capture.global_and_fixture_disabled if capture is not None else contextlib.nullcontext
    return InFlight(session_directory(), "main", watch_within=uncaptured)


def inflight_of(config: pytest.Config) -> InFlight:
    """The in-flight file of the process running ``config``'s session (:mod:`properties.inflight`)."""
    return config.stash[_inflight_key]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist, on the controller: the worker keeps its in-flight file in the controller's directory."""
    node.workerinput[INFLIGHT_DIR] = str(inflight_of(node.config).directory)
    log = node.config.pluginmanager.get_plugin(_DURATION_LOG)
    if log is not None and node.config.getoption("dist", None) == "worksteal":
        node.workerinput[DURATIONS] = log.recorded


def _validate_target(
    kernel_name: str, device: str, dtypes: tuple[str, ...] | None, workerinput: dict[str, Any] | None, *, pin: bool
) -> str:
    """Load the kernel (:func:`app.targets.load_target`: once in the process), call its hooks and check the
    device now, so a typo or a hook that raises fails before any test (a usage error naming the flag, never an
    INTERNALERROR); return the worker's device.

    ``pin``: make the device current in this process (a process that runs tests).
    """
    import torch

    from fa2_verify.app.targets import load_target
    from fa2_verify.core.errors import Fa2VerifyError
    from fa2_verify.verify.registry import require_device

    try:
        torch.device(device)
    except RuntimeError:
        raise _usage("--fa2-device", device, "not a device: use cpu, cuda or cuda:N") from None
    try:
        require_device(device)
    except Fa2VerifyError as exc:
        raise _usage("--fa2-device", device, str(exc).removeprefix(f"--device={device}: ")) from None
    try:
        kernel = load_target(kernel_name)
        kernel.unavailable_reason(device)
        kernel.config()
        supported = kernel.capabilities.dtypes.get(torch.device(device).type, ())
    except Fa2VerifyError as exc:
        raise _usage("--fa2-kernel", kernel_name, str(exc)) from None
    if dtypes is not None:
        unknown = [name for name in dtypes if name not in supported]
        if unknown or not dtypes:
            raise _usage(
                "--fa2-dtypes", ",".join(dtypes), f"use names from {','.join(supported)} ({kernel_name} on {device})"
            )
    if device.startswith("cuda"):
        device = worker_device(device, (workerinput or {}).get("workerid"), torch.cuda.device_count())
        if pin and torch.device(device).index is not None:
            torch.cuda.set_device(torch.device(device))
    threads = worker_share(workerinput)
    if threads is not None:
        torch.set_num_threads(threads)
    return device


@pytest.fixture(scope="session")
def fa2_suite(request: pytest.FixtureRequest):
    """The :class:`properties.session.Suite` of this run: kernel, device, profile, golden options (every
    property test takes it, :func:`properties.harness.build_test`)."""
    from fa2_verify.golden.options import GoldenOptions, shared_cache_dir
    from fa2_verify.properties.failure_log import FailureLog
    from fa2_verify.properties.kernel_errors import SHARED_FILE, KernelErrors
    from fa2_verify.properties.session import Suite
    from fa2_verify.properties.shape_classes import ShapeClasses
    from fa2_verify.app.targets import load_target
    from fa2_verify.core.errors import Fa2VerifyError

    options = request.config.stash[_options_key]
    try:
        kernel = load_target(options["kernel"])
    except Fa2VerifyError as exc:
        raise _usage("--fa2-kernel", options["kernel"], str(exc)) from None
    return Suite(
        kernel=kernel,
        device=options["device"],
        profile=profiles.get(options["profile"]),
        golden_options=GoldenOptions(cache_dir=shared_cache_dir(request.config.rootpath)),
        dtypes=options["dtypes"],
        inflight=inflight_of(request.config),
        max_golden_seconds=options["max_golden_seconds"],
        kernel_errors=KernelErrors(inflight_of(request.config).directory / SHARED_FILE),
        failure_log=FailureLog(options["failures"], kernel.name, options["device"]) if options["failures"] else None,
        shape_classes=ShapeClasses(options["shape_classes"]) if options["shape_classes"] else None,
    )


def _shard_dtypes(config: pytest.Config) -> tuple[str, ...]:
    """The dtypes the run draws, one test per dtype (:func:`properties.harness.shards`); none where the
    kernel cannot run here or has no dtype on the device (its single test is then skipped with the reason)
    or does not load (the ``suite`` fixture then raises the usage error naming ``--fa2-kernel``)."""
    from fa2_verify.core.errors import Fa2VerifyError
    from fa2_verify.app.targets import load_target
    from fa2_verify.properties.inputs import drawn_dtypes

    options = config.stash[_options_key]
    try:
        kernel = load_target(options["kernel"])
        if kernel.unavailable_reason(options["device"]) is not None:
            return ()
        return drawn_dtypes(capabilities=kernel.capabilities, device=options["device"], include=options["dtypes"])
    except Fa2VerifyError:
        return ()


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object):
    """A declared property (:class:`~properties.declaration.Property`) becomes one test per dtype drawn
    (``test_<property>[<dtype>]``) under the session's profile, sharing the profile's examples."""
    if not isinstance(obj, Property):
        return None
    from fa2_verify.properties.harness import build_test, shards

    options = collector.config.stash[_options_key]
    if options["kernel"] is None:
        raise collector.CollectError(f"the property suite needs {KERNEL_REQUIRED}")
    if _dtypes_key not in collector.config.stash:
        collector.config.stash[_dtypes_key] = _shard_dtypes(collector.config)
    profile = profiles.get(options["profile"])
    test_settings = profiles.settings_for(profile, database_dir=options["database_dir"])
    run_seed = collector.config.getoption("hypothesis_seed", None)
    return [
        pytest.Function.from_parent(collector, name=shard.test_name(name), callobj=build_test(obj, test_settings, shard))
        for shard in shards(obj, profile, collector.config.stash[_dtypes_key], run_seed)
    ]


def _is_property(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the collection (:func:`_order`); under ``--fa2-shard`` the shard's selection orders what it keeps
    (:class:`properties.runner_shards.ShardSelection`, which runs after ``-k``)."""
    if config.pluginmanager.get_plugin("fa2-verify-shard") is None:
        _order(config, items)


def _order(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the property tests for pytest-xdist's ``worksteal`` (:mod:`properties.schedule`): on a worker
    whose controller passed the durations of earlier runs, and when every test collected is a property test,
    balanced on them (:func:`schedule.balanced`); otherwise dtype-major, any other test keeping its place.
    The order is a function of the collection and of what the controller passed, as xdist requires it to be
    the same on every worker."""
    if _dtypes_key not in config.stash:
        return
    slots = [index for index, item in enumerate(items) if _is_property(item)]
    shards = [items[index] for index in slots]
    workerinput = getattr(config, "workerinput", None)
    recorded = workerinput.get(DURATIONS) if workerinput is not None else None
    estimates = None
    if recorded and len(shards) == len(items):
        estimates = schedule.estimates_for([schedule.name_in_records(item.nodeid) for item in items], recorded)
    if estimates is not None:
        order = schedule.balanced(estimates, workerinput["workercount"])
    else:
        order = schedule.dtype_major([shard.obj.fa2_dtype for shard in shards], config.stash[_dtypes_key])
    for index, position in zip(slots, order):
        items[index] = shards[position]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    result = yield
    if _is_property(item):
        from fa2_verify.properties.harness import missing_requirement

        reason = missing_requirement(item.obj.fa2_property, item.funcargs["fa2_suite"])
        if reason is not None:
            item.user_properties.append((_UNSUPPORTED, reason))
            pytest.skip(f"unsupported: {reason}")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if not _is_property(item):
        return (yield)
    from fa2_verify.properties.pacing import ShareSpent, time_share

    suite = item.funcargs["fa2_suite"]
    budget = item.config.stash[_options_key]["time_budget"]
    workers = getattr(item.config, "workerinput", {}).get("workercount", 1)
    tests = sum(map(_is_property, item.session.items))
    suite.start_test(item.name, item.obj.fa2_dtype, time_share(budget, tests, workers) if budget else None)
    try:
        return (yield)
    except ShareSpent:
        return None
    finally:
        item.user_properties.append((_OBSERVED, json.dumps(suite.end_test())))
        results = suite.take_results()
        if item.config.getoption("allure_report_dir", None):
            from fa2_verify.verify import allure_report

            allure_report.record_property_test(item.name, results, kernel=suite.kernel.name, device=suite.device)


class Summary:
    """Counts and worst cases gathered from test reports (on the xdist controller, from every worker),
    the processes that died in the kernel (their in-flight records, :mod:`properties.inflight`), and, in a
    ``property_run`` (``--fa2-kernel`` given), the xdist workers that went down before the session ended."""

    def __init__(self, *, property_run: bool = False) -> None:
        self.property_run = property_run
        self.died: list[Record] = []
        self.workers_down: list[str] = []
        self.unsupported: dict[str, set[str]] = {}
        self.declined: dict[str, int] = {}
        self.examples = 0
        self.seconds = 0.0
        self.worst: dict[tuple[str, str], dict[str, Any]] = {}
        self.verified = 0
        self.nothing_verified = False
        self.counts: Any = None
        self.kernel_errors: Any = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        prop = report.nodeid.split("::")[-1].split("[")[0]
        for key, value in report.user_properties:
            if key == _UNSUPPORTED and report.when == "setup":
                self.unsupported.setdefault(value, set()).add(prop)
            elif key == _OBSERVED and report.when == "call":
                self.verified += report.passed
                self.seconds += report.duration
                observed = json.loads(value)
                records = observed["worst"]
                self.examples += max((record["examples"] for record in records), default=0)
                for reason, count in observed["unsupported"].items():
                    self.declined[reason] = self.declined.get(reason, 0) + count
                for record in records:
                    self._merge((prop, record["label"]), record)
                self._add_counts(report.nodeid.split("::")[-1], observed)

    def _add_counts(self, test: str, observed: dict[str, Any]) -> None:
        """The test's examples (:class:`properties.pacing.Counts`) and kernel errors
        (:class:`properties.kernel_errors.Summary`)."""
        from fa2_verify.properties.kernel_errors import Summary as KernelErrorSummary
        from fa2_verify.properties.pacing import Counts

        if self.counts is None:
            self.counts, self.kernel_errors = Counts(), KernelErrorSummary()
        self.counts.add(test, observed["pacing"])
        if "kernel_errors" in observed:
            self.kernel_errors.add(observed["kernel_errors"])

    def _merge(self, key: tuple[str, str], record: dict[str, Any]) -> None:
        """Keep the worst record of a property's label over its dtype shards, counting every shard's examples."""
        current = self.worst.get(key)
        if current is None:
            self.worst[key] = dict(record)
            return
        examples = current["examples"] + record["examples"]
        if float(record["score"]) > float(current["score"]):
            current = self.worst[key] = dict(record)
        current["examples"] = examples

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """pytest-xdist, on the controller: a worker ended without finishing (``error``, e.g. "Not properly
        terminated" for one that exited, with status 0 too) fails a property run, even between two tests."""
        if error is not None and self.property_run:
            self.workers_down.append(f"worker {node.gateway.id} went down before the session ended ({error})")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Collect the records left behind (not on an xdist worker: its controller does) and fail the run if any,
        or if a worker went down;
        a run whose property tests were all skipped as unsupported verified nothing, and does not exit 0 either
        (status 5, pytest's "nothing collected"), as ``fa2-verify run`` exits 2 when no case is supported."""
        if hasattr(session.config, "workerinput"):
            return
        inflight = inflight_of(session.config)
        self.died = left_behind(inflight.directory)
        inflight.close()
        if (self.died or self.workers_down) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.unsupported and not self.verified and session.exitstatus == pytest.ExitCode.OK:
            self.nothing_verified = True
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED

    def lines(self) -> list[str]:
        lines = [record.message() for record in self.died]
        lines += [f"{down}: what it ran after its last report was not verified" for down in self.workers_down]
        if self.nothing_verified:
            lines.append("nothing was verified: every property test was skipped as unsupported (exit status 5)")
        if self.examples:
            rate = self.examples / self.seconds if self.seconds else float("inf")
            lines.append(
                f"{self.examples} examples checked in {self.seconds:.1f} s of test time ({rate:.2f} examples/s per worker)"
            )
        if self.counts is not None:
            lines += self.kernel_errors.lines() + self.counts.lines()
        for reason, properties in sorted(self.unsupported.items()):
            lines.append(f"unsupported: {len(properties)} propert{'y' if len(properties) == 1 else 'ies'}: {reason}")
        for reason, count in sorted(self.declined.items()):
            lines.append(f"unsupported: {count} example(s) declined by the kernel: {reason}")
        for (test, label), record in sorted(self.worst.items()):
            lines.append(f"worst {label} in {test}: {float(record['score']):.3g} over {record['examples']} examples")
            lines.append(f"    {record['reproduction']}")
        return lines

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = self.lines()
        if lines:
            terminalreporter.section("fa2-verify property suite")
            for line in lines:
                terminalreporter.write_line(line)
