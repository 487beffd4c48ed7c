"""Replay a measured property-suite pass under pytest-xdist's ``worksteal`` schedule, in two test orders.

    python -m benchmarks.xdist_order OUT/triton-mps/times.json [--workers 12] [--pass cold]

Reads the per-test seconds of one pass of ``benchmarks/suite_time.py``
(``times.json``) and replays them, on ``--workers`` workers, under the rules
of xdist's ``WorkStealingScheduling``: each worker first gets an even run of
consecutive tests; a worker left with fewer than two pending tests (the one
it runs and the next) steals half of the longest queue, from its tail, but
never a victim's last two.  It prints the makespan (plus ``--startup``
seconds per worker) for the tests in their collected order (one test per
dtype, side by side) and in the plugin's dtype-major order
(:func:`properties.plugin.dtype_major`).

A replay, not a measurement: a test's time in the real run depends on what
other workers had compiled before it, and the replay keeps it fixed.  It
compares orders on the same durations, which the GPU runs themselves, each
on a different machine, cannot.
"""

from __future__ import annotations

import argparse
import heapq
import json

from fa2_verify.properties import declaration, plugin, test_determinism, test_golden, test_metamorphic

#: The property modules in pytest's collection order (file names, sorted).
MODULES = (test_determinism, test_golden, test_metamorphic)
MIN_PENDING = 2


def makespan(durations: list[float], workers: int, startup: float) -> float:
    """When the last of ``durations`` (in collection order) ends under worksteal on ``workers`` workers."""
    queues: list[list[int]] = []
    rest = list(range(len(durations)))
    for worker in range(workers):
        share = len(rest) // (workers - worker)
        queues.append(rest[:share])
        rest = rest[share:]
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


def orders(seconds: dict[str, float], dtypes: tuple[str, ...]) -> dict[str, list[str]]:
    """The tests of ``seconds`` (``test_<property>[<dtype>]``) collected as written and dtype-major."""
    names = [name for module in MODULES for name, obj in vars(module).items() if isinstance(obj, declaration.Property)]
    shards = [(name, dtype) for name in names for dtype in dtypes if f"{name}[{dtype}]" in seconds]
    order = plugin.dtype_major([dtype for _, dtype in shards], dtypes)
    collected = [f"{name}[{dtype}]" for name, dtype in shards]
    return {"collected": collected, "dtype-major": [collected[position] for position in order]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("times", help="times.json of benchmarks/suite_time.py")
    parser.add_argument("--pass", dest="pass_name", default="cold", help="which pass (default: cold)")
    parser.add_argument("--workers", type=int, default=12, help="xdist workers (default: 12)")
    parser.add_argument("--startup", type=float, default=7.0, help="seconds before a worker's first test (default: 7)")
    parser.add_argument("--dtypes", default="float16,bfloat16,float32", help="the shards' dtypes, in collection order")
    args = parser.parse_args(argv)
    with open(args.times, encoding="utf-8") as handle:
        passes = {entry["name"]: entry for entry in json.load(handle)["passes"]}
    if args.pass_name not in passes:
        parser.error(f"--pass={args.pass_name}: the file has {', '.join(passes)}")
    tests = passes[args.pass_name]["tests"]
    seconds = {test["test"].split("::")[-1]: test["seconds"] for test in tests}
    print(f"{len(seconds)} tests, {sum(seconds.values()):.0f} worker-s; measured {passes[args.pass_name]['wall_seconds']:.1f} s")
    for name, order in orders(seconds, tuple(args.dtypes.split(","))).items():
        span = makespan([seconds[test] for test in order], args.workers, args.startup)
        print(f"{name:12s} {span:6.1f} s on {args.workers} workers")


if __name__ == "__main__":
    main()
