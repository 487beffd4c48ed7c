"""The property suite over several runners: ``--fa2-shard I/N`` keeps the I-th of N balanced groups of tests.

Every runner collects the same tests and computes the same N groups, so the
shards partition the collection: each test runs on exactly one runner, with
its whole Hypothesis budget (the profile's examples for that test).  What
makes the groups the same on every runner is that they depend only on

* the names of the tests collected after ``-k``/``-m`` (this hook runs last,
  so a selection is split, not the collection before it);
* the durations of the ``--fa2-durations`` file (kept in the repository),
  never pytest's cache, which differs from runner to runner.

The groups are the greedy longest-processing-time assignment: the tests,
longest estimate first (ties by name), each to the group with the least
estimated work so far (ties to the lower shard).  A test's estimate is the
longest of its recorded durations, and a test the records lack gets the
median of the others (:func:`schedule.estimates_for`).  A kind of run the file
has no records of (another profile or kernel) is estimated on the records of
every kind it holds, each test's longest: which properties are costly carries
over.  With no records at all every test counts the same, and the groups
deal the tests by name.  Each group's load is then within the longest test
of every other's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fa2_verify.core.runner_shard import RunnerShard
from fa2_verify.properties import schedule


def groups(estimates: list[float], names: list[str], count: int) -> list[int]:
    """The group (0 to ``count - 1``) of each test of ``estimates`` seconds named ``names``: longest first, each
    to the least loaded group (see the module); a function of the (name, estimate) pairs, not of their order."""
    loads = [0.0] * min(count, len(names))
    assigned = [0] * len(names)
    for position in sorted(range(len(names)), key=lambda test: (-estimates[test], names[test])):
        group = min(range(len(loads)), key=lambda index: (loads[index], index))
        loads[group] += estimates[position]
        assigned[position] = group
    return assigned


def estimates(names: list[str], runs: dict[str, dict[str, list[float]]], key: str) -> list[float]:
    """Each test's estimate from the records ``runs`` (run key -> test -> durations) of runs of ``key``, or of
    every kind of run when ``key`` has none of these tests; 1 each when nothing is recorded."""
    found = schedule.estimates_for(names, runs.get(key, {}))
    if found is None:
        pooled: dict[str, list[float]] = {}
        for records in runs.values():
            for test, durations in records.items():
                pooled.setdefault(test, []).extend(durations)
        found = schedule.estimates_for(names, pooled)
    return found if found is not None else [1.0] * len(names)


def in_shard(names: list[str], runs: dict[str, dict[str, list[float]]], key: str, shard: RunnerShard) -> list[bool]:
    """Whether each test named ``names`` belongs to ``shard`` (see the module)."""
    assigned = groups(estimates(names, runs, key), names, shard.count)
    return [group == shard.index - 1 for group in assigned]


class ShardSelection:
    """The plugin's hook that keeps this runner's shard of the collection, after every other plugin's
    selection (``trylast``), deselecting the rest, then hands what it kept to ``then`` (the plugin's
    ordering for xdist)."""

    def __init__(self, shard: RunnerShard, runs: dict[str, dict[str, list[float]]], key: str,
                 then: Callable[[pytest.Config, list[pytest.Item]], Any]) -> None:
        self.shard = shard
        self.runs = runs
        self.key = key
        self.then = then

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        names = [schedule.name_in_records(item.nodeid) for item in items]
        keep = in_shard(names, self.runs, self.key, self.shard)
        config.hook.pytest_deselected(items=[item for item, kept in zip(items, keep) if not kept])
        items[:] = [item for item, kept in zip(items, keep) if kept]
        self.then(config, items)
