"""The order of the property tests and the runner's shard of them, on the recorded durations.

Each run records its property tests' durations in pytest's cache
(:class:`properties.schedule.DurationLog`), and under ``--dist worksteal`` the
workers order the tests on the durations recorded before, which the controller
passes them (:func:`to_worker`), so that no worker holds two long ones
(:mod:`properties.schedule`); without them, dtype-major.  ``--fa2-shard I/N``
first keeps the I-th of N balanced groups (:mod:`properties.runner_shards`),
on the ``--fa2-durations`` file.
"""

from __future__ import annotations

from typing import Any

import pytest

from fa2_verify.properties import collection, runner_shards, schedule
from fa2_verify.properties.declaration import attached_dtype
from fa2_verify.properties.options import usage
from fa2_verify.properties.summary import OBSERVED, UNSUPPORTED

#: The key of the recorded test durations in an xdist worker's ``workerinput`` (:mod:`properties.schedule`).
DURATIONS = "fa2_durations"
#: The names the duration log and the shard selection are registered under.
DURATION_LOG = "fa2-verify-durations"
SHARD_SELECTION = "fa2-verify-shard"


def register(config: pytest.Config, options: dict[str, Any]) -> None:
    """Register the shard selection (``--fa2-shard``) and, on a property run's controller with pytest's cache,
    the duration log (with the ``--fa2-durations`` records of this kind of run)."""
    durations = options["durations"]
    cache = getattr(config, "cache", None)
    if cache is None and durations is not None:
        raise pytest.UsageError("--fa2-durations needs pytest's cache: drop -p no:cacheprovider")
    key = schedule.run_key(options["kernel"] or "", options["run_device"], options["profile"])
    if options["shard"] is not None:
        runs = durations_runs(durations) if durations is not None else {}
        selection = runner_shards.ShardSelection(options["shard"], runs, key, order_tests)
        config.pluginmanager.register(selection, SHARD_SELECTION)
    if options["kernel"] is not None and cache is not None and not hasattr(config, "workerinput"):
        known = durations_option(durations, key)
        config.pluginmanager.register(schedule.DurationLog(cache, key, (OBSERVED, UNSUPPORTED), known),
                                      DURATION_LOG)


def durations_option(path: str | None, key: str) -> dict[str, list[float]]:
    """``--fa2-durations``: the durations the file holds for runs of ``key`` (none without the option)."""
    return {} if path is None else durations_runs(path).get(key, {})


def durations_runs(path: str) -> dict[str, dict[str, list[float]]]:
    """``--fa2-durations``: every kind of run's records in the file (:func:`schedule.file_runs`)."""
    try:
        return schedule.file_runs(path)
    except ValueError as exc:
        raise usage("--fa2-durations", path, str(exc)) from None


def order_collection(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the collection (:func:`order_tests`); under ``--fa2-shard`` the shard's selection orders what it keeps
    (:class:`properties.runner_shards.ShardSelection`, which runs after ``-k``)."""
    if config.pluginmanager.get_plugin(SHARD_SELECTION) is None:
        order_tests(config, items)


def order_tests(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the property tests for pytest-xdist's ``worksteal`` (:mod:`properties.schedule`): on a worker
    whose controller passed the durations of earlier runs, and when every test collected is a property test,
    balanced on them (:func:`schedule.balanced`); otherwise dtype-major, any other test keeping its place.
    The order is a function of the collection and of what the controller passed, as xdist requires it to be
    the same on every worker."""
    dtypes = collection.dtypes_drawn(config)
    if dtypes is None:
        return
    slots = [index for index, item in enumerate(items) if collection.is_property(item)]
    shards = [item for item in items if collection.is_property(item)]
    workerinput = getattr(config, "workerinput", None)
    recorded = workerinput.get(DURATIONS) if workerinput is not None else None
    estimates = None
    if recorded and len(shards) == len(items):
        estimates = schedule.estimates_for([schedule.name_in_records(item.nodeid) for item in items], recorded)
    if estimates is not None:
        assert workerinput is not None, "estimates come from the durations a worker's controller passed"
        order = schedule.balanced(estimates, workerinput["workercount"])
    else:
        order = schedule.dtype_major([attached_dtype(shard.obj) for shard in shards], dtypes)
    for index, position in zip(slots, order):
        items[index] = shards[position]


def to_worker(node) -> None:
    """pytest-xdist, on the controller: under ``--dist worksteal`` the worker gets the recorded durations."""
    log = node.config.pluginmanager.get_plugin(DURATION_LOG)
    if log is not None and node.config.getoption("dist", None) == "worksteal":
        node.workerinput[DURATIONS] = log.recorded
