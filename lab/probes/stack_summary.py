"""Where a sampled run's time went, from py-spy's collapsed stacks (``py-spy record --format raw``).

    python3 lab/probes/stack_summary.py STACKS [--top N] [--under TEXT] [--match TEXT]

Each line of STACKS is ``frame;frame;...;frame COUNT``, outermost frame first,
a frame being ``function (path:line)``.  Printed: the samples in all; the
seconds per property test (the ``test_*`` frame of ``fa2_verify/properties``);
then the ``--top`` functions by inclusive samples (a function counted once
per sample however deep it recurses), functions named by ``file:function``
with the line dropped, restricted to frames whose path contains ``--match``
(default ``fa2_verify``; ``''`` for every frame), and to samples whose stack
holds a frame containing ``--under`` when given.  ``--rate`` converts
samples to seconds (py-spy's ``--rate``, default 50 here).
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re

FRAME = re.compile(r"^(?P<function>.*) \((?P<path>.*?)(?::\d+)?\)$")


def parse(path: pathlib.Path) -> list[tuple[list[str], int]]:
    """(frames outermost first, samples) per line of a collapsed-stack file."""
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def name(frame: str) -> tuple[str, str]:
    """(``file:function``, path) of one frame; the frame itself when it has no path."""
    match = FRAME.match(frame)
    if not match:
        return frame, ""
    path = match["path"]
    return f"{pathlib.Path(path).name}:{match['function']}", path


def property_of(frames: list[str]) -> str:
    for frame in frames:
        label, path = name(frame)
        if "fa2_verify/properties/test_" in path and label.split(":")[1].startswith("test_"):
            return label.split(":")[1]
    return "(outside a property test)"


def summary(stacks: list[tuple[list[str], int]], *, top: int, under: str, match: str, rate: float) -> str:
    total = sum(count for _, count in stacks)
    chosen = [(frames, count) for frames, count in stacks if not under or any(under in frame for frame in frames)]
    lines = [f"{total} samples, {total / rate:.1f} s; {sum(c for _, c in chosen) / rate:.1f} s under {under or 'all'}"]
    per_test: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for frames, count in chosen:
        per_test[property_of(frames)] += count
        seen = {label for label, path in map(name, frames) if match in path}
        for label in seen:
            inclusive[label] += count
    lines.append("\n| property test | s |\n|---|---:|")
    lines += [f"| {test} | {count / rate:.1f} |" for test, count in per_test.most_common()]
    lines.append(f"\n| function (inclusive, paths with {match!r}) | s |\n|---|---:|")
    lines += [f"| {label} | {count / rate:.1f} |" for label, count in inclusive.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stacks", type=pathlib.Path)
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--under", default="")
    parser.add_argument("--match", default="fa2_verify")
    parser.add_argument("--rate", type=float, default=50.0)
    arguments = parser.parse_args()
    print(summary(parse(arguments.stacks), top=arguments.top, under=arguments.under, match=arguments.match,
                  rate=arguments.rate))


if __name__ == "__main__":
    main()
