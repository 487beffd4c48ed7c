"""Error metrics: one kernel output against the golden, reported as distributions.

For every element ``e`` with ``actual`` (the kernel's value) and ``expected``
(the golden's, float64, never rounded to the kernel's dtype):

* absolute error ``|actual - expected|``;
* relative error ``|actual - expected| / |expected|`` (``0/0 = 0``, ``x/0 = inf``);
* ULP distance ``|actual - expected| / ulp(expected)``, with ``ulp`` the gap
  between consecutive numbers of the *output dtype* at ``expected`` rounded to
  that dtype (:func:`ulp`); ``lse`` is measured in float32 ULPs;
* normalized error ``|actual - expected| / bound_e``, with ``bound_e`` the
  first-order rounding bound of a correct FA2 kernel from
  :mod:`verify.error_model` (docs/error-model.md).  An element mismatches when
  its normalized error exceeds the output's threshold.

Non-finite values (docs/error-model.md, "Non-finite values"): NaN or Inf where
the golden is finite is always a mismatch with infinite error (that includes an
element left unwritten under :mod:`verify.poison`).  Where the golden is ±inf
(``lse`` of a row that sees no key) an actual infinity of either sign is exact,
as the kernel contract allows, and anything else, NaN included, is a mismatch.

Each metric is summarized by a :class:`Distribution`: nearest-rank quantiles
(exact order statistics, no interpolation, so an infinite maximum stays
infinite) and a histogram over fixed log10-spaced edges, the same in every
run, so two runs' histograms can be compared bin by bin.

Every element is compared, on the device the kernel's output lives on, in
chunks of :data:`CHUNK_ELEMENTS` elements, so an output of billions of
elements needs no full-size temporary and nothing but small summaries (counts,
histograms of :data:`RADIX` bins, the worst element) travels to the host.
The quantiles are exact all the same: :func:`order_statistics` finds each
rank by radix selection on the float64 bit patterns (for non-negative
floats, ordering the bit patterns as integers orders the values): the first
16-bit digit's histogram is counted in the pass that computes the metrics,
and one more pass gathers the elements that share a rank's digit, at most
:data:`GATHER_MAX_ELEMENTS` of them, to sort (docs/reports-and-gate.md,
"Scale").
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch

from fa2_verify.core.contract import dtype_name
from fa2_verify.core.errors import GoldenError

if TYPE_CHECKING:
    from fa2_verify.core.case import CaseSpec
    from fa2_verify.verify.results import CaseResult

INF = math.inf

#: Quantile name -> probability; "max" is the largest value.
QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p99.9": 0.999, "max": 1.0}

#: Histogram edges, fixed so distributions are comparable across runs.  Bin k
#: holds values in [edges[k], edges[k+1]); the last bin also holds +inf.
NORMALIZED_EDGES: tuple[float, ...] = (0.0, *(10.0**k for k in range(-4, 4)), INF)
ULP_EDGES: tuple[float, ...] = (0.0, *(10.0**k for k in range(-2, 7)), INF)
ABS_EDGES: tuple[float, ...] = (0.0, *(10.0**k for k in range(-12, 3)), INF)
REL_EDGES: tuple[float, ...] = ABS_EDGES

#: Elements of one output whose metrics are evaluated at once: 128 MiB per
#: float64 temporary, about a dozen of them alive at a time.
CHUNK_ELEMENTS = 1 << 24

#: Bits of a float64 bit pattern resolved per pass of :func:`order_statistics`,
#: and the histogram size of one pass.
DIGIT_BITS = 16
RADIX = 1 << DIGIT_BITS

#: Most elements of one metric that radix selection gathers to sort: the
#: elements whose high digits match a rank's prefix, once there are no more
#: (:class:`_Selection`); else the next digit is histogrammed first.  Up to
#: four metrics gather at once: 512 MiB at most.
GATHER_MAX_ELEMENTS = CHUNK_ELEMENTS

#: Copies of a radix histogram that a CUDA chunk's elements are spread over (element ``e`` counted in copy
#: ``e % HISTOGRAM_LANES``, the copies summed after), while the copies stay within ``2**21`` bins: a metric's
#: values fill few of a digit's ``RADIX`` bins, whose global atomic adds serialise (on an H100 a chunk's first
#: digit took 3.6 ms in one copy and 1.3 ms in 32, lab/benchmarks-history.md).
HISTOGRAM_LANES = 32

#: Axis names of each output, for tensor paths such as ``dq[b=1, i=7, h=3, c=12]``:
#: b batch, i query position, j key position, h head (a kv head for dk/dv), c channel.
OUTPUT_AXES: dict[str, tuple[str, ...]] = {
    "out": ("b", "i", "h", "c"),
    "lse": ("b", "h", "i"),
    "dq": ("b", "i", "h", "c"),
    "dk": ("b", "j", "h", "c"),
    "dv": ("b", "j", "h", "c"),
}


def encode_float(value: float) -> float | str:
    """A float for strict JSON: finite values as numbers, others as ``"inf"``, ``"-inf"``, ``"nan"``."""
    return value if math.isfinite(value) else str(value)


def decode_float(value: float | str) -> float:
    """Inverse of :func:`encode_float`."""
    return float(value)


@dataclasses.dataclass(frozen=True)
class Distribution:
    """Nearest-rank quantiles and a fixed-edge histogram of one metric over a tensor."""

    count: int
    quantiles: dict[str, float]
    histogram: tuple[list[float], list[int]]

    @classmethod
    def of(cls, values: torch.Tensor, edges: Sequence[float]) -> "Distribution":
        """Summarize non-negative ``values`` (``+inf`` allowed, NaN not), on their device."""
        flat = values.detach().reshape(-1).to(torch.float64)

        def chunks() -> Iterator[dict[str, torch.Tensor]]:
            for start in range(0, flat.numel(), CHUNK_ELEMENTS):
                chunk = flat[start : start + CHUNK_ELEMENTS]
                if torch.isnan(chunk).any():
                    raise ValueError("a metric tensor contains NaN; metrics map NaN to +inf before summarizing")
                yield {"values": chunk.abs()}

        return summarize(chunks, {"values": edges}, flat.numel())["values"]

    def to_dict(self) -> dict[str, Any]:
        edges, counts = self.histogram
        return {
            "count": self.count,
            "quantiles": {name: encode_float(value) for name, value in self.quantiles.items()},
            "histogram": {"edges": [encode_float(edge) for edge in edges], "counts": list(counts)},
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "Distribution":
        histogram = record["histogram"]
        return cls(
            count=int(record["count"]),
            quantiles={name: decode_float(value) for name, value in record["quantiles"].items()},
            histogram=([decode_float(edge) for edge in histogram["edges"]], [int(c) for c in histogram["counts"]]),
        )


#: The verdicts beside the worst-case one, in the order their records are kept (docs/error-model.md,
#: "Statistical and local verdicts").
NOISE_VERDICTS = ("statistical", "local", "bias")


@dataclasses.dataclass(frozen=True)
class OutputComparison:
    """How one output of one case compares with the golden."""

    output: str
    dtype: str
    numel: int
    threshold: float
    normalized: Distribution
    ulp: Distribution
    abs_err: Distribution
    rel_err: Distribution
    nonfinite: int
    mismatches: int
    worst: dict[str, Any] | None
    flash_ratio: float | None
    passed: bool
    #: The statistical, local and bias verdicts' records (:mod:`verify.noise_verdicts`), None where they do not
    #: apply.
    statistical: dict[str, Any] | None = None
    local: dict[str, Any] | None = None
    bias: dict[str, Any] | None = None

    @property
    def failed_verdicts(self) -> list[str]:
        """The verdicts that failed: ``worst-case`` (a mismatch), ``statistical``, ``local``, ``bias``."""
        failed = ["worst-case"] if self.mismatches else []
        for name in NOISE_VERDICTS:
            record = getattr(self, name)
            if record is not None and record["score"] > 1:
                failed.append(name)
        return failed

    def to_dict(self) -> dict[str, Any]:
        worst = None
        if self.worst is not None:
            worst = {
                key: encode_float(value) if isinstance(value, float) else value for key, value in self.worst.items()
            }
        return {
            "output": self.output,
            "dtype": self.dtype,
            "numel": self.numel,
            "threshold": self.threshold,
            "normalized": self.normalized.to_dict(),
            "ulp": self.ulp.to_dict(),
            "abs_err": self.abs_err.to_dict(),
            "rel_err": self.rel_err.to_dict(),
            "nonfinite": self.nonfinite,
            "mismatches": self.mismatches,
            "worst": worst,
            "flash_ratio": None if self.flash_ratio is None else encode_float(self.flash_ratio),
            "passed": self.passed,
            "statistical": _encoded_record(self.statistical),
            "local": _encoded_record(self.local),
            "bias": _encoded_record(self.bias),
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "OutputComparison":
        worst = record.get("worst")
        if worst is not None:
            worst = {
                key: decode_float(value) if key in _WORST_FLOATS else value for key, value in worst.items()
            }
        ratio = record.get("flash_ratio")
        return cls(
            output=record["output"],
            dtype=record["dtype"],
            numel=int(record["numel"]),
            threshold=float(record["threshold"]),
            normalized=Distribution.from_dict(record["normalized"]),
            ulp=Distribution.from_dict(record["ulp"]),
            abs_err=Distribution.from_dict(record["abs_err"]),
            rel_err=Distribution.from_dict(record["rel_err"]),
            nonfinite=int(record["nonfinite"]),
            mismatches=int(record["mismatches"]),
            worst=worst,
            flash_ratio=None if ratio is None else decode_float(ratio),
            passed=bool(record["passed"]),
            statistical=_decoded_record(record.get("statistical")),
            local=_decoded_record(record.get("local")),
            bias=_decoded_record(record.get("bias")),
        )


def _encoded_record(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A verdict record with its floats as :func:`encode_float` writes them."""
    if record is None:
        return None
    return {key: encode_float(value) if isinstance(value, float) else value for key, value in record.items()}


def _decoded_record(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """Inverse of :func:`_encoded_record`: the score and the other numbers back to floats."""
    if record is None:
        return None
    numbers = ("score", "threshold", "r", "unit", "rms", "model_rms", "ratio", "floor", "judged", "mean",
               "model_mean", "z", "z_threshold")
    return {key: decode_float(value) if key in numbers else value for key, value in record.items()}


_WORST_FLOATS = ("actual", "expected", "abs_err", "bound", "normalized", "ulp")


def _rank(probability: float, count: int) -> int:
    """The 0-based nearest rank of ``probability`` among ``count`` sorted values: ``ceil(p n) - 1``."""
    return min(count - 1, max(0, math.ceil(probability * count) - 1))


def spread_bincount(index: torch.Tensor, bins: int, lanes: int) -> torch.Tensor:
    """``torch.bincount(index, minlength=bins)``, counted over ``lanes`` copies of the histogram (fewer while the
    copies would pass ``2**21`` bins), element ``e`` in copy ``e % lanes`` (:data:`HISTOGRAM_LANES`)."""
    while lanes > 1 and lanes * bins > 2**21:
        lanes //= 2
    if lanes <= 1:
        return torch.bincount(index, minlength=bins)
    lane = torch.arange(index.numel(), device=index.device).remainder_(lanes).mul_(bins)
    return torch.bincount(lane.add_(index), minlength=bins * lanes).view(lanes, bins).sum(0)


class _Selection:
    """Radix selection of one metric's values at given 0-based ranks in sorted order (:func:`order_statistics`).

    A non-negative float64 orders like its bit pattern read as an int64, so
    the ranks are found digit by digit (:data:`DIGIT_BITS` bits each, high to
    low): a histogram pass counts the next digit of the elements whose higher
    digits match a rank's prefix found so far, and fixes that digit of every
    rank.  Once the elements under the ranks' prefixes number at most
    :data:`GATHER_MAX_ELEMENTS`, one gather pass collects them and a sort of
    those alone gives the values; after four histogram passes the prefixes
    are the values.  Feed every chunk of a pass to :meth:`observe`, then call
    :meth:`end_pass`, until :attr:`values` is set.
    """

    def __init__(self, ranks: Sequence[int]) -> None:
        self.digits = 0
        self.prefixes = [0] * len(ranks)
        self.remaining = list(ranks)
        #: the distinct prefixes of the ranks, ascending, with the elements under each
        self.known = torch.zeros(1, dtype=torch.int64)
        self.under = [0]
        self.counts: torch.Tensor | None = None
        self.gathered: list[torch.Tensor] = []
        self.values: list[float] | None = None if ranks else []

    def _gathering(self) -> bool:
        return self.digits > 0 and sum(self.under) <= GATHER_MAX_ELEMENTS

    def _slot(self, bits: torch.Tensor, shift: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each element's slot among the known prefixes, and whether its prefix (``bits >> shift``) is that one."""
        known = self.known.to(bits.device)
        high = bits >> shift
        if self.digits == 1:
            # one digit: a table over its RADIX values, cheaper than a search
            table = torch.full((RADIX,), -1, dtype=torch.int64, device=bits.device)
            table[known] = torch.arange(len(known), device=bits.device)
            slot = table[high]
            return slot.clamp(min=0), slot >= 0
        slot = torch.searchsorted(known, high).clamp(max=len(known) - 1)
        return slot, known[slot] == high

    def observe(self, values: torch.Tensor) -> None:
        """One chunk of the pass under way."""
        if self.values is not None:
            return
        bits = values.view(torch.int64)
        if self._gathering():
            _, match = self._slot(bits, 64 - DIGIT_BITS * self.digits)
            self.gathered.append(values[match])
            return
        shift = 64 - DIGIT_BITS * (self.digits + 1)
        digits = (bits >> shift) & (RADIX - 1)
        if self.digits == 0:
            index = digits
        else:
            slot, match = self._slot(bits, shift + DIGIT_BITS)
            index = (slot * RADIX + digits)[match]
        lanes = HISTOGRAM_LANES if index.is_cuda else 1
        counts = spread_bincount(index, len(self.under) * RADIX, lanes)
        self.counts = counts if self.counts is None else self.counts + counts

    def end_pass(self) -> None:
        """Fix the next digit of every rank (after a histogram pass) or read the values (after a gather pass)."""
        if self.values is not None:
            return
        if self._gathering():
            ordered = torch.sort(torch.cat(self.gathered)).values
            self.gathered = []
            offsets = dict(zip(self.known.tolist(), itertools.accumulate([0, *self.under[:-1]])))
            at = [offsets[prefix] + rest for prefix, rest in zip(self.prefixes, self.remaining)]
            self.values = ordered[torch.tensor(at, dtype=torch.int64, device=ordered.device)].tolist()
            return
        assert self.counts is not None, "a histogram pass observes every chunk"
        table = self.counts.reshape(len(self.under), RADIX).cumsum(1).cpu()
        known = self.known.tolist()
        under: dict[int, int] = {}
        for position, prefix in enumerate(self.prefixes):
            cumulative = table[known.index(prefix)]
            digit = int(torch.searchsorted(cumulative, torch.tensor(self.remaining[position]), right=True))
            below = int(cumulative[digit - 1]) if digit else 0
            self.remaining[position] -= below
            self.prefixes[position] = (prefix << DIGIT_BITS) | digit
            under[self.prefixes[position]] = int(cumulative[digit]) - below
        self.digits += 1
        self.counts = None
        self.known = torch.tensor(sorted(under), dtype=torch.int64)
        self.under = [under[prefix] for prefix in sorted(under)]
        if self.digits * DIGIT_BITS == 64:
            self.values = torch.tensor(self.prefixes, dtype=torch.int64).view(torch.float64).tolist()


def order_statistics(
    chunks: Callable[[], Iterable[dict[str, torch.Tensor]]], ranks: Sequence[int]
) -> dict[str, list[float]]:
    """For each metric of ``chunks()``, its values at the 0-based ``ranks`` in sorted order.

    ``chunks()`` yields dicts of float64 tensors (same keys every time, every
    value non-negative, ``+inf`` allowed) and is called once per pass:
    radix selection (:class:`_Selection`), exact, on the chunks' device, with
    only the histograms and the few elements near the ranks moved to the host.
    """
    selections: dict[str, _Selection] = {}
    return _selected(chunks, selections, lambda: _Selection(ranks))


def _selected(chunks: Callable[[], Iterable[dict[str, torch.Tensor]]], selections: dict[str, _Selection],
              new: Callable[[], _Selection]) -> dict[str, list[float]]:
    """Passes over ``chunks()`` until every metric's selection (made by ``new`` where missing) has its values."""
    while not selections or any(selection.values is None for selection in selections.values()):
        for chunk in chunks():
            for name, values in chunk.items():
                selections.setdefault(name, new()).observe(values)
        if not selections:
            return {}
        for selection in selections.values():
            selection.end_pass()
    return {name: list(selection.values or []) for name, selection in selections.items()}


class Summaries:
    """The :class:`Distribution` of each metric of an output, built chunk by chunk.

    :meth:`add` each chunk once (its fixed-edge histograms and the first
    digit of the quantiles' radix selection), then :meth:`distributions`,
    which passes over the chunks again only as the selection needs (one
    gather pass, mostly).
    """

    def __init__(self, edges: Mapping[str, Sequence[float]], count: int) -> None:
        self.edges, self.count = edges, count
        ranks = [_rank(p, count) for p in QUANTILES.values()]
        self.selections = {name: _Selection(ranks) for name in edges}
        self.histograms: dict[str, torch.Tensor] = {}

    def add(self, chunk: Mapping[str, torch.Tensor]) -> None:
        for name, values in chunk.items():
            inner = torch.tensor(self.edges[name][1:-1], dtype=torch.float64, device=values.device)
            counts = torch.bincount(torch.bucketize(values, inner, right=True), minlength=len(self.edges[name]) - 1)
            self.histograms[name] = counts if name not in self.histograms else self.histograms[name] + counts
            self.selections[name].observe(values)

    def distributions(self, chunks: Callable[[], Iterable[dict[str, torch.Tensor]]]) -> dict[str, Distribution]:
        """The distributions, ``chunks()`` yielding the chunks :meth:`add` saw, in the same order."""
        if self.count == 0:
            return {
                name: Distribution(count=0, quantiles={q: 0.0 for q in QUANTILES},
                                   histogram=(list(e), [0] * (len(e) - 1)))
                for name, e in self.edges.items()
            }
        for selection in self.selections.values():
            selection.end_pass()
        selected = _selected(chunks, self.selections, lambda: _Selection([]))
        return {
            name: Distribution(
                count=self.count,
                quantiles=dict(zip(QUANTILES, selected[name])),
                histogram=(list(self.edges[name]), self.histograms[name].tolist()),
            )
            for name in self.edges
        }


def summarize(
    chunks: Callable[[], Iterable[dict[str, torch.Tensor]]], edges: Mapping[str, Sequence[float]], count: int
) -> dict[str, Distribution]:
    """A :class:`Distribution` per metric of ``chunks()``, ``count`` values each (:class:`Summaries`)."""
    summaries = Summaries(edges, count)
    if count:
        for chunk in chunks():
            summaries.add(chunk)
    return summaries.distributions(chunks)


def ulp(expected: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float64 gap between consecutive ``dtype`` numbers at ``expected`` rounded to ``dtype``.

    For ``|x|`` in ``[2^(e-1), 2^e)`` with ``x`` normal the gap is
    ``2^(e-1) * eps``; for zero and subnormals it is the smallest subnormal
    ``smallest_normal * eps``; a value beyond the dtype's range uses the gap
    at its largest finite number.
    """
    info = torch.finfo(dtype)
    rounded = expected.to(dtype).to(torch.float64).abs().clamp(max=info.max)
    _, exponent = torch.frexp(rounded)
    gap = torch.ldexp(torch.full_like(rounded, info.eps), exponent - 1)
    smallest_subnormal = info.smallest_normal * info.eps
    return torch.where(rounded < info.smallest_normal, torch.full_like(rounded, smallest_subnormal), gap)


def _errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(abs_err, finite_expected, bad)``: float64 errors with the non-finite rules applied.

    ``bad`` marks NaN/Inf where the golden is finite, and anything but an
    infinity where the golden is infinite; those elements get ``abs_err = inf``.
    Matching infinities (either sign) get 0.
    """
    finite_expected = torch.isfinite(expected)
    bad = (finite_expected & ~torch.isfinite(actual)) | (~finite_expected & ~torch.isinf(actual))
    abs_err = (actual - expected).abs()
    abs_err = torch.where(finite_expected, abs_err, torch.zeros_like(abs_err))
    abs_err = torch.where(bad, torch.full_like(abs_err, INF), abs_err)
    return abs_err, finite_expected, bad


def _scaled(
    abs_err: torch.Tensor, scale: torch.Tensor, finite_expected: torch.Tensor, bad: torch.Tensor
) -> torch.Tensor:
    """``abs_err / scale`` where the golden is finite (``0/0 = 0``, ``x/0 = inf``); inf where ``bad``; else 0."""
    ratio = abs_err / scale
    ratio = torch.where(abs_err == 0, torch.zeros_like(ratio), ratio)
    ratio = torch.where(finite_expected, ratio, torch.zeros_like(ratio))
    return torch.where(bad, torch.full_like(ratio, INF), ratio)


def tensor_path(output: str, index: Sequence[int]) -> str:
    """``dq[b=1, i=7, h=3, c=12]`` for ``index`` into ``output``."""
    axes = OUTPUT_AXES.get(output, tuple(f"d{n}" for n in range(len(index))))
    return f"{output}[{', '.join(f'{axis}={position}' for axis, position in zip(axes, index))}]"


def _spans(numel: int) -> range:
    return range(0, numel, CHUNK_ELEMENTS)


def _max_abs_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected|`` under the non-finite rules, chunk by chunk on ``actual``'s device."""
    flat_actual, flat_expected = actual.reshape(-1), expected.reshape(-1)
    largest = 0.0
    for start in _spans(flat_expected.numel()):
        span = slice(start, start + CHUNK_ELEMENTS)
        chunk_expected = flat_expected[span].to(flat_actual.device, torch.float64)
        abs_err = _errors(flat_actual[span].to(torch.float64), chunk_expected)[0]
        largest = max(largest, float(abs_err.max()))
    return largest


def flash_ratio(actual: torch.Tensor, expected: torch.Tensor, lowprec: torch.Tensor, *,
                largest_error: float | None = None) -> float:
    """``max|actual - expected| / max|lowprec - expected|`` (docs/error-model.md, "Flash-attn ratio").

    ``lowprec`` is the same attention computed naively in the case dtype
    (:mod:`verify.lowprec`).  Reported beside the normalized error, never
    gating.  ``0/0 = 0`` and ``x/0 = inf``.  ``largest_error``, where the
    caller has it (the ``abs_err`` maximum of :func:`compare`), is the numerator.
    """
    numerator = _max_abs_error(actual, expected) if largest_error is None else largest_error
    denominator = _max_abs_error(lowprec.to(actual.device), expected)
    if denominator == 0.0:
        return 0.0 if numerator == 0.0 else INF
    return numerator / denominator


#: The metric distributions of an :class:`OutputComparison` and their histogram edges.
METRIC_EDGES: dict[str, tuple[float, ...]] = {
    "normalized": NORMALIZED_EDGES,
    "ulp": ULP_EDGES,
    "abs_err": ABS_EDGES,
    "rel_err": REL_EDGES,
}


@dataclasses.dataclass(frozen=True)
class _Chunk:
    """The metrics of one chunk of an output's elements (float64, on the output's device)."""

    actual: torch.Tensor
    abs_err: torch.Tensor
    finite_expected: torch.Tensor
    bad: torch.Tensor
    metrics: dict[str, torch.Tensor]


def _chunk(output: str, actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, dtype: torch.dtype) -> _Chunk:
    """Errors of one chunk; a NaN golden or a bound that is not positive and finite where it must be is raised."""
    if torch.isnan(expected).any():
        raise GoldenError(f"the golden {output} contains NaN: the golden itself failed for this case")
    actual64 = actual.to(torch.float64)
    abs_err, finite_expected, bad = _errors(actual64, expected)
    used = torch.where(finite_expected, bound, torch.ones_like(bound))
    if not bool(((used > 0) & torch.isfinite(used)).all()):
        raise ValueError(f"{output}: the error bound must be positive and finite wherever the golden is finite")
    metrics = {
        "normalized": _scaled(abs_err, bound, finite_expected, bad),
        "ulp": _scaled(abs_err, ulp(expected, dtype), finite_expected, bad),
        "abs_err": abs_err,
        "rel_err": _scaled(abs_err, expected.abs(), finite_expected, bad),
    }
    return _Chunk(actual64, abs_err, finite_expected, bad, metrics)


def compare(
    output: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    bound: torch.Tensor,
    *,
    threshold: float,
    lowprec: torch.Tensor | None = None,
) -> OutputComparison:
    """Compare ``actual`` (the kernel's, in its output dtype) with ``expected`` (golden, float64).

    ``bound`` is the first-order bound of :func:`verify.error_model.first_order_bounds`
    (positive and finite wherever the golden is finite, else a ``ValueError``:
    a bug in fa2-verify, not in the kernel); an element mismatches when
    ``|actual - expected| / bound > threshold`` or when it breaks the
    non-finite rules of the module docstring.  Every element is compared on
    ``actual``'s device, :data:`CHUNK_ELEMENTS` at a time; ``expected`` and
    ``bound`` are moved there if they live elsewhere.
    """
    if actual.shape != expected.shape or bound.shape != expected.shape:
        raise ValueError(
            f"{output}: shapes differ: actual {tuple(actual.shape)}, expected {tuple(expected.shape)}, "
            f"bound {tuple(bound.shape)}"
        )
    dtype = actual.dtype
    device = actual.device
    flat_actual = actual.detach().reshape(-1)
    flat_expected = expected.detach().to(device, torch.float64).reshape(-1)
    flat_bound = bound.detach().to(device, torch.float64).reshape(-1)
    numel = flat_expected.numel()

    def chunks() -> Iterator[tuple[int, _Chunk]]:
        for start in _spans(numel):
            span = slice(start, start + CHUNK_ELEMENTS)
            yield start, _chunk(output, flat_actual[span], flat_expected[span], flat_bound[span], dtype)

    # one pass computes the metrics; an output of one chunk keeps them for the quantiles' second pass
    summaries = Summaries(METRIC_EDGES, numel)
    kept: list[dict[str, torch.Tensor]] = []
    mismatches = nonfinite = 0
    worst_at, worst_value = 0, -1.0
    for start, chunk in chunks():
        normalized = chunk.metrics["normalized"]
        mismatches += int(((normalized > threshold) | chunk.bad).sum())
        nonfinite += int((chunk.finite_expected & ~torch.isfinite(chunk.actual)).sum())
        position = int(torch.argmax(normalized))
        if float(normalized[position]) > worst_value:
            worst_at, worst_value = start + position, float(normalized[position])
        summaries.add(chunk.metrics)
        if numel <= CHUNK_ELEMENTS:
            kept.append(chunk.metrics)
    distributions = summaries.distributions(
        (lambda: iter(kept)) if kept else (lambda: (chunk.metrics for _, chunk in chunks()))
    )
    worst = None
    if numel:
        element = _chunk(
            output,
            flat_actual[worst_at : worst_at + 1],
            flat_expected[worst_at : worst_at + 1],
            flat_bound[worst_at : worst_at + 1],
            dtype,
        )
        index = [int(i) for i in torch.unravel_index(torch.tensor(worst_at), expected.shape)]
        worst = {
            "index": index,
            "path": tensor_path(output, index),
            "actual": float(element.actual[0]),
            "expected": float(flat_expected[worst_at]),
            "abs_err": float(element.abs_err[0]),
            "bound": float(flat_bound[worst_at]),
            "normalized": float(element.metrics["normalized"][0]),
            "ulp": float(element.metrics["ulp"][0]),
        }
    return OutputComparison(
        output=output,
        dtype=dtype_name(dtype),
        numel=numel,
        threshold=threshold,
        normalized=distributions["normalized"],
        ulp=distributions["ulp"],
        abs_err=distributions["abs_err"],
        rel_err=distributions["rel_err"],
        nonfinite=nonfinite,
        mismatches=mismatches,
        worst=worst,
        flash_ratio=None if lowprec is None else flash_ratio(
            flat_actual, flat_expected, lowprec.detach(), largest_error=distributions["abs_err"].quantiles["max"]
        ),
        passed=mismatches == 0,
    )


def _number(value: float) -> str:
    return f"{value:.6g}"


#: The axis of each output that indexes query rows (``out``, ``dq``, ``lse``) or keys (``dk``, ``dv``).
_TOKEN_AXIS = {"out": 1, "dq": 1, "lse": 2, "dk": 1, "dv": 1}


def masked_element(spec: "CaseSpec", output: str, index: Sequence[int]) -> str | None:
    """Why element ``index`` of ``output`` is exact whatever the inputs, when its query row sees no key, or
    its key is seen by no query, under the case's mask (:meth:`core.case.CaseSpec.visible_ranges`);
    else None.

    There the exact value is ``out = dq = 0`` and ``lse = -inf`` (no key: an
    empty sum, Algorithm 1 with ``l = 0``), or ``dk = dv = 0`` (no query's
    ``P`` reaches the key), and its bound is at most the smallest subnormal
    (docs/error-model.md), so any other value is a mask
    error, whatever its size (e.g. a kernel that lets the row see keys the mask
    hides).  Spelling that out keeps a 1-ULP difference there, between two runs
    of a metamorphic relation, from reading as an over-tight tolerance.
    """
    axis = _TOKEN_AXIS.get(output)
    if axis is None or len(index) <= axis:
        return None
    token = index[axis]
    first, last = spec.visible_ranges()
    if output in ("dk", "dv"):
        if token >= spec.seqlen_k or bool(((first <= token) & (token <= last)).any()):
            return None
        return (f"key {token} is seen by no query under the case's mask, so its dk and dv "
                "are exactly 0 whatever the inputs: any other value there is wrong, however small")
    if token >= spec.seqlen_q or first[token] <= last[token]:
        return None
    return (f"query row {token} sees no key under the case's mask, so its out and dq are "
            "exactly 0 and its lse -inf whatever the inputs: any other value there is wrong, however small")


def _noise_verdict_lines(comparison: OutputComparison) -> list[str]:
    """The failed statistical, local and bias verdicts of ``comparison``, a line each (docs/error-model.md,
    "Statistical and local verdicts")."""
    lines = []
    stat, local, bias = comparison.statistical, comparison.local, comparison.bias
    if stat is not None and stat["score"] > 1:
        lines.append(
            f"  statistical: {stat['path']}: error {_number(stat['r'])} noise units (threshold "
            f"{_number(stat['threshold'])}); a unit is the model kernel's largest rounding error in "
            f"{stat['tile']} plus the element's own rounding, here {_number(stat['unit'])}"
        )
    if local is not None and local["score"] > 1:
        lines.append(
            f"  local: {local['group']}: RMS error {_number(local['rms'])} noise units where the model kernel's "
            f"is {_number(local['model_rms'])} (limit {_number(local['ratio'])} x max(model's, "
            f"{_number(local['floor'])}))"
        )
        others = [f"{kind} {name}" for kind, name in local["flagged"].items() if kind != local["kind"]]
        if others:
            lines.append(f"  also out of line: {'; '.join(others)}")
    if bias is not None and bias["score"] > 1:
        lines.append(
            f"  bias: {bias['group']}: errors lean one way, mean {_number(bias['mean'])} noise units in the "
            f"golden's direction where the model kernel's is {_number(bias['model_mean'])} (limit "
            f"{_number(bias['ratio'])} x max(model's, {_number(bias['floor'])})), self-normalized sum "
            f"{_number(bias['z'])} (threshold {_number(bias['z_threshold'])})"
        )
    return lines


def describe_failure(result: "CaseResult", output: str | None = None) -> str:
    """The one failure message: what failed, where, by how much, and how to reproduce it.

    For a compared ``output``: the tensor path of the worst element (always a
    real mismatch when the output failed, since it has the largest normalized
    error), the mismatch count out of numel, actual vs expected, its
    normalized error vs the threshold and its ULP distance, then the case spec
    and the reproduction line.  Without a comparison (status ``error`` or
    ``unsupported``) it gives the reason instead.
    """
    spec = result.spec
    lines = []
    comparison = result.comparisons.get(output) if output is not None else None
    if comparison is None:
        subject = f"case {spec.name or '(unnamed)'}"
        lines.append(f"{result.kernel} on {result.device}: {subject} {result.status}: {result.reason}")
    else:
        assert output is not None, "a comparison is looked up only for a named output"
        share = 100.0 * comparison.mismatches / comparison.numel if comparison.numel else 0.0
        head = (
            f"{result.kernel} on {result.device}: {output} ({comparison.dtype}) mismatches the golden in "
            f"{comparison.mismatches} of {comparison.numel} elements ({share:.3g}%)"
        )
        if not comparison.mismatches:
            failed = " and ".join(comparison.failed_verdicts)
            head = (f"{result.kernel} on {result.device}: {output} ({comparison.dtype}) is within the worst-case "
                    f"bounds but fails the {failed} verdict: its errors are inconsistent with rounding")
        if comparison.nonfinite:
            head += f", {comparison.nonfinite} of them NaN/Inf where the golden is finite"
        lines.append(head)
        worst = comparison.worst
        if worst is not None:
            lines.append(
                f"  worst: {worst['path']}: actual={_number(worst['actual'])} expected={_number(worst['expected'])} "
                f"|diff|={_number(worst['abs_err'])} bound={_number(worst['bound'])} "
                f"normalized error {_number(worst['normalized'])} (threshold {_number(comparison.threshold)}), "
                f"{_number(worst['ulp'])} ULP in {comparison.dtype}"
            )
            masked = masked_element(spec, output, worst["index"])
            if masked is not None:
                lines.append(f"  {masked}")
        lines.extend(_noise_verdict_lines(comparison))
        quantiles = comparison.normalized.quantiles
        lines.append(
            "  normalized error: "
            + " ".join(f"{name}={_number(quantiles[name])}" for name in ("p50", "p99", "max"))
            + " (docs/error-model.md)"
        )
    lines.append(f"  case: {json.dumps(spec.to_dict(), sort_keys=True)}")
    if result.packed is not None:
        lines.append("  a sequence of a packed batch, checked through the varlen entry points")
    lines.append(f"  reproduce: {result.reproduction()}")
    return "\n".join(lines)
