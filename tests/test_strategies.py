"""The property suite's strategies and value generators do what they claim.

Argument validation is one flat table of bad calls; then: every drawn case is
inside the kernel's capabilities and the profile's limits, every feature the
issue names is reachable (``hypothesis.find``), and each adversarial
generator really produces the structure its docstring promises.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from fa2_verify.core.contract import UNBOUNDED, Capabilities, visible_mask
from fa2_verify.properties import cases, inputs, masks, profiles, shapes
from fa2_verify.properties.profiles import Limits
from fa2_verify.core import values
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.errors import UsageError

FULL = Capabilities(dtypes={"cpu": ("float16", "bfloat16", "float32")}, head_dims=(8, 16, 32, 64, 128), deterministic_backward=True)
NARROW = Capabilities(
    dtypes={"cpu": ("float32",)}, head_dims=(16,), causal=False, window=False, gqa=False, backward=False
)
SMALL = Limits(max_batch=2, max_heads_kv=2, max_group=3, max_seqlen=70, max_head_dim=64, common_head_dim=64)
QUICK = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
SEARCH = settings(max_examples=3000, deadline=None, database=None, suppress_health_check=list(HealthCheck))

BAD_CALLS = {
    "seqlens-negative-min": lambda: shapes.seqlens(min_value=-1),
    "seqlens-zero-max": lambda: shapes.seqlens(max_value=0),
    "seqlens-bool": lambda: shapes.seqlens(max_value=True),
    "seqlens-multiple-zero": lambda: shapes.seqlens(multiple_of=0),
    "seqlens-no-multiple-in-range": lambda: shapes.seqlens(min_value=1, max_value=10, multiple_of=16),
    "heads-zero-kv": lambda: shapes.head_counts(max_heads_kv=0),
    "heads-min-group-without-gqa": lambda: shapes.head_counts(min_group=2, gqa=False),
    "heads-min-heads-too-large": lambda: shapes.head_counts(max_heads_kv=1, max_group=2, min_heads_q=3),
    "head-dims-none-left": lambda: shapes.head_dims(capabilities=FULL, max_value=4),
    "batches-min-above-max": lambda: shapes.batches(min_value=3, max_value=2),
    "masks-negative-seqlen": lambda: masks.masks(seqlen_q=-1, seqlen_k=3),
    "masks-causal-not-bool": lambda: masks.masks(seqlen_q=3, seqlen_k=3, causal="yes"),
    "empty-rows-need-longer-q": lambda: masks.empty_row_masks(seqlen_q=2, seqlen_k=2),
    "empty-rows-need-a-mask": lambda: masks.empty_row_masks(seqlen_q=4, seqlen_k=2, causal=False, window=False),
    "generators-empty": lambda: inputs.generator_names(include=[]),
    "generators-string": lambda: inputs.generator_names(include="normal"),
    "generators-unknown": lambda: inputs.generator_names(include=["normal", "gaussian"]),
    "dtypes-device-missing": lambda: inputs.dtypes(capabilities=NARROW, device="cuda"),
    "dtypes-not-supported": lambda: inputs.dtypes(capabilities=NARROW, device="cpu", include=["float16"]),
    "cases-backward-missing": lambda: cases.case_specs(capabilities=NARROW, device="cpu", backward=True),
    "cases-deterministic-missing": lambda: cases.case_specs(capabilities=NARROW, device="cpu", deterministic=True),
    "cases-gqa-missing": lambda: cases.case_specs(capabilities=NARROW, device="cpu", min_group=2),
    "cases-masked-not-bool": lambda: cases.case_specs(capabilities=FULL, device="cpu", masked=1),
    "limits-zero-seqlen": lambda: Limits(max_seqlen=0),
    "limits-common-head-dim-above-max": lambda: Limits(max_head_dim=32),
    "head-dims-common-above-max": lambda: shapes.head_dims(capabilities=FULL, max_value=64, common_max=128),
    "profile-unknown": lambda: profiles.get("weekly"),
}


@pytest.mark.parametrize("call", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_arguments_raise_usage_errors(call):
    with pytest.raises(UsageError, match=r"=.*: |=\(\) |contains unknown|is not"):
        call()


def _supported(spec: CaseSpec, capabilities: Capabilities) -> bool:
    return spec.unsupported_reason(capabilities, "cpu") is None


@QUICK
@given(st.data())
def test_cases_stay_inside_capabilities_and_limits(data):
    capabilities = data.draw(st.sampled_from([FULL, NARROW]))
    spec = data.draw(cases.case_specs(capabilities=capabilities, device="cpu", limits=SMALL, backward=capabilities.backward))
    assert _supported(spec, capabilities)
    assert spec.batch <= SMALL.max_batch and spec.heads_kv <= SMALL.max_heads_kv
    assert spec.heads_q <= SMALL.max_heads_kv * SMALL.max_group and spec.head_dim <= SMALL.max_head_dim
    assert 1 <= min(spec.seqlen_q, spec.seqlen_k) <= SMALL.max_seqlen
    assert max(spec.seqlen_q, spec.seqlen_k) <= shapes.UNBALANCED_LENGTH
    assert spec.seqlen_q * spec.seqlen_k <= SMALL.max_seqlen**2
    assert spec.generator in values.GENERATORS


@QUICK
@given(st.data())
def test_relation_options_are_honoured(data):
    spec = data.draw(
        cases.case_specs(capabilities=FULL, device="cpu", limits=SMALL, masked=False, min_batch=2, min_heads_q=2, min_group=2)
    )
    assert spec.feature() in ("none+gqa", "none+mqa")
    assert spec.batch >= 2 and spec.heads_q >= 2 and spec.heads_q > spec.heads_kv


FEATURES = {
    "mha": lambda s: s.heads_q == s.heads_kv > 1,
    "gqa": lambda s: s.heads_q > s.heads_kv > 1,
    "mqa": lambda s: s.heads_kv == 1 and s.heads_q > 1,
    "causal": lambda s: s.causal and s.window_size == (UNBOUNDED, UNBOUNDED),
    "causal-with-left-window": lambda s: s.causal and s.window_size[0] >= 0,
    "window-left-only": lambda s: not s.causal and s.window_size[0] >= 0 and s.window_size[1] == UNBOUNDED,
    "window-right-only": lambda s: s.window_size[0] == UNBOUNDED and s.window_size[1] >= 0,
    "window-both-sides": lambda s: not s.causal and min(s.window_size) >= 1,
    "window-zero-zero": lambda s: s.window_size == (0, 0),
    "window-unbounded-left-zero-right": lambda s: not s.causal and s.window_size == (UNBOUNDED, 0),
    "window-zero-left-unbounded-right": lambda s: not s.causal and s.window_size == (0, UNBOUNDED),
    "window-left-last-key": lambda s: s.window_size[0] == s.seqlen_k - 1 > 0 and s.window_size[1] == UNBOUNDED,
    "window-right-all-keys": lambda s: s.window_size[1] == s.seqlen_k > 1 and s.window_size[0] == UNBOUNDED,
    "window-left-beyond-keys": lambda s: s.window_size[0] == s.seqlen_k + 1 and s.window_size[1] == 0,
    "rows-without-keys": lambda s: masks.rows_without_keys(s.seqlen_q, s.seqlen_k, (s.causal, s.window_size)) > 0,
    "seqlen-one": lambda s: s.seqlen_q == 1 or s.seqlen_k == 1,
    "q-longer-than-k": lambda s: s.seqlen_q > s.seqlen_k,
    "q-shorter-than-k": lambda s: s.seqlen_q < s.seqlen_k,
    "block-plus-one": lambda s: s.seqlen_k in (17, 33, 65),
    "block-minus-one": lambda s: s.seqlen_q in (15, 31, 63),
    "prime-lengths": lambda s: s.seqlen_q in shapes.PRIMES and s.seqlen_k in shapes.PRIMES and s.seqlen_q > 2,
    "default-scale": lambda s: s.softmax_scale is None,
    "other-scale": lambda s: s.softmax_scale is not None,
    "bfloat16": lambda s: s.dtype == "bfloat16",
    "adversarial-values": lambda s: s.generator == "rescale-storm",
    "rescaled-values": lambda s: inputs.is_rescaled(s.generator),
}


@pytest.mark.parametrize("feature", FEATURES.values(), ids=FEATURES.keys())
def test_every_feature_is_reachable(feature):
    find(cases.case_specs(capabilities=FULL, device="cpu", limits=SMALL), feature, settings=SEARCH)


@QUICK
@given(st.data())
def test_empty_row_masks_leave_rows_without_keys(data):
    seqlen_k = data.draw(st.integers(0, 20))
    seqlen_q = data.draw(st.integers(seqlen_k + 1, 40))
    mask = data.draw(masks.empty_row_masks(seqlen_q=seqlen_q, seqlen_k=seqlen_k))
    assert masks.rows_without_keys(seqlen_q, seqlen_k, mask) > 0


def test_window_edges_are_drawn_often():
    """A fifth of the mask draws or more is a window at its encoding's edges (-1 beside a finite side,
    0, seqlen_k - 1, seqlen_k or beyond), (-1, 0) and (0, -1) among them."""
    drawn = []

    @settings(max_examples=400, derandomize=True, database=None, deadline=None)
    @given(masks.masks(seqlen_q=20, seqlen_k=13))
    def draw(mask):
        drawn.append(mask[1])

    draw()
    edges = set(masks.edge_sides(seqlen_q=20, seqlen_k=13)) | {UNBOUNDED}
    at_edges = [window for window in drawn if window != (UNBOUNDED, UNBOUNDED) and set(window) <= edges]
    assert len(at_edges) > len(drawn) / 5
    assert {(UNBOUNDED, 0), (0, UNBOUNDED), (0, 0), (12, UNBOUNDED), (UNBOUNDED, 13)} <= set(drawn)


def test_far_below_zero_rows_see_one_key_or_none_beside_far_rows():
    """A case of the far-below-zero generator whose mask leaves a row without keys and a row with one."""

    def lonely_rows(spec: CaseSpec) -> bool:
        counts = spec.visible_ranges("cpu")[1] - spec.visible_ranges("cpu")[0] + 1
        return spec.generator == "far-below-zero" and bool((counts <= 0).any()) and bool((counts == 1).any())

    find(cases.case_specs(capabilities=FULL, device="cpu", limits=SMALL), lonely_rows, settings=SEARCH)


def test_boundary_lengths_hold_the_tiling_edges():
    lengths = shapes.boundary_lengths(min_value=1, max_value=130)
    assert {1, 2, 3, 15, 16, 17, 63, 64, 65, 127, 128, 129} <= set(lengths)
    assert lengths == sorted(lengths) and all(n in shapes.PRIMES or n in (1, 2) or n % 16 in (0, 1, 15) for n in lengths)


@QUICK
@given(shapes.seqlen_pairs(max_value=40))
def test_seqlen_pairs_without_capabilities_draw_any_pair(pair):
    """No capabilities: no constraint on the lengths (the default once raised a TypeError, missing head_dims)."""
    assert all(isinstance(n, int) and n >= 1 for n in pair)


# Value generators --------------------------------------------------------------


def _spec(generator: str, dtype: str = "float16", **shape) -> CaseSpec:
    base = dict(batch=2, seqlen_q=9, seqlen_k=40, heads_q=4, heads_kv=2, head_dim=16)
    return CaseSpec(**{**base, **shape}, dtype=dtype, generator=generator, seed=5)


def _scores(spec: CaseSpec) -> torch.Tensor:
    case = make_case(spec)
    group = spec.heads_q // spec.heads_kv
    keys = case.k.double().repeat_interleave(group, dim=2)
    return spec.scale * torch.einsum("bihc,bjhc->bhij", case.q.double(), keys)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("generator", sorted(values.GENERATORS))
def test_generators_give_finite_dtype_values_for_every_shape(generator, dtype):
    for shape in ({}, {"seqlen_q": 1, "seqlen_k": 1, "head_dim": 1}, {"seqlen_q": 0}, {"seqlen_k": 0}):
        case = make_case(_spec(generator, dtype, **shape))
        assert all(bool(torch.isfinite(t).all()) for t in (case.q, case.k, case.v, case.dout))
        again = make_case(_spec(generator, dtype, **shape))
        assert all(torch.equal(a, b) for a, b in zip((case.q, case.k, case.v), (again.q, again.k, again.v)))


def test_every_generator_is_documented_with_its_bug_class():
    for name, generator in values.GENERATORS.items():
        assert len((generator.__doc__ or "").split()) >= 5, name
        if name not in inputs.BENIGN and not inputs.is_rescaled(name):
            assert "Bug class" in generator.__doc__, name


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_exp_overflow_puts_row_maxima_just_below_float32_overflow(dtype):
    row_max = _scores(_spec("exp-overflow", dtype)).amax(dim=-1)
    assert float(row_max.min()) > 55 and float(row_max.max()) < math.log(torch.finfo(torch.float32).max)


def test_dtype_overflow_reaches_float16_range_with_separated_keys():
    spec = _spec("dtype-overflow")
    unscaled = _scores(spec) / spec.scale
    assert 2**14 < float(unscaled.abs().max()) < torch.finfo(torch.float16).max
    top2 = _scores(spec).topk(2, dim=-1).values
    assert float((top2[..., 0] - top2[..., 1]).min()) > 8


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rescale_storm_rises_span_every_binade_down_to_below_float32_resolution(dtype):
    """Rises of the running max from the score level down to 2^-25 of it, each binade drawn; with
    float64 inputs every step is a strict rise (float32 rounding hides the smallest ones)."""
    scores = _scores(_spec("rescale-storm", dtype, seqlen_q=40, seqlen_k=64))
    level = scores[..., 0].abs()
    relative = (scores[..., -1] - scores[..., 0]) / level
    drawn = set(torch.floor(torch.log2(relative[relative > 0])).int().tolist())
    assert set(range(-25, 0)) <= drawn
    assert float((scores[..., -1] - scores[..., 0]).max()) > 8
    if dtype == "float64":
        assert bool((scores[..., 1:] > scores[..., :-1]).all())


def test_exact_ties_repeat_scores_bit_for_bit():
    scores = _scores(_spec("exact-ties", "bfloat16"))
    distinct = max(len(torch.unique(row)) for row in scores.reshape(-1, scores.shape[-1]))
    assert distinct <= 2


def test_dominant_key_towers_over_the_rest():
    scores = _scores(_spec("dominant-key", "float32", seqlen_q=4))
    top2 = scores.topk(2, dim=-1).values
    assert float((top2[..., 0] - top2[..., 1]).min()) > 5


@pytest.mark.parametrize("dtype, span", [("float16", 2.0**15), ("bfloat16", 2.0**60)])
def test_v_dynamic_range_spans_many_binades(dtype, span):
    v = make_case(_spec("v-dynamic-range", dtype)).v.double().abs()
    assert float(v.max() / v[v > 0].min()) > span


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_subnormals_survive_rounding_to_the_dtype(dtype):
    case = make_case(_spec("subnormals", dtype))
    tiny = torch.finfo(case.v.dtype).tiny
    for tensor in (case.q, case.k, case.v, case.dout):
        magnitude = tensor.abs()
        assert float(((magnitude > 0) & (magnitude < tiny)).double().mean()) > 0.3
    assert bool((case.v.abs() < tiny).all(dim=-1).any())


def test_dp_cancellation_makes_dp_minus_d_tiny_relative_to_dp():
    spec = _spec("dp-cancellation", "float32")
    case = make_case(spec)
    group = spec.heads_q // spec.heads_kv
    values_ = case.v.double().repeat_interleave(group, dim=2)
    dp = torch.einsum("bihc,bjhc->bhij", case.dout.double(), values_)
    weights = torch.softmax(_scores(spec), dim=-1)
    delta = (weights * dp).sum(dim=-1, keepdim=True)
    assert float(((dp - delta).abs().amax(-1) / dp.abs().amax(-1)).median()) < 0.1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("softmax_scale", [None, 2.0**-6, 4.0])
def test_far_below_zero_rows_reach_minus_a_million_beside_ordinary_rows(dtype, softmax_scale):
    """Rows whose every score lies at one level from -90 down to about -10^6 in every dtype (float16 by a
    key gain of 2^14), a quarter of the rows ordinary, every input finite in the dtype."""
    spec = dataclasses.replace(_spec("far-below-zero", dtype, seqlen_q=64), softmax_scale=softmax_scale)
    assert values.far_level_reach(spec)[0] == values.FAR_LEVELS[1]
    scores = _scores(spec)
    top, bottom = scores.amax(dim=-1), scores.amin(dim=-1)
    far = top < -80
    assert 0.6 < float(far.double().mean()) < 0.9 and float(top[~far].abs().max()) < 40
    assert float(top.min()) < -1e5 and float(top[far].max()) > -200
    # a far row's scores spread by PLATEAU_SPREAD |noise of q| / sqrt(head_dim) per key: about 0.25, up to
    # about 0.35 on the rows of largest noise, so a range below 8 of those (2.8) over 40 keys, under 2^-5 of 90
    assert float(((top - bottom) / top.abs())[far].max()) < 2**-5


def test_far_below_zero_reach_follows_float16_range():
    """float16 reaches -10^6 down to softmax_scale 2^-8; below it the reach shrinks with the scale,
    and the inputs stay finite."""
    spec = dataclasses.replace(_spec("far-below-zero", "float16"), softmax_scale=2.0**-12)
    reach, gain = values.far_level_reach(spec)
    assert gain == 2.0**14 and reach < values.FAR_LEVELS[1]
    assert values.far_level_reach(dataclasses.replace(spec, softmax_scale=2.0**-8))[0] == values.FAR_LEVELS[1]
    case = make_case(spec)
    assert bool(case.q.isfinite().all()) and float(_scores(spec).min()) > -1.01 * reach


def test_visible_mask_agrees_with_rows_without_keys():
    visible = visible_mask(7, 3, causal=True)
    assert masks.rows_without_keys(7, 3, (True, (UNBOUNDED, UNBOUNDED))) == int((~visible.any(1)).sum()) == 4


REFERENCE_LIKE = Capabilities(dtypes={"cpu": ("float32",), "cuda": ("float32",)}, head_dims=tuple(range(1, 513)))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("profile", sorted(profiles.PROFILES))
def test_every_profile_reaches_head_dim_256_on_every_device(profile, device):
    """Kernels split head dims above 128 into chunks: every profile must draw past 128, up to 256."""
    limits = profiles.get(profile).limits(device)
    assert limits.max_head_dim >= 256
    strategy = shapes.head_dims(
        capabilities=REFERENCE_LIKE, device=device, max_value=limits.max_head_dim, common_max=limits.common_head_dim
    )
    assert find(strategy, lambda head_dim: head_dim > 128, settings=SEARCH) == 129
    assert find(strategy, lambda head_dim: head_dim == 256, settings=SEARCH) == 256


def test_large_head_dims_are_drawn_rarely():
    """One example in LARGE_HEAD_DIM_ODDS draws above common_max, so the CPU budget holds."""
    drawn = []

    @settings(max_examples=400, derandomize=True, database=None, deadline=None)
    @given(shapes.head_dims(capabilities=REFERENCE_LIKE, max_value=256, common_max=64))
    def draw(head_dim):
        drawn.append(head_dim)

    draw()
    large = sum(head_dim > 64 for head_dim in drawn) / len(drawn)
    assert 0.5 / shapes.LARGE_HEAD_DIM_ODDS < large < 2 / shapes.LARGE_HEAD_DIM_ODDS


@given(data=st.data())
@settings(max_examples=25, deadline=None)
def test_head_dims_follow_the_device(data) -> None:
    """A head dim is drawn from what the kernel declares on the chosen device, so nothing is filtered later."""
    capabilities = Capabilities(
        dtypes={"cpu": ("float16",), "cuda": ("float16",)},
        head_dims=tuple(range(1, 65)),
        device_head_dims={"cuda": (8, 16, 24, 32)},
    )
    on_cuda = data.draw(shapes.head_dims(capabilities=capabilities, device="cuda:1", max_value=64))
    on_cpu = data.draw(shapes.head_dims(capabilities=capabilities, device="cpu", max_value=64))
    assert on_cuda in (8, 16, 24, 32) and 1 <= on_cpu <= 64
