"""PNG histograms of error distributions, for Allure attachments and reports.

A figure shows one output (``out``, ``lse``, ``dq``, ``dk`` or ``dv``) with two
panels: the normalized error (error over its first-order rounding bound,
docs/error-model.md) and the ULP distance in the output dtype.  The bars are
the fixed log10 bins of :mod:`verify.metrics` (one decade each), summed over
the cases given, so two figures of the same output are comparable bar by bar.
Normalized-error bins at or above the output's threshold are drawn in red.

matplotlib is imported when a figure is drawn, not when this module is.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fa2_verify.records.report_json import max_quantiles, merge_histograms

if TYPE_CHECKING:
    from fa2_verify.verify.metrics import Distribution, OutputComparison

_BELOW = "#3b75af"
_ABOVE = "#c0392b"


def _edge(value: float) -> str:
    """``1e-4`` for a power of ten, else the value in ``%g``."""
    exponent = round(math.log10(value))
    return f"1e{exponent}" if math.isclose(value, 10.0**exponent) else f"{value:g}"


def bin_labels(edges: Sequence[float]) -> list[str]:
    """``["<1e-4", "1e-4..1e-3", ..., ">=1e3"]`` for edges ``[0, 1e-4, ..., 1e3, inf]``."""
    labels = []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        if low == 0.0:
            labels.append(f"<{_edge(high)}")
        elif math.isinf(high):
            labels.append(f">={_edge(low)}")
        else:
            labels.append(f"{_edge(low)}..{_edge(high)}")
    return labels


def _position(edges: Sequence[float], value: float) -> float:
    """Where ``value`` falls on the bar axis (bar k is centred at k), log-interpolated inside its bin."""
    for k, (low, high) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        if low <= value < high:
            if low > 0 and math.isfinite(high):
                return k - 0.5 + math.log(value / low) / math.log(high / low)
            return float(k)
    return len(edges) - 1.5


def _panel(axes, distributions: Sequence[Distribution], *, title: str, threshold: float | None) -> None:
    edges, counts = merge_histograms(distributions)
    colors = [_ABOVE if threshold is not None and high > threshold else _BELOW for high in edges[1:]]
    positions = range(len(counts))
    axes.bar(positions, counts, color=colors, width=0.85)
    axes.set_xticks(list(positions), bin_labels(edges), rotation=45, ha="right", fontsize=7)
    axes.set_yscale("symlog", linthresh=1)
    axes.set_ylim(0, 3 * max(max(counts), 1))
    if threshold is not None:
        axes.axvline(_position(edges, threshold), color=_ABOVE, linestyle="--", linewidth=1)
    axes.set_ylabel("elements")
    quantiles = max_quantiles(distributions)
    summary = "  ".join(f"{name}={quantiles[name]:.3g}" for name in ("p50", "p99", "max"))
    axes.set_title(f"{title}\n{summary}", fontsize=9)


def histogram_png(output: str, comparisons: Sequence[OutputComparison], *, title: str = "") -> bytes:
    """A PNG of the normalized-error and ULP histograms of ``output`` over ``comparisons``.

    ``comparisons`` are one output's :class:`~verify.metrics.OutputComparison`
    from any number of cases; quantiles shown are the largest per-case value.
    """
    if not comparisons:
        raise ValueError(f"histogram_png({output!r}) needs at least one comparison")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    elements = sum(c.numel for c in comparisons)
    dtypes = ",".join(sorted({c.dtype for c in comparisons}))
    figure = Figure(figsize=(9, 3.6), dpi=100, layout="constrained")
    normalized_axes, ulp_axes = figure.subplots(1, 2)
    threshold = max(c.threshold for c in comparisons)
    _panel(
        normalized_axes,
        [c.normalized for c in comparisons],
        title=f"{output}: normalized error (threshold {threshold:g})",
        threshold=threshold,
    )
    ulp_unit = "float32" if output == "lse" else dtypes
    _panel(ulp_axes, [c.ulp for c in comparisons], title=f"{output}: ULP distance ({ulp_unit})", threshold=None)
    heading = f"{title}: " if title else ""
    figure.suptitle(f"{heading}{output} over {len(comparisons)} case(s), {elements} elements ({dtypes})", fontsize=10)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
