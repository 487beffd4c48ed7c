"""One runner's part of a property-suite run split over several runners: shard ``I/N``.

``pytest --fa2-shard I/N`` runs the I-th of N groups of the property tests
(:mod:`properties.runner_shards` chooses them), and the run's Allure results
record ``I/N`` so that ``fa2-verify report`` can tell a complete set of
shards from an incomplete one (:mod:`records.allure_merge`).  Shards are
numbered from 1; an unsplit run is shard ``1/1``.  Not to be confused with a
property's dtype shards (``test_x[float16]``, :func:`properties.harness.shards`),
which every runner shard keeps together or apart like any other test.
"""

from __future__ import annotations

import dataclasses
import re

#: ``I/N``: digits only, at most 9 of them each (no sign, space or other numerals).
_FORM = re.compile(r"([0-9]{1,9})/([0-9]{1,9})")


@dataclasses.dataclass(frozen=True)
class RunnerShard:
    """Shard ``index`` of ``count`` (``1 <= index <= count``)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> RunnerShard:
        """``I/N`` as a shard; ValueError naming what is wrong with ``text`` (for a one-line usage error)."""
        match = _FORM.fullmatch(text)
        if match is None:
            raise ValueError("is not I/N, shard I of N (e.g. 1/4)")
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1:
            raise ValueError("splits the run into no shard: N must be at least 1")
        if not 1 <= index <= count:
            raise ValueError(f"names shard {index} of {count}: shards are numbered 1 to {count}")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


#: The shard of a run that was not split.
WHOLE_RUN = RunnerShard(1, 1)
