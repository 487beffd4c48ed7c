"""Ways to count a metric chunk's radix digits, timed on one device, each checked against ``torch.bincount``.

    python lab/probes/probe_histograms.py --device cuda
    python lab/probes/probe_histograms.py --device cpu --elements 1048576

:class:`verify.metrics._Selection` counts the first 16-bit digit of each 2^24-element chunk of a metric's
float64 values with ``torch.bincount`` over 2^16 bins.  On an H100 that took 3.9 ms a chunk in the
head-dim-256 scale case (docs/benchmarks.md, lab/benchmarks-history.md "seventh session"): a metric's values
share a few exponents, so nearly every atomic add of the histogram's global-memory bins goes to a few
addresses.  Here the same counts, on chunks whose values span ``--decades`` decades (1: the clustered case;
12: errors from 1e-12 to 1):

* ``bincount``: as the product does;
* ``lanes-L``: each element's bin in one of ``L`` copies of the histogram (element ``e`` in copy ``e % L``),
  summed after, so a hot bin's adds spread over ``L`` addresses;
* ``unique``: ``torch.unique(..., return_counts=True)`` (a sort);
* ``sorted``: ``torch.sort`` of the digits and ``searchsorted`` of the bin edges.

The fixed-edge histogram of :class:`verify.metrics.Summaries` (``bucketize`` into 9 to 16 bins, then
``bincount``) is timed beside ``(values >= edge).sum()`` per edge.  One JSON line per (spread, way), the
median of ``--repeats`` synchronised runs.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from synced import timed

from fa2_verify.verify.metrics import ABS_EDGES, DIGIT_BITS, RADIX


def _values(elements: int, decades: int, device: str) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(decades)
    exponents = torch.rand(elements, generator=generator, dtype=torch.float64) * decades - decades
    return (10.0 ** exponents * torch.rand(elements, generator=generator, dtype=torch.float64)).to(device)


def _bincount(digits: torch.Tensor) -> torch.Tensor:
    return torch.bincount(digits, minlength=RADIX)


def _lanes(count: int):
    def spread(digits: torch.Tensor) -> torch.Tensor:
        lane = torch.arange(digits.numel(), device=digits.device) % count
        return torch.bincount(digits + lane * RADIX, minlength=RADIX * count).view(count, RADIX).sum(0)
    return spread


def _unique(digits: torch.Tensor) -> torch.Tensor:
    bins, counts = torch.unique(digits, return_counts=True)
    return torch.zeros(RADIX, dtype=torch.int64, device=digits.device).index_put_((bins,), counts)


def _sorted(digits: torch.Tensor) -> torch.Tensor:
    ordered = torch.sort(digits).values
    edges = torch.searchsorted(ordered, torch.arange(RADIX + 1, device=digits.device))
    return edges.diff()


def _edge_bincount(values: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
    return torch.bincount(torch.bucketize(values, inner, right=True), minlength=len(inner) + 1)


def _edge_sums(values: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
    at_least = torch.stack([(values >= edge).sum() for edge in inner])
    total = torch.tensor([values.numel()], device=values.device)
    return -torch.diff(torch.cat([total, at_least, torch.zeros(1, dtype=at_least.dtype, device=values.device)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--elements", type=int, default=1 << 24)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ways = {"bincount": _bincount, "lanes-8": _lanes(8), "lanes-32": _lanes(32), "unique": _unique,
            "sorted": _sorted}
    inner = torch.tensor(ABS_EDGES[1:-1], dtype=torch.float64, device=args.device)
    for decades in (1, 12):
        values = _values(args.elements, decades, args.device)
        digits = values.view(torch.int64) >> (64 - DIGIT_BITS)
        expected = _bincount(digits)
        for name, way in ways.items():
            counts = way(digits)
            seconds = [timed(args.device, way, digits)[1] for _ in range(args.repeats)]
            print(json.dumps({"decades": decades, "histogram": "radix digit", "way": name,
                              "equal": bool(torch.equal(counts, expected)),
                              "ms": round(1e3 * statistics.median(seconds), 3)}), flush=True)
        expected = _edge_bincount(values, inner)
        for name, way in (("bucketize+bincount", _edge_bincount), ("sums per edge", _edge_sums)):
            counts = way(values, inner)
            seconds = [timed(args.device, way, values, inner)[1] for _ in range(args.repeats)]
            print(json.dumps({"decades": decades, "histogram": "fixed edges", "way": name,
                              "equal": bool(torch.equal(counts, expected)),
                              "ms": round(1e3 * statistics.median(seconds), 3)}), flush=True)


if __name__ == "__main__":
    main()
