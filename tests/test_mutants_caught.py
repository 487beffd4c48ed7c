"""The property suite against known-broken and known-correct kernels.

* Every mutant of ``tests/mutants.py`` is caught by the ``ci`` profile: its
  properties run without shrinking, each stopping at its first failing
  example, until one fails.  Each property's search is derandomized and
  independent of the others, so the order only decides how soon the test
  ends: the property that catches the mutant (:data:`CATCHING_PROPERTY`, as
  docs/benchmarks.md measures) runs first, then the rest in suite order.
* Every property can fail: each is searched against the kernel its
  declaration names as its ``breaker`` (a catalog mutant or one of
  ``tests/breakers.py``) and must catch it.
* The correct kernels pass every property across several random seeds.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import settings

from fa2_verify.golden.options import GoldenOptions, shared_cache_dir
from fa2_verify.properties import harness, profiles
from fa2_verify.properties.session import Suite
from fa2_verify.verify.registry import LoadedKernel, load_kernel
from tests import breakers
from tests.mutants import MUTANTS

CI = profiles.get("ci")

PROPERTIES = {prop.name: prop for prop in harness.declared_properties()}


@pytest.fixture(scope="module")
def golden_options(pytestconfig) -> GoldenOptions:
    return GoldenOptions(cache_dir=shared_cache_dir(pytestconfig.rootpath))


#: The property that catches each mutant in docs/benchmarks.md ("How fast each mutant is caught"):
#: a backward-only mutant searched in suite order first ran the forward properties' whole budget
#: (2 x 60 examples) in vain, most of this file's time.
CATCHING_PROPERTY = {
    "ACC_IN_INPUT_DTYPE": "test_out_within_error_model",
    "BACKWARD_EXITS": "test_dq_within_error_model",
    "BWD_TAIL_UNMASKED": "test_dq_within_error_model",
    "CAUSAL_OS_EXITS": "test_out_within_error_model",
    "CAUSAL_SHIFT": "test_out_within_error_model",
    "DECODE_IGNORES_WINDOW": "test_out_within_error_model",
    "DELTA_FROM_ROUNDED": "test_dq_within_error_model",
    "DETERMINISTIC_DQ_DROPS_LAST_BLOCK": "test_dq_within_error_model",
    "DK_CHUNK_OFFSET": "test_dk_within_error_model",
    "DOUT_OUT_STRIDES_FROM_SHAPE": "test_outputs_invariant_under_layout",
    "KV_BATCH_STRIDE_FROM_SHAPE": "test_outputs_invariant_under_layout",
    "POINTER_ROUNDED_TO_16_BYTES": "test_outputs_invariant_under_layout",
    "V_PAST_SEQLEN_TIMES_ZERO": "test_out_within_error_model",
    "VARLEN_READS_PADDING": "test_varlen_outputs_within_error_model",
    "DK_DV_GQA_NOT_SUMMED": "test_dk_within_error_model",
    "DQ_LOST_UPDATE": "test_dq_within_error_model",
    "DQ_MISSING_SCALE": "test_dq_within_error_model",
    "DS_FLUSH_SUBNORMAL": "test_dq_within_error_model",
    "EMPTY_ROW_NAN": "test_out_within_error_model",
    "GQA_WRONG_HEAD": "test_out_within_error_model",
    "LARGE_TILE_STALE_MAX": "test_out_within_error_model",
    "LSE_BASE2": "test_lse_within_error_model",
    "MAX_FROM_SENTINEL": "test_out_within_error_model",
    "MAX_FROM_ZERO": "test_out_within_error_model",
    "OUT_REWRITTEN_BY_BACKWARD": "test_out_within_error_model",
    "SKIP_RESCALE": "test_out_within_error_model",
    "SKIP_SMALL_RESCALE": "test_lse_within_error_model",
    "SPLIT_KV_LSE_MAX": "test_lse_within_error_model",
    "SPLIT_PARTIALS_IN_FLOAT8": "test_out_within_error_model",
    "STALE_MAX": "test_out_within_error_model",
    "TAIL_BLOCK_UNWRITTEN": "test_out_within_error_model",
    "TAIL_UNMASKED": "test_out_within_error_model",
    "TOP_LEFT_CAUSAL": "test_out_within_error_model",
    "VARLEN_DETERMINISTIC_DQ_DROPS_LAST_BLOCK": "test_varlen_outputs_within_error_model",
    "VARLEN_Q_ASSUMED_CONTIGUOUS": "test_varlen_outputs_within_error_model",
    "WINDOW_LEFT_EXCLUSIVE": "test_out_within_error_model",
    "WINDOW_MINUS_ONE_AS_EDGE": "test_out_within_error_model",
    "WINDOW_OFF_BY_ONE": "test_out_within_error_model",
}


def _suite(name: str, target, golden_options: GoldenOptions, dtypes: tuple[str, ...] | None = None) -> Suite:
    return Suite(LoadedKernel(name, target), "cpu", CI, golden_options, dtypes)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_ci_profile_catches_every_mutant(name, golden_options):
    suite = _suite(f"tests.mutants:{name}", MUTANTS[name], golden_options)
    first = PROPERTIES[CATCHING_PROPERTY[name]]
    for prop in [first, *(prop for prop in PROPERTIES.values() if prop is not first)]:
        result = harness.search(prop, suite, harness.catch_settings(CI))
        if result.caught:
            break
    assert result.caught, f"mutant {name} passed every property of the ci profile"
    assert f"reproduce: fa2-verify repro --kernel tests.mutants:{name} --device cpu --case" in result.message


def test_every_mutant_names_the_property_searched_first():
    assert CATCHING_PROPERTY.keys() == MUTANTS.keys()
    assert set(CATCHING_PROPERTY.values()) <= PROPERTIES.keys()


def test_every_property_has_a_loadable_breaker():
    assert PROPERTIES
    for prop in PROPERTIES.values():
        assert prop.name.startswith("test_") and prop.invariant, prop.name
        assert load_kernel(prop.breaker).name == prop.breaker, prop.name


@pytest.mark.parametrize("name", sorted(PROPERTIES))
def test_every_property_can_fail(name, golden_options):
    prop = PROPERTIES[name]
    suite = Suite(load_kernel(prop.breaker), "cpu", CI, golden_options)
    result = harness.search(prop, suite, settings(harness.catch_settings(CI), max_examples=40))
    assert result.caught, f"{name} did not catch {prop.breaker} in {result.examples} examples"


#: Correct kernels (bundled, and the variants of tests/variants.py with other legitimate
#: numerics, e.g. dS from P rounded to float16 as PyTorch's memory-efficient backward):
#: the device each is checked on, the dtypes it is correct in there (for a variant, those
#: where it differs from the reference),
#: and the properties it cannot run (a capability it lacks), each with the reason
#: the suite must give.  PyTorch's CPU flash kernel returns an LSE accurate to only
#: ~1e-5 for 16-bit inputs (kernels/torch_flash.py), which the suite reports as a failure.
CORRECT = {
    "reference": ("cpu", None, {"test_varlen_outputs_within_error_model": "lacks the capability 'varlen'"}),
    "torch-flash": ("cpu", ("float32", "float64"), {"test_varlen_outputs_within_error_model": "lacks the capability 'varlen'"}),
    "tests.variants:ROUNDED_P_DS": ("cpu", ("float16",), {"test_varlen_outputs_within_error_model": "lacks the capability 'varlen'"}),
    "triton": ("cuda", None, {}),
}


def search_every_property(suite: Suite, search_settings: settings, seed: int) -> tuple[list[str], dict[str, str]]:
    """Each property searched against ``suite``: the failure messages, and the skipped properties with their reasons."""
    failures, skipped = [], {}
    for prop in PROPERTIES.values():
        result = harness.search(prop, suite, search_settings, seed=seed)
        if result.skipped is not None:
            skipped[result.test] = result.skipped
        elif result.caught:
            failures.append(result.message)
    return failures, skipped


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(
    "kernel", [pytest.param(name, marks=[pytest.mark.gpu] if CORRECT[name][0] == "cuda" else []) for name in sorted(CORRECT)]
)
def test_correct_kernels_pass_every_property(kernel, seed, golden_options):
    """Every property, two random examples each: 42 cases per kernel and seed, none from the golden cache
    (each seed draws new inputs), the slowest tests of this file."""
    device, dtypes, expected_skips = CORRECT[kernel]
    suite = Suite(load_kernel(kernel), device, CI, golden_options, dtypes)
    random_search = settings(harness.catch_settings(CI), derandomize=False, max_examples=2)
    failures, skipped = search_every_property(suite, random_search, seed)
    assert not failures, "\n\n".join(failures)
    assert skipped.keys() == expected_skips.keys(), f"skipped: {skipped}"
    for name, reason in skipped.items():
        assert expected_skips[name] in reason, f"{name} skipped for another reason: {reason}"


def test_dq_spread_bound_admits_atomic_reordering(golden_options):
    suite = _suite("correct:RandomOrderDq", breakers.RANDOM_ORDER_DQ, golden_options, ("float32",))
    prop = PROPERTIES["test_dq_spread_within_atomic_bound"]
    result = harness.search(prop, suite, settings(harness.catch_settings(CI), max_examples=15))
    assert not result.caught, result.message
    (worst,) = suite.take_observations()["worst"]
    assert 0 < worst["score"] <= 1, "random summation orders never changed dq: the positive control is vacuous"


@pytest.mark.parametrize("reproducible", [False, True], ids=["declared", "undeclared"])
def test_gqa_dkv_order_is_reproducible_only_where_declared(reproducible, golden_options):
    """A backward that sums a GQA group's dK, dV in random order passes the bitwise property when it
    declares ``gqa_dkv_reproducible=False`` (MHA cases only), and is caught when it does not declare it."""
    target = breakers.GqaRandomOrderDkDv()
    target.capabilities = dataclasses.replace(target.capabilities, gqa_dkv_reproducible=reproducible)
    suite = _suite("correct:GqaRandomOrderDkDv", target, golden_options, ("float32",))
    prop = PROPERTIES["test_dk_dv_bitwise_reproducible"]
    result = harness.search(prop, suite, settings(harness.catch_settings(CI), max_examples=30))
    assert result.caught == reproducible, result.message


def test_varlen_property_passes_a_correct_varlen_kernel(golden_options):
    suite = _suite("correct:VarlenByLoop", breakers.VARLEN_BY_LOOP, golden_options)
    prop = PROPERTIES["test_varlen_outputs_within_error_model"]
    result = harness.search(prop, suite, settings(harness.catch_settings(CI), max_examples=15))
    assert not result.caught, result.message
