"""--fa2-shard I/N: the shard value (core/runner_shard.py) and the balanced groups (properties/runner_shards.py)."""

from __future__ import annotations

import random

import pytest

from fa2_verify.core.runner_shard import WHOLE_RUN, RunnerShard
from fa2_verify.properties import runner_shards


@pytest.mark.parametrize("text, problem", [
    ("0/2", "names shard 0 of 2: shards are numbered 1 to 2"),
    ("3/2", "names shard 3 of 2: shards are numbered 1 to 2"),
    ("a/b", "is not I/N"),
    ("1/0", "N must be at least 1"),
    ("", "is not I/N"),
    ("2", "is not I/N"),
    ("-1/2", "is not I/N"),
    (" 1/2", "is not I/N"),
    ("1/2/3", "is not I/N"),
    ("1/" + "9" * 5000, "is not I/N"),
])
def test_a_bad_shard_is_named_in_one_line(text, problem):
    with pytest.raises(ValueError) as info:
        RunnerShard.parse(text)
    assert problem in str(info.value) and "\n" not in str(info.value)


def test_a_shard_reads_and_writes_as_i_of_n():
    assert RunnerShard.parse("2/3") == RunnerShard(2, 3) and str(RunnerShard(2, 3)) == "2/3"
    assert RunnerShard.parse("1/1") == WHOLE_RUN


def _tests(count: int, seed: int) -> tuple[list[str], list[float]]:
    draw = random.Random(seed)
    names = [f"test_{draw.choice('abcdef')}.py::test_p{index}[float{draw.choice((16, 32))}]" for index in range(count)]
    return names, [round(draw.uniform(0.5, 120.0), 1) for _ in names]


@pytest.mark.parametrize("seed", range(20))
def test_the_shards_partition_the_tests_the_same_way_in_any_collection_order(seed):
    """Every test in exactly one of the N shards, whatever N (more shards than tests included); and the same
    groups from a collection in another order, as two runners must compute them."""
    names, estimates = _tests(count=random.Random(seed).randint(0, 40), seed=seed)
    runs = {"triton cuda ci": {name: [seconds] for name, seconds in zip(names, estimates)}}
    for count in range(1, 7):
        member = [runner_shards.in_shard(names, runs, "triton cuda ci", RunnerShard(index, count))
                  for index in range(1, count + 1)]
        assert [sum(column) for column in zip(*member)] == [1] * len(names)
        order = list(range(len(names)))
        random.Random(seed + count).shuffle(order)
        for index, kept in enumerate(member, start=1):
            shuffled = runner_shards.in_shard([names[i] for i in order], runs, "triton cuda ci", RunnerShard(index, count))
            assert shuffled == [kept[i] for i in order]


@pytest.mark.parametrize("seed", range(10))
def test_each_shards_work_is_within_the_longest_test_of_every_other(seed):
    """Longest-processing-time first: the greedy bound (a shard's load exceeds the least one by at most the
    test it took last, no longer than the longest)."""
    names, estimates = _tests(count=40, seed=seed)
    for count in (2, 3, 4, 8):
        loads = [0.0] * count
        for group, seconds in zip(runner_shards.groups(estimates, names, count), estimates):
            loads[group] += seconds
        assert max(loads) - min(loads) <= max(estimates)


def test_longest_first_where_a_split_in_collection_order_is_not_balanced():
    names = ["a", "b", "c", "d", "e", "f"]
    assert runner_shards.groups([90.0, 60.0, 40.0, 30.0, 20.0, 10.0], names, 2) == [0, 1, 1, 0, 1, 0]


def test_estimates_come_from_the_runs_key_else_every_kind_of_run_else_count_the_same():
    runs = {"triton cuda ci": {"a": [10.0, 80.0], "b": [3.0]}, "flex cuda dev": {"a": [5.0], "c": [7.0]}}
    assert runner_shards.estimates(["a", "b", "new"], runs, "triton cuda ci") == [80.0, 3.0, 41.5]
    assert runner_shards.estimates(["a", "c"], runs, "triton cuda nightly") == [80.0, 7.0]
    assert runner_shards.estimates(["x", "y"], runs, "triton cuda nightly") == [1.0, 1.0]
    assert runner_shards.estimates(["x"], {}, "triton cuda ci") == [1.0]
