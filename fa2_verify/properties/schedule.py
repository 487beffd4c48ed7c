"""The order of the property tests under pytest-xdist, and the test durations it is computed from.

pytest-xdist's ``worksteal`` scheduler (the one ``ci/properties.sh`` uses)
first deals the collection to its W workers as W even runs of consecutive
tests (:func:`worksteal_shares`).  A worker with fewer than two tests left
then takes half of the longest queue from its tail, but never a worker's
running test or the one after it: xdist keeps two (``MIN_PENDING``), since
a worker must know its next test before it runs one.  So what no other
worker can take is each worker's first two tests, and a run's wall-clock is
at least the longest such pair.

* :func:`dtype_major`, when nothing is known of the tests' durations: every
  property's first-dtype shard, then every second-dtype shard, and so on.  A
  property's shards cost about the same (the varlen property's three shards
  took 65 to 98 s each on a cold Triton cache), and collected as written
  they are neighbours: two could open one worker's run back to back.
* :func:`balanced`, from the durations of earlier runs (:class:`DurationLog`
  keeps them in pytest's cache): the W longest tests open the W runs, each
  followed by one of the shortest (the test its worker holds while the long
  one runs), and the rest are dealt longest first to the run with the least
  work so far, from whose tail idle workers steal them.  Replayed on four
  measured cold `ci` runs (``python -m benchmarks.xdist_order``, durations
  of another run as the estimates), it ends 2 to 16 s after the longest test
  on 16 workers, where dtype-major ends 45 to 69 s after it (docs/benchmarks.md).

The estimate of a test is the longest of its last :data:`HISTORY` recorded
durations: a run on a cold Triton cache takes several times a warm one, and
the order is for the slow case (a kernel change misses every cached variant,
but the runs before it were warm).  Replayed, warm runs lose nothing by it:
ordered on the cold pass's durations they end 0 to 4 s sooner than
dtype-major (three measured runs, 12 and 16 workers).

A first run on a fresh runner has no records: ``--fa2-durations FILE``
supplies them from a copy of the cache's records kept with the tests
(:func:`durations_file`; pytest-split's committed ``.test_durations`` is the
same idea), for the tests the cache has not recorded.
"""

from __future__ import annotations

import statistics
from typing import Any

from fa2_verify.core.errors import InputJsonError
from fa2_verify.core.user_json import read_json

#: pytest's cache key of the recorded durations (``config.cache``; its first part names the plugin).
CACHE_KEY = "fa2_verify/durations"
#: Recorded durations kept per test: enough that a cold run's stay among them across the warm runs of a
#: few days of CI (a new property's, or a costlier one's, count at once: the estimate is their maximum).
HISTORY = 30


def dtype_major(shard_dtypes: list[str | None], dtypes: tuple[str, ...]) -> list[int]:
    """The positions of shards of dtypes ``shard_dtypes`` (in collection order) in dtype-major order: by the
    rank of their dtype in ``dtypes``, collection order within a dtype (a shard of no dtype ranks first)."""
    rank: dict[str | None, int] = {dtype: index for index, dtype in enumerate(dtypes)}
    return sorted(range(len(shard_dtypes)), key=lambda position: rank.get(shard_dtypes[position], 0))


def worksteal_shares(tests: int, workers: int) -> list[int]:
    """How many consecutive tests each worker first gets from ``worksteal``: ``remaining // workers left``."""
    shares = []
    for worker in range(workers):
        shares.append(tests // (workers - worker))
        tests -= shares[-1]
    return shares


def balanced(estimates: list[float], workers: int) -> list[int]:
    """The positions of tests of ``estimates`` seconds (in collection order) in the order that opens each
    worker's first run with one of the longest tests and, after it, one of the shortest (see the module)."""
    runs: list[tuple[list[int], int]] = [([], share) for share in worksteal_shares(len(estimates), workers) if share]
    rest = sorted(range(len(estimates)), key=lambda position: -estimates[position])
    for run, _ in runs:
        run.append(rest.pop(0))
    for run, share in runs:
        if len(run) < share:
            run.append(rest.pop())
    for position in rest:
        open_runs = [run for run, share in runs if len(run) < share]
        min(open_runs, key=lambda run: sum(estimates[test] for test in run)).append(position)
    return [position for run, _ in runs for position in run]


def estimates_for(tests: list[str], recorded: dict[str, list[float]]) -> list[float] | None:
    """Each of ``tests``' estimate (the longest of its recorded durations; a test never recorded gets the
    median estimate of the others), or None when no test was recorded."""
    known = {test: max(recorded[test]) for test in tests if recorded.get(test)}
    if not known:
        return None
    median = statistics.median(known.values())
    return [known.get(test, median) for test in tests]


def run_key(kernel: str, device: str, profile: str) -> str:
    """The key of one kind of run in the recorded durations: the same tests cost differently on another
    kernel, device or profile."""
    return f"{kernel} {device} {profile}"


def name_in_records(nodeid: str) -> str:
    """A test's name in the records, ``<file>::<test>[<dtype>]``: its node id without the directories,
    which depend on the rootdir and on ``--pyargs``."""
    return nodeid.rsplit("/", 1)[-1]


def recorded_durations(cache, key: str) -> dict[str, list[float]]:
    """The durations recorded for runs of ``key`` in pytest's ``cache`` (empty when none, or unreadable)."""
    return _durations_of(_runs(cache), key)


def _runs(cache) -> dict:
    """Every kind of run's records in pytest's ``cache`` (empty when none, or unreadable)."""
    runs = cache.get(CACHE_KEY, {})
    return runs if isinstance(runs, dict) else {}


def _durations_of(runs: dict, key: str) -> dict[str, list[float]]:
    """The well-formed records of ``key`` among ``runs``: test name -> durations."""
    durations = runs.get(key, {})
    if not isinstance(durations, dict):
        return {}
    return {test: [float(value) for value in values] for test, values in durations.items()
            if isinstance(values, list) and all(isinstance(value, (int, float)) for value in values)}


def durations_file(path: str, key: str) -> dict[str, list[float]]:
    """The durations of runs of ``key`` in ``path``, a file in the format of the cache's records (a copy of
    ``.pytest_cache/v/fa2_verify/durations``); ValueError naming what is wrong with the file."""
    return file_runs(path).get(key, {})


def file_runs(path: str) -> dict[str, dict[str, list[float]]]:
    """Every kind of run's well-formed records in ``path`` (see :func:`durations_file`): run key -> test name ->
    durations; ValueError naming what is wrong with the file."""
    try:
        runs = read_json(path, "--fa2-durations")
    except InputJsonError as exc:
        raise ValueError(exc.problem) from None
    if not isinstance(runs, dict):
        raise ValueError("is not a mapping of run keys to recorded durations (a copy of "
                         f"<cache>/v/{CACHE_KEY})")
    return {key: _durations_of(runs, key) for key in runs}


class DurationLog:
    """Records each property test's duration (setup, call and teardown) from the reports of a session (on the
    xdist controller, every worker's) and, at its end, appends them to the cache's records of ``key``.

    ``recorded`` holds the records as the session found them, read once: what the controller passes to every
    worker, so that all of them order the collection the same way even if another session writes the cache.
    ``known`` (from :func:`durations_file`) fills in the tests the cache has not recorded; only this
    session's own durations are written back."""

    def __init__(self, cache, key: str, property_marks: tuple[str, ...],
                 known: dict[str, list[float]] | None = None) -> None:
        self.cache = cache
        self.key = key
        self.property_marks = property_marks
        self.recorded = {**(known or {}), **recorded_durations(cache, key)}
        self.seconds: dict[str, float] = {}
        self.properties: set[str] = set()

    def pytest_runtest_logreport(self, report: Any) -> None:
        test = name_in_records(report.nodeid)
        self.seconds[test] = self.seconds.get(test, 0.0) + report.duration
        if any(name in self.property_marks for name, _ in report.user_properties):
            self.properties.add(test)

    def pytest_sessionfinish(self) -> None:
        if not self.properties:
            return
        runs = _runs(self.cache)
        records = _durations_of(runs, self.key)
        for test in self.properties:
            records[test] = (records.get(test, []) + [round(self.seconds[test], 3)])[-HISTORY:]
        runs[self.key] = records
        self.cache.set(CACHE_KEY, runs)
