"""The property suite's ``--fa2-*`` options, read and checked at startup and kept for the session.

Options are checked (and the kernel loaded) only when given, so other test
suites pay nothing.  ``--fa2-kernel`` has no default: without it a property
test is a collection error naming the flag (:data:`KERNEL_REQUIRED`), never a
pass on a kernel nobody named, and ``--fa2-device``, ``--fa2-dtypes`` or any
other ``--fa2-*`` option without it is a usage error.  A bad value (an empty
one included) is a ``pytest.UsageError`` naming the flag (:func:`usage`).
What :func:`configure` read is :func:`of` the session's config.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from fa2_verify.core.runner_shard import RunnerShard
from fa2_verify.properties import profiles
from fa2_verify.verify.watchdog import set_call_timeout

EXAMPLES_DIR = ".fa2-examples"
DEFAULT_DEVICE = "cpu"
#: The property tests run only on a kernel named on the command line: never on a default the user did not ask for.
KERNEL_REQUIRED = "--fa2-kernel=NAME|module:attr, the kernel under test (e.g. --fa2-kernel=reference)"

_options_key = pytest.StashKey["dict[str, Any]"]()


def usage(flag: str, value: object, problem: str) -> pytest.UsageError:
    return pytest.UsageError(f"{flag}={value}: {problem}")


def of(config: pytest.Config) -> dict[str, Any]:
    """The options :func:`configure` read for ``config``'s session."""
    return config.stash[_options_key]


def configured(config: pytest.Config) -> bool:
    """Whether :func:`configure` ran for ``config`` (it has not in a session the plugin did not configure)."""
    return _options_key in config.stash


def configure(config: pytest.Config, validate_target: Callable[..., str]) -> dict[str, Any]:
    """Read and check every ``--fa2-*`` option, keep them for :func:`of` and return them.

    With ``--fa2-kernel``, ``validate_target`` loads the kernel and checks the
    device and dtypes (returning this process's device), ``--fa2-bounds-check``
    takes effect (:func:`check_bounds`) and ``--fa2-call-timeout`` is set.
    """
    profile_name = config.getoption("fa2_profile")
    profile_name = "dev" if profile_name is None else profile_name
    if profile_name not in profiles.PROFILES:
        raise usage("--fa2-profile", profile_name, f"not a profile: use one of {', '.join(profiles.PROFILES)}")
    examples = config.getoption("fa2_examples_dir")
    if examples == "":
        raise usage("--fa2-examples-dir", examples, "names no directory: pass a directory, or leave the option out")
    database_dir = pathlib.Path(examples) if examples is not None else config.rootpath / EXAMPLES_DIR
    kernel_name = config.getoption("fa2_kernel")
    device_option = config.getoption("fa2_device")
    dtypes_option = config.getoption("fa2_dtypes")
    dtypes = tuple(name for name in dtypes_option.split(",") if name) if dtypes_option is not None else None
    device = DEFAULT_DEVICE if device_option is None else device_option
    bounds_check = config.getoption("fa2_bounds_check")
    durations = config.getoption("fa2_durations")
    max_golden_seconds = seconds_option("--fa2-max-golden-seconds", config.getoption("fa2_max_golden_seconds"))
    call_timeout = seconds_option("--fa2-call-timeout", config.getoption("fa2_call_timeout"))
    time_budget = seconds_option("--fa2-time-budget", config.getoption("fa2_time_budget"))
    failures = config.getoption("fa2_failures")
    shape_classes = count_option("--fa2-shape-classes", config.getoption("fa2_shape_classes"))
    shard = shard_option(config.getoption("fa2_shard"))
    shares_line = None
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
        device = validate_target(kernel_name, device, dtypes, workerinput, pin=runs_tests)
        shares_line = share_gpu_memory(config, profile_name, device_option or DEFAULT_DEVICE, device, workerinput)
        if bounds_check:
            check_bounds(config, enter=runs_tests)
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
        "failures": failures_option(failures, database_dir) if kernel_name is not None else None,
        "durations": durations,
        "gpu_shares": shares_line,
    }
    return of(config)


def share_gpu_memory(
    config: pytest.Config, profile_name: str, requested: str, device: str, workerinput: dict[str, Any] | None
) -> str | None:
    """:func:`properties.gpu_shares.share_memory` in this process (``requested`` the ``--fa2-device`` given,
    ``device`` this process's): the controller of ``-n N`` checks the workers' shares and returns the line
    describing them, a worker keeps to its own; a refusal is a usage error on ``-n``."""
    from fa2_verify.core.errors import UsageError
    from fa2_verify.properties import gpu_shares

    if workerinput is not None:
        count, index = int(workerinput.get("workercount", 1)), int(str(workerinput["workerid"]).removeprefix("gw"))
    else:
        count, index = int(config.getoption("numprocesses", None) or 0), None
    try:
        return gpu_shares.share_memory(profile_name, requested, count, index, device)
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def seconds_option(flag: str, text: str | None) -> float | None:
    """``--fa2-max-golden-seconds``, ``--fa2-call-timeout``, ``--fa2-time-budget``: a finite number of seconds
    > 0 (``None`` without the option)."""
    if text is None:
        return None
    from argparse import ArgumentTypeError

    from fa2_verify.verify.golden_time import positive_seconds

    try:
        return positive_seconds(text)
    except ArgumentTypeError as exc:
        raise usage(flag, text, str(exc)) from None


def count_option(flag: str, text: str | None) -> int | None:
    """``--fa2-shape-classes``: a whole number >= 1 (``None`` without the option)."""
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise usage(flag, text, "is not a whole number >= 1")
    return int(text)


def failures_option(option: str | None, examples_dir: pathlib.Path) -> pathlib.Path | None:
    """``--fa2-failures``: the failure log (:func:`properties.failure_log.failures_path`)."""
    from fa2_verify.properties.failure_log import failures_path

    try:
        return failures_path(option, examples_dir)
    except ValueError as exc:
        raise usage("--fa2-failures", option, str(exc)) from None


def shard_option(text: str | None) -> RunnerShard | None:
    """``--fa2-shard``: shard I of N (``None`` without the option)."""
    if text is None:
        return None
    try:
        return RunnerShard.parse(text)
    except ValueError as exc:
        raise usage("--fa2-shard", text, str(exc)) from None


def check_bounds(config: pytest.Config, *, enter: bool) -> None:
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
