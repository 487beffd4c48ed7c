"""Replay a measured property-suite pass under pytest-xdist's ``worksteal`` schedule, in the plugin's test orders.

    python -m benchmarks.xdist_order OUT/triton-mps/times.json [--workers 12] [--pass cold] [--estimates OTHER/times.json]

Reads the per-test seconds of one pass of ``benchmarks/suite_time.py``
(``times.json``) and replays them, on ``--workers`` workers, under the rules
of xdist's ``WorkStealingScheduling``: each worker first gets an even run of
consecutive tests; a worker left with fewer than two pending tests (the one
it runs and the next) steals half of the longest queue, from its tail, but
never a victim's last two.  It prints the makespan (plus ``--startup``
seconds per worker) for the tests in their collected order (one test per
dtype, side by side), in the plugin's dtype-major order
(:func:`properties.schedule.dtype_major`, no durations known) and in its
balanced order (:func:`properties.schedule.balanced`): on the pass's own
durations (as if they had been known exactly), and, with ``--estimates``,
on those of the same pass of another run (as the plugin gets them: from the
runs before).

A replay, not a measurement: a test's time in the real run depends on what
other workers had compiled before it, and the replay keeps it fixed.  It
compares orders on the same durations, which the GPU runs themselves, each
on a different machine, cannot.
"""

from __future__ import annotations

import argparse
import heapq
import json

from fa2_verify.properties import declaration, schedule, test_determinism, test_golden, test_metamorphic

#: The property modules in pytest's collection order (file names, sorted).
MODULES = (test_determinism, test_golden, test_metamorphic)
MIN_PENDING = 2


def makespan(durations: list[float], workers: int, startup: float) -> float:
    """When the last of ``durations`` (in collection order) ends under worksteal on ``workers`` workers."""
    queues: list[list[int]] = []
    start = 0
    for share in schedule.worksteal_shares(len(durations), workers):
        queues.append(list(range(start, start + share)))
        start += share
    events = [(startup + durations[queue[0]], worker) for worker, queue in enumerate(queues) if queue]
    heapq.heapify(events)
    end = startup
    while events:
        now, worker = heapq.heappop(events)
        end = max(end, now)
        queue = queues[worker]
        queue.pop(0)
        if len(queue) < MIN_PENDING:
            victim = max(range(workers), key=lambda other: len(queues[other]))
            count = min(len(queues[victim]) // 2, max(0, len(queues[victim]) - MIN_PENDING))
            if count:
                queue += queues[victim][-count:]
                del queues[victim][-count:]
        if queue:
            heapq.heappush(events, (now + durations[queue[0]], worker))
    return end


def orders(seconds: dict[str, float], dtypes: tuple[str, ...], workers: int,
           estimates: dict[str, dict[str, float]]) -> dict[str, list[str]]:
    """The tests of ``seconds`` (``test_<property>[<dtype>]``) collected as written, dtype-major, and balanced
    on each of ``estimates`` (a label, and seconds per test: recorded durations of one run each)."""
    names = [name for module in MODULES for name, obj in vars(module).items() if isinstance(obj, declaration.Property)]
    shards = [(name, dtype) for name in names for dtype in dtypes if f"{name}[{dtype}]" in seconds]
    collected = [f"{name}[{dtype}]" for name, dtype in shards]
    found = {"collected": collected,
             "dtype-major": [collected[i] for i in schedule.dtype_major([dtype for _, dtype in shards], dtypes)]}
    for label, known in estimates.items():
        guessed = schedule.estimates_for(collected, {test: [value] for test, value in known.items()})
        if guessed is not None:
            found[f"balanced, {label}"] = [collected[i] for i in schedule.balanced(guessed, workers)]
    return found


def pass_seconds(path: str, pass_name: str) -> tuple[dict[str, float], float]:
    """Seconds per test (``test_<property>[<dtype>]``) of pass ``pass_name`` of a ``times.json``, and its wall-clock."""
    with open(path, encoding="utf-8") as handle:
        passes = {entry["name"]: entry for entry in json.load(handle)["passes"]}
    if pass_name not in passes:
        raise SystemExit(f"xdist_order: error: {path} has no pass {pass_name!r}: it has {', '.join(passes)}")
    tests = passes[pass_name]["tests"]
    return {test["test"].split("::")[-1]: test["seconds"] for test in tests}, passes[pass_name]["wall_seconds"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("times", help="times.json of benchmarks/suite_time.py")
    parser.add_argument("--pass", dest="pass_name", default="cold", help="which pass (default: cold)")
    parser.add_argument("--workers", type=int, default=12, help="xdist workers (default: 12)")
    parser.add_argument("--startup", type=float, default=7.0, help="seconds before a worker's first test (default: 7)")
    parser.add_argument("--dtypes", default="float16,bfloat16,float32", help="the shards' dtypes, in collection order")
    parser.add_argument("--estimates", help="another run's times.json: balance on its durations of the same pass")
    args = parser.parse_args(argv)
    seconds, wall = pass_seconds(args.times, args.pass_name)
    estimates = {"own durations": seconds}
    if args.estimates:
        estimates["--estimates"] = pass_seconds(args.estimates, args.pass_name)[0]
    print(f"{len(seconds)} tests, {sum(seconds.values()):.0f} worker-s; measured {wall:.1f} s; "
          f"no order ends before {max(seconds.values()) + args.startup:.1f} s (longest test)")
    for name, order in orders(seconds, tuple(args.dtypes.split(",")), args.workers, estimates).items():
        span = makespan([seconds[test] for test in order], args.workers, args.startup)
        print(f"{name:28s} {span:6.1f} s on {args.workers} workers")

if __name__ == "__main__":
    main()
