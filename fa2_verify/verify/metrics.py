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
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING, Any, Sequence

import torch

from fa2_verify.core.contract import dtype_name
from fa2_verify.core.errors import GoldenError

if TYPE_CHECKING:
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
        """Summarize non-negative ``values`` (``+inf`` allowed, NaN not)."""
        flat = values.detach().reshape(-1).to(torch.float64)
        if torch.isnan(flat).any():
            raise ValueError("a metric tensor contains NaN; metrics map NaN to +inf before summarizing")
        count = flat.numel()
        if count == 0:
            quantiles = {name: 0.0 for name in QUANTILES}
            counts = [0] * (len(edges) - 1)
        else:
            ordered = torch.sort(flat).values
            quantiles = {
                name: float(ordered[min(count - 1, max(0, math.ceil(p * count) - 1))]) for name, p in QUANTILES.items()
            }
            inner = torch.tensor(edges[1:-1], dtype=torch.float64)
            bins = torch.bucketize(flat, inner, right=True)
            counts = torch.bincount(bins, minlength=len(edges) - 1).tolist()
        return cls(count=count, quantiles=quantiles, histogram=(list(edges), counts))

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
        )


_WORST_FLOATS = ("actual", "expected", "abs_err", "bound", "normalized", "ulp")


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


def flash_ratio(actual: torch.Tensor, expected: torch.Tensor, lowprec: torch.Tensor) -> float:
    """``max|actual - expected| / max|lowprec - expected|`` (docs/error-model.md, "Flash-attn ratio").

    ``lowprec`` is the same attention computed naively in the case dtype
    (:mod:`verify.lowprec`).  Reported beside the normalized error, never
    gating.  ``0/0 = 0`` and ``x/0 = inf``.
    """
    numerator = float(_errors(actual.to(torch.float64), expected)[0].max()) if expected.numel() else 0.0
    denominator = float(_errors(lowprec.to(torch.float64), expected)[0].max()) if expected.numel() else 0.0
    if denominator == 0.0:
        return 0.0 if numerator == 0.0 else INF
    return numerator / denominator


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
    non-finite rules of the module docstring.
    """
    if actual.shape != expected.shape or bound.shape != expected.shape:
        raise ValueError(
            f"{output}: shapes differ: actual {tuple(actual.shape)}, expected {tuple(expected.shape)}, "
            f"bound {tuple(bound.shape)}"
        )
    dtype = actual.dtype
    expected = expected.detach().to("cpu", torch.float64)
    if torch.isnan(expected).any():
        raise GoldenError(f"the golden {output} contains NaN: the golden itself failed for this case")
    actual64 = actual.detach().to("cpu", torch.float64)
    bound = bound.detach().to("cpu", torch.float64)
    abs_err, finite_expected, bad = _errors(actual64, expected)
    used = bound[finite_expected]
    if not bool(((used > 0) & torch.isfinite(used)).all()):
        raise ValueError(f"{output}: the error bound must be positive and finite wherever the golden is finite")
    normalized = _scaled(abs_err, bound, finite_expected, bad)
    ulps = _scaled(abs_err, ulp(expected, dtype), finite_expected, bad)
    rel_err = _scaled(abs_err, expected.abs(), finite_expected, bad)
    mismatch = (normalized > threshold) | bad
    worst = None
    if expected.numel():
        flat = int(torch.argmax(normalized))
        index = [int(i) for i in torch.unravel_index(torch.tensor(flat), expected.shape)]
        worst = {
            "index": index,
            "path": tensor_path(output, index),
            "actual": float(actual64.reshape(-1)[flat]),
            "expected": float(expected.reshape(-1)[flat]),
            "abs_err": float(abs_err.reshape(-1)[flat]),
            "bound": float(bound.reshape(-1)[flat]),
            "normalized": float(normalized.reshape(-1)[flat]),
            "ulp": float(ulps.reshape(-1)[flat]),
        }
    mismatches = int(mismatch.sum())
    return OutputComparison(
        output=output,
        dtype=dtype_name(dtype),
        numel=expected.numel(),
        threshold=threshold,
        normalized=Distribution.of(normalized, NORMALIZED_EDGES),
        ulp=Distribution.of(ulps, ULP_EDGES),
        abs_err=Distribution.of(abs_err, ABS_EDGES),
        rel_err=Distribution.of(rel_err, REL_EDGES),
        nonfinite=int((finite_expected & ~torch.isfinite(actual64)).sum()),
        mismatches=mismatches,
        worst=worst,
        flash_ratio=None if lowprec is None else flash_ratio(actual64, expected, lowprec.detach().cpu()),
        passed=mismatches == 0,
    )


def _number(value: float) -> str:
    return f"{value:.6g}"


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
        share = 100.0 * comparison.mismatches / comparison.numel if comparison.numel else 0.0
        head = (
            f"{result.kernel} on {result.device}: {output} ({comparison.dtype}) mismatches the golden in "
            f"{comparison.mismatches} of {comparison.numel} elements ({share:.3g}%)"
        )
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
        quantiles = comparison.normalized.quantiles
        lines.append(
            "  normalized error: "
            + " ".join(f"{name}={_number(quantiles[name])}" for name in ("p50", "p99", "max"))
            + " (docs/error-model.md)"
        )
    lines.append(f"  case: {json.dumps(spec.to_dict(), sort_keys=True)}")
    lines.append(f"  reproduce: {spec.reproduction(result.kernel)}")
    return "\n".join(lines)
