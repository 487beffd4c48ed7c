"""The pytest plugin of the property suite (entry point ``pytest11: fa2_verify``): its options and hooks.

``pytest --pyargs fa2_verify.properties --fa2-kernel=NAME|module:attr [--fa2-device=cpu|cuda] [--fa2-profile=dev|ci|nightly|scale]``
runs every property test against one kernel target.  This module only declares
the options (one group, ``fa2-verify``) and wires each hook to the module that
does the work: :mod:`properties.options` (read and checked),
:mod:`properties.device_pinning` (each xdist worker's device and threads),
:mod:`properties.gpu_shares` (``-n auto`` on GPUs, and the workers' shares of a GPU's memory),
:mod:`properties.inflight_session` (the case each process runs, kept on disk),
:mod:`properties.collection` (one test per property and dtype),
:mod:`properties.ordering` (xdist order and ``--fa2-shard``),
:mod:`properties.runtest` (unsupported skips, time shares),
:mod:`properties.allure_results` and :mod:`properties.summary` (the terminal
summary and the exit status).  Workers share the golden cache:
``FA2_VERIFY_GOLDEN_CACHE`` if set, else ``<rootdir>/.fa2-golden-cache``.
Run by ``fa2-verify suite``, the session writes the file named by
:data:`FINISHED` as it ends, so a pytest that exits 0 without it (a kernel
ended the process some other way) fails the command.

Importing this module is cheap: it is loaded into every pytest run, so torch,
Hypothesis and the kernels are imported only when a property test needs them.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest

from fa2_verify.properties import allure_results, collection, inflight_session, ordering, profiles, runtest, schedule
from fa2_verify.properties.device_pinning import worker_device, worker_share
from fa2_verify.properties.options import DEFAULT_DEVICE, EXAMPLES_DIR, configure, configured, of
from fa2_verify.properties.options import usage as _usage
from fa2_verify.properties.summary import Summary
from fa2_verify.verify.watchdog import DEFAULT_CALL_TIMEOUT

#: The environment variable ``fa2-verify suite`` sets to a file the session writes as it ends (not on an xdist
#: worker): a pytest that exits 0 without writing it died on the way.
FINISHED = "FA2_VERIFY_SESSION_FINISHED"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fa2-verify", "fa2-verify property suite")
    group.addoption("--fa2-kernel", default=None, metavar="NAME",
                    help="kernel under test: a bundled name (reference, torch-flash, triton, flash-attn) or "
                    "module:attr (required to run the property tests)")
    group.addoption("--fa2-device", default=None, metavar="DEVICE",
                    help=f"device to run the kernel on: cpu, cuda or cuda:N (default {DEFAULT_DEVICE}); "
                    "with -n and cuda, worker gwI runs on cuda:I")
    group.addoption("--fa2-profile", default=None, metavar="NAME",
                    help=f"property-suite profile: {', '.join(profiles.PROFILES)} (default dev)")
    group.addoption("--fa2-dtypes", default=None, metavar="LIST",
                    help="comma-separated dtypes to draw (default: every dtype the kernel supports on the device)")
    group.addoption("--fa2-bounds-check", action="store_true", default=False,
                    help="with TRITON_INTERPRET=1: fail any example whose Triton kernel touches memory outside its "
                    "tensor arguments (a load past a tensor that faults a GPU only where the page is unmapped)")
    group.addoption("--fa2-durations", default=None, metavar="FILE",
                    help="property-test durations recorded elsewhere, for the tests pytest's cache has not recorded: "
                    f"a copy of <cache>/v/{schedule.CACHE_KEY} (e.g. kept in the repository for fresh CI runners); "
                    "--dist worksteal orders the tests on them")
    group.addoption("--fa2-shard", default=None, metavar="I/N",
                    help="run shard I of N balanced groups of the property tests (on the --fa2-durations records), "
                    "the same groups on every runner, so N runners with 1/N .. N/N run every test once")
    group.addoption("--fa2-max-golden-seconds", default=None, metavar="S",
                    help="decline, as unsupported, a drawn case whose golden and comparison are estimated to take "
                    "longer (default 600; the size guard, fa2_verify.verify.memory.require_fits)")
    group.addoption("--fa2-call-timeout", default=None, metavar="S",
                    help="end the test process, naming the call and its case, when one kernel call runs longer, as a "
                    f"hung GPU kernel does (default {DEFAULT_CALL_TIMEOUT:g}; fa2_verify.verify.watchdog)")
    group.addoption("--fa2-time-budget", default=None, metavar="SECONDS",
                    help="wall time of the run: each property test stops generating once its share is spent "
                    "(SECONDS x workers / tests; fa2_verify.properties.pacing), reporting the examples it ran")
    group.addoption("--fa2-shape-classes", default=None, metavar="N",
                    help="draw at most N shape classes (dtype, head dim, mask kind, sequence lengths rounded up to a "
                    "power of two) per property test and process, for kernels that compile per shape "
                    "(fa2_verify.properties.shape_classes)")
    group.addoption("--fa2-failures", default=None, metavar="FILE",
                    help="append each failure to FILE as it happens, one JSON line (default failures.jsonl in the "
                    "examples directory, if it exists)")
    group.addoption("--fa2-examples-dir", default=None, metavar="DIR",
                    help=f"Hypothesis example database of the dev and nightly profiles (default <rootdir>/"
                    f"{EXAMPLES_DIR}); keep it as a CI artifact to replay earlier failures")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", collection.MARKER_HELP)
    options = configure(config, _validate_target)
    inflight_session.open_inflight(config)
    config.pluginmanager.register(Summary(property_run=options["kernel"] is not None), "fa2-verify-summary")
    ordering.register(config, options)


@pytest.fixture(scope="session")
def fa2_suite(request: pytest.FixtureRequest):
    """The :class:`properties.session.Suite` of this run: kernel, device, profile, golden options (every
    property test takes it, :func:`properties.harness.build_test`)."""
    from fa2_verify.properties.session import build_suite

    return build_suite(request.config)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object):
    return collection.property_tests(collector, name, obj)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ordering.order_collection(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    result = yield
    runtest.skip_unsupported(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from runtest.around_call(item))


def pytest_sessionfinish(session: pytest.Session) -> None:
    allure_results.describe_run(session)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session is over: write the file :data:`FINISHED` names, if set (not on an xdist worker)."""
    finished = os.environ.get(FINISHED)
    if finished and not hasattr(config, "workerinput"):
        pathlib.Path(finished).write_text("finished\n")


def pytest_report_header(config: pytest.Config) -> str | None:
    """The workers' shares of a GPU's memory, when they keep to some (:mod:`properties.gpu_shares`)."""
    return of(config)["gpu_shares"] if configured(config) else None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """pytest-xdist's ``-n auto`` for a property run on CUDA: the workers its GPUs take
    (:func:`properties.gpu_shares.auto_workers`); None leaves xdist's own count."""
    from fa2_verify.properties.gpu_shares import auto_workers

    return auto_workers(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist, on the controller: what each worker gets from it (in-flight directory, recorded durations)."""
    inflight_session.to_worker(node)
    ordering.to_worker(node)


def _validate_target(
    kernel_name: str, device: str, dtypes: tuple[str, ...] | None, workerinput: dict[str, Any] | None, *, pin: bool
) -> str:
    """Load the kernel, call its hooks and check the device now, so a typo or a hook that raises fails before
    any test (a usage error naming the flag, never an INTERNALERROR); return the worker's device.

    ``pin``: make the device current in this process (a process that runs tests).
    """
    import torch

    from fa2_verify.core.errors import Fa2VerifyError
    from fa2_verify.app.targets import load_target
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

