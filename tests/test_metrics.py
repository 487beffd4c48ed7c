"""fa2_verify.verify.metrics on hand-made tensors: ULPs, distributions, non-finite rules, the worst element, messages."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fa2_verify.core.case import CaseSpec
from fa2_verify.verify import metrics
from fa2_verify.verify.metrics import (
    NORMALIZED_EDGES,
    Distribution,
    OutputComparison,
    compare,
    describe_failure,
    flash_ratio,
    order_statistics,
    summarize,
    tensor_path,
    ulp,
)
from fa2_verify.verify.results import CaseResult

INF = math.inf


def _compare(actual, expected, bound=1.0, *, dtype=torch.float16, output="out", threshold=1.0):
    actual = torch.tensor(actual, dtype=torch.float64).to(dtype)
    expected = torch.tensor(expected, dtype=torch.float64)
    bound = torch.full_like(expected, bound) if isinstance(bound, float) else torch.tensor(bound, dtype=torch.float64)
    return compare(output, actual, expected, bound, threshold=threshold)


@pytest.mark.parametrize(
    "dtype, value, expected_ulp",
    [
        (torch.float16, 1.0, 2.0**-10),
        (torch.float16, 1.999, 2.0**-10),
        (torch.float16, 0.75, 2.0**-11),
        (torch.float16, -3.0, 2.0**-9),
        (torch.float16, 2.0**-14, 2.0**-24),  # smallest normal
        (torch.float16, 2.0**-20, 2.0**-24),  # subnormal
        (torch.float16, 0.0, 2.0**-24),
        (torch.float16, 1e6, 32.0),  # beyond the range: the gap at the largest finite number
        (torch.bfloat16, 1.0, 2.0**-7),
        (torch.bfloat16, 0.0, 2.0**-133),
        (torch.float32, 1.0, 2.0**-23),
        (torch.float32, 2.0**-130, 2.0**-149),
        (torch.float32, 0.0, 2.0**-149),
    ],
)
def test_ulp_is_the_gap_of_the_dtype(dtype, value, expected_ulp):
    assert ulp(torch.tensor([value], dtype=torch.float64), dtype).item() == expected_ulp


def test_ulp_uses_the_expected_value_rounded_to_the_dtype():
    # 1 - 2^-13 rounds to 1.0 in float16, whose gap is 2^-10 (not 2^-11).
    assert ulp(torch.tensor([1 - 2.0**-13], dtype=torch.float64), torch.float16).item() == 2.0**-10


@pytest.mark.parametrize(
    "dtype, actual, expected, ulps",
    [
        (torch.float16, 1 + 2.0**-10, 1.0, 1.0),
        (torch.float16, 2 * 2.0**-24, 2.0**-24, 1.0),
        (torch.float16, 2.0**-24, 0.0, 1.0),
        (torch.float16, -(2.0**-24), 0.0, 1.0),
        (torch.bfloat16, 1 + 3 * 2.0**-7, 1.0, 3.0),
        (torch.float32, 1 + 2.0**-23, 1.0, 1.0),
        (torch.float32, 3 * 2.0**-149, 2.0**-149, 2.0),
        (torch.float16, INF, 1.0, INF),
    ],
)
def test_ulp_distance_in_the_output_dtype(dtype, actual, expected, ulps):
    comparison = _compare([actual], [expected], 1e9, dtype=dtype)
    assert comparison.ulp.quantiles["max"] == ulps


def test_nearest_rank_quantiles():
    distribution = Distribution.of(torch.arange(1, 1001, dtype=torch.float64), NORMALIZED_EDGES)
    assert distribution.count == 1000
    assert distribution.quantiles == {"p50": 500.0, "p90": 900.0, "p99": 990.0, "p99.9": 999.0, "max": 1000.0}


@pytest.mark.parametrize("gather_max", [1, 40, 10**6])
@pytest.mark.parametrize("size", [3037, 3038])
def test_radix_selection_equals_sorting_with_ties(monkeypatch, size, gather_max):
    """Radix selection gives the sorted values at every rank, ties, zeros, subnormals and infinities included,
    for odd and even sizes, whether it gathers after the first digit, after more, or never (four digits)."""
    monkeypatch.setattr(metrics, "GATHER_MAX_ELEMENTS", gather_max)
    generator = torch.Generator().manual_seed(size)
    values = torch.cat([torch.rand(size - 38, generator=generator, dtype=torch.float64) ** 7 * 1e3,
                        torch.zeros(30, dtype=torch.float64), torch.full((4,), INF, dtype=torch.float64),
                        torch.tensor([2.0**-1074, 2.0**-1074, 1.0, 1.0], dtype=torch.float64)])
    values = values[torch.randperm(len(values), generator=generator)]
    ties = torch.randint(0, 3, (size,), generator=generator, dtype=torch.float64) * 0.5
    chunks = lambda: ({"v": chunk, "ties": tie} for chunk, tie in zip(values.split(700), ties.split(700)))
    ranks = [metrics._rank(p, size) for p in metrics.QUANTILES.values()] + [0, 29, 30, 31, size - 6, size - 4]
    selected = order_statistics(chunks, ranks)
    for name, tensor in (("v", values), ("ties", ties)):
        ordered = torch.sort(tensor).values
        assert selected[name] == [float(ordered[r]) for r in ranks]
        # the nearest-rank median, ceil(n / 2) - 1, is torch.quantile's "lower" one for odd and even n
        assert selected[name][0] == float(torch.quantile(tensor, 0.5, interpolation="lower"))


def test_compare_computes_each_chunks_metrics_once_for_the_quantiles(monkeypatch):
    """One pass computes an output's metrics, histograms and the quantiles' first digit; the quantiles take at
    most one more (none for an output of one chunk, whose metrics are kept), then the worst element's."""
    calls = []
    chunk = metrics._chunk
    monkeypatch.setattr(metrics, "_chunk", lambda *args: calls.append(args[1].numel()) or chunk(*args))
    generator = torch.Generator().manual_seed(3)
    expected = torch.randn(5000, generator=generator, dtype=torch.float64)
    actual, bound = expected.to(torch.float16), torch.full_like(expected, 2.0**-11)
    whole = compare("out", actual, expected, bound, threshold=1.0)
    assert calls == [5000, 1]
    calls.clear()
    monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 1024)
    assert compare("out", actual, expected, bound, threshold=1.0) == whole
    assert len(calls) == 2 * 5 + 1


def test_quantiles_keep_an_infinite_maximum():
    distribution = Distribution.of(torch.tensor([0.1, 0.2, INF], dtype=torch.float64), NORMALIZED_EDGES)
    assert distribution.quantiles["max"] == INF
    assert distribution.quantiles["p50"] == 0.2


def test_histogram_has_fixed_edges_and_counts_every_value():
    values = torch.tensor([0.0, 5e-5, 1e-4, 0.5, 1.0, 999.0, 1000.0, INF], dtype=torch.float64)
    edges, counts = Distribution.of(values, NORMALIZED_EDGES).histogram
    assert edges == list(NORMALIZED_EDGES)
    # bins: [0,1e-4) [1e-4,1e-3) [1e-3,1e-2) [1e-2,0.1) [0.1,1) [1,10) [10,100) [100,1000) [1000,inf]
    assert counts == [2, 1, 0, 0, 1, 1, 0, 1, 2]


def test_distribution_refuses_nan():
    with pytest.raises(ValueError, match="NaN"):
        Distribution.of(torch.tensor([math.nan]), NORMALIZED_EDGES)


def test_empty_output_has_an_empty_distribution():
    comparison = _compare([], [])
    assert comparison.passed and comparison.numel == 0 and comparison.worst is None
    assert comparison.normalized.quantiles["max"] == 0.0


@pytest.mark.parametrize("bad", [math.nan, INF, -INF])
def test_nan_or_inf_where_the_golden_is_finite_never_passes(bad):
    comparison = _compare([1.0, bad, 1.0], [1.0, 1.0, 1.0], 1e30)
    assert not comparison.passed
    assert comparison.nonfinite == 1 and comparison.mismatches == 1
    assert comparison.worst["index"] == [1]
    assert comparison.normalized.quantiles["max"] == INF


@pytest.mark.parametrize("actual", [INF, -INF])
def test_matching_infinities_are_exact_either_sign(actual):
    comparison = _compare([actual, 2.0], [-INF, 2.0], 1.0, dtype=torch.float32, output="lse")
    assert comparison.passed and comparison.nonfinite == 0
    assert comparison.normalized.quantiles["max"] == 0.0


@pytest.mark.parametrize("actual", [math.nan, 0.0, -1e30])
def test_anything_but_an_infinity_fails_where_the_golden_is_infinite(actual):
    comparison = _compare([actual], [-INF], 1.0, dtype=torch.float32, output="lse")
    assert not comparison.passed and comparison.mismatches == 1


def test_threshold_decides_the_mismatch():
    passing = _compare([1.0 + 2.0**-10], [1.0], 2.0**-10)
    failing = _compare([1.0 + 2.0**-9], [1.0], 2.0**-10)
    assert passing.passed and passing.normalized.quantiles["max"] == 1.0
    assert not failing.passed and failing.normalized.quantiles["max"] == 2.0


def test_worst_element_is_a_real_mismatch():
    # Element 0 has the largest absolute error but a large bound; element 2 is the real worst mismatch.
    actual = [2.0, 1.0, 1.0 + 2.0**-8, 1.0 + 2.0**-9]
    comparison = _compare(actual, [1.0, 1.0, 1.0, 1.0], [10.0, 1.0, 2.0**-10, 2.0**-10])
    assert comparison.mismatches == 2
    assert comparison.worst["index"] == [2]
    assert comparison.worst["normalized"] == 4.0
    assert comparison.worst["normalized"] > comparison.threshold


def test_relative_error_of_an_exact_zero():
    comparison = _compare([0.0, 2.0**-24], [0.0, 0.0], 1.0)
    assert comparison.rel_err.quantiles["p50"] == 0.0 and comparison.rel_err.quantiles["max"] == INF


def test_a_nan_golden_is_an_error_of_the_harness():
    from fa2_verify.core.errors import GoldenError

    with pytest.raises(GoldenError, match="golden out contains NaN"):
        _compare([1.0], [math.nan])


@pytest.mark.parametrize("bound", [0.0, INF, math.nan])
def test_a_zero_or_non_finite_bound_is_an_error_of_the_harness(bound):
    with pytest.raises(ValueError, match="bound must be positive and finite"):
        _compare([1.0], [1.0], bound)


def test_tensor_path_names_the_axes():
    assert tensor_path("dq", (1, 7, 3, 12)) == "dq[b=1, i=7, h=3, c=12]"
    assert tensor_path("lse", (0, 2, 5)) == "lse[b=0, h=2, i=5]"
    assert tensor_path("dk", (0, 4, 1, 0)) == "dk[b=0, j=4, h=1, c=0]"


def test_flash_ratio_conventions():
    expected = torch.tensor([1.0, 2.0], dtype=torch.float64)
    same = expected.to(torch.float16)
    off = torch.tensor([1.0, 2.0 + 2.0**-9], dtype=torch.float16)
    assert flash_ratio(same, expected, same) == 0.0
    assert flash_ratio(off, expected, same) == INF
    assert flash_ratio(off, expected, torch.tensor([1.0, 2.0 - 2.0**-8], dtype=torch.float16)) == 0.5


def test_comparison_round_trips_through_strict_json():
    comparison = _compare([1.0, math.nan], [1.0, 1.0], 2.0**-10)
    text = json.dumps(comparison.to_dict(), allow_nan=False)
    restored = OutputComparison.from_dict(json.loads(text))
    assert math.isnan(restored.worst["actual"])
    assert restored.to_dict() == comparison.to_dict()


def _failed_result() -> CaseResult:
    spec = CaseSpec(batch=2, seqlen_q=8, seqlen_k=8, heads_q=4, heads_kv=4, head_dim=16, dtype="float16", name="demo")
    expected = torch.zeros(2, 8, 4, 16, dtype=torch.float64)
    actual = torch.zeros(2, 8, 4, 16, dtype=torch.float16)
    actual[1, 7, 3, 12] = 0.5
    actual[0, 0, 0, 0] = 0.25
    comparison = compare("dq", actual, expected, torch.full_like(expected, 1e-3), threshold=1.0)
    return CaseResult(spec=spec, kernel="mykernel", device="cpu", status="failed", comparisons={"dq": comparison})


def test_describe_failure_names_output_path_count_worst_threshold_and_reproduction():
    message = describe_failure(_failed_result(), "dq")
    assert "dq (float16) mismatches the golden in 2 of 1024 elements" in message
    assert "worst: dq[b=1, i=7, h=3, c=12]: actual=0.5 expected=0" in message
    assert "normalized error 500 (threshold 1)" in message
    assert '"name": "demo"' in message
    assert "reproduce: fa2-verify repro --kernel mykernel --device cpu --case '{" in message


#: Query i sees key j iff j - (seqlen_k - seqlen_q) - i lies in the window: 3 queries, 1 key, window (-1, 0):
#: rows 0 and 1 see no key; 3 queries, 4 keys, window (0, 0): key 0 is seen by no query.
ROWS_WITHOUT_KEYS = dict(seqlen_q=3, seqlen_k=1, window_size=(-1, 0))
KEYS_WITHOUT_QUERIES = dict(seqlen_q=3, seqlen_k=4, window_size=(0, 0))


@pytest.mark.parametrize(
    "output, lengths, index, note",
    [
        ("out", ROWS_WITHOUT_KEYS, (0, 0, 0, 5), "query row 0 sees no key"),
        ("lse", ROWS_WITHOUT_KEYS, (0, 0, 1), "query row 1 sees no key"),
        ("dq", ROWS_WITHOUT_KEYS, (0, 2, 0, 5), None),
        ("dk", KEYS_WITHOUT_QUERIES, (0, 0, 0, 1), "key 0 is seen by no query"),
        ("dv", KEYS_WITHOUT_QUERIES, (0, 1, 0, 1), None),
    ],
)
def test_describe_failure_says_when_the_worst_element_lies_where_the_mask_hides_every_key(output, lengths, index, note):
    """There the exact value is 0 (or lse -inf) whatever the inputs, so a tiny difference is still a mask error."""
    spec = CaseSpec(batch=1, heads_q=1, heads_kv=1, head_dim=8, dtype="float16", **lengths)
    tokens = spec.seqlen_k if output in ("dk", "dv") else spec.seqlen_q
    shape = (1, 1, tokens) if output == "lse" else (1, tokens, 1, 8)
    expected = torch.zeros(shape, dtype=torch.float64)
    actual = expected.to(torch.float16)
    actual[index] = 2.0**-10
    comparison = compare(output, actual, expected, torch.full_like(expected, 1e-6), threshold=1.0)
    message = describe_failure(CaseResult(spec=spec, kernel="k", device="cpu", status="failed",
                                          comparisons={output: comparison}), output)  # fmt: skip
    assert f"worst: {output}[" in message
    if note is None:
        assert "whatever the inputs" not in message
    else:
        assert note in message and "whatever the inputs" in message


def test_describe_failure_of_an_errored_case_gives_the_reason():
    spec = CaseSpec(batch=1, seqlen_q=1, seqlen_k=1, heads_q=1, heads_kv=1, head_dim=8, dtype="float32")
    reason = "k.forward raised RuntimeError: boom"
    result = CaseResult(spec=spec, kernel="k", device="cpu", status="error", reason=reason)
    message = describe_failure(result)
    assert "error: k.forward raised RuntimeError: boom" in message
    assert "reproduce: fa2-verify repro --kernel k" in message


@pytest.mark.parametrize("lanes", [1, 3, 32])
def test_a_histogram_spread_over_copies_counts_as_one(lanes):
    """metrics.spread_bincount (CUDA's radix histograms, HISTOGRAM_LANES copies) equals torch.bincount, also when
    the copies would pass 2**21 bins and fewer are taken."""
    generator = torch.Generator().manual_seed(lanes)
    for bins in (metrics.RADIX, 40 * metrics.RADIX):
        index = torch.randint(0, bins, (10007,), generator=generator)
        index[::7] = 5  # a crowded bin, as a metric's values make
        assert torch.equal(metrics.spread_bincount(index, bins, lanes), torch.bincount(index, minlength=bins))
