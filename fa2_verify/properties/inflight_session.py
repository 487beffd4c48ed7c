"""The in-flight file (:mod:`properties.inflight`) of each process of a pytest session.

A kernel that kills its process still names the case: each process keeps the
case of the example it runs in an in-flight file, in one directory per
session, which xdist workers get from the controller (:func:`to_worker`).  A
file left when the session ends is reported in the terminal summary ("the
process ... died while running ...", :mod:`properties.summary`) and fails the
run; without xdist a watcher process prints it after pytest died.  A kernel's
``os._exit`` fails its example instead (:mod:`verify.user_code`).
"""

from __future__ import annotations

import contextlib
import pathlib

import pytest

from fa2_verify.properties.inflight import InFlight, session_directory

#: The key of the session's in-flight directory in an xdist worker's ``workerinput``.
INFLIGHT_DIR = "fa2_inflight_dir"

_inflight_key = pytest.StashKey[InFlight]()


def open_inflight(config: pytest.Config) -> None:
    """This process's in-flight file, kept for :func:`inflight_of`: a worker's in its controller's directory,
    else in a fresh one.

    A process that runs tests without xdist is the one that would die, so its
    first record starts the watcher (:func:`properties.inflight.watch`), with
    pytest's output capture suspended so that it writes to the terminal.
    """
    config.stash[_inflight_key] = _inflight(config)


def _inflight(config: pytest.Config) -> InFlight:
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


def to_worker(node) -> None:
    """pytest-xdist, on the controller: the worker keeps its in-flight file in the controller's directory."""
    node.workerinput[INFLIGHT_DIR] = str(inflight_of(node.config).directory)
