"""The property suite against known-broken and known-correct kernels.

* Every mutant of ``tests/mutants.py`` is caught by the ``ci`` profile: the
  property tests run in suite order without shrinking, each stopping at its
  first failing example, until one fails.
* Every property test can fail: each is searched against a kernel broken in
  exactly the way that property checks (a catalog mutant or a small wrapper
  defined here) and must catch it.
* The correct kernels pass every property across several random seeds.
"""

from __future__ import annotations


import dataclasses
import math

import pytest
import torch
from hypothesis import settings

from fa2_verify.golden.options import GoldenOptions, shared_cache_dir
from fa2_verify.core.contract import UNBOUNDED, visible_mask
from fa2_verify.kernels.reference import DEFERRED
from fa2_verify.properties import harness, profiles
from fa2_verify.properties.session import Suite
from tests.mutants import MUTANTS
from fa2_verify.verify.registry import LoadedKernel, load_kernel

CI = profiles.get("ci")


@pytest.fixture(scope="module")
def golden_options(pytestconfig) -> GoldenOptions:
    return GoldenOptions(cache_dir=shared_cache_dir(pytestconfig.rootpath))


def _suite(name: str, target, golden_options: GoldenOptions, dtypes: tuple[str, ...] | None = None) -> Suite:
    return Suite(LoadedKernel(name, target), "cpu", CI, golden_options, dtypes)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_ci_profile_catches_every_mutant(name, golden_options):
    suite = _suite(f"tests.mutants:{name}", MUTANTS[name], golden_options)
    for test in harness.property_tests():
        result = harness.search(test, suite, harness.catch_settings(CI))
        if result.caught:
            break
    assert result.caught, f"mutant {name} passed every property of the ci profile"
    assert f"reproduce: fa2-verify repro --kernel tests.mutants:{name} --case" in result.message


class _Broken:
    """The reference kernel with one output altered after the fact; subclasses say how."""

    capabilities = DEFERRED.capabilities

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out, lse = DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        return self.alter_forward(q, k, v, out, lse)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        dq, dk, dv = DEFERRED.backward(
            dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal, window_size=window_size, deterministic=deterministic
        )
        return self.alter_backward(dq, dk, dv)

    def alter_forward(self, q, k, v, out, lse):
        return out, lse

    def alter_backward(self, dq, dk, dv):
        return dq, dk, dv


def _noise(tensor: torch.Tensor, relative: float) -> torch.Tensor:
    """Fresh random noise on every call: a nondeterministic kernel."""
    return (tensor.double() * (1 + relative * torch.randn(tensor.shape, dtype=torch.float64))).to(tensor.dtype)


class FirstKeyLeak(_Broken):
    """The first key's value leaks into every output row: depends on key order."""

    def alter_forward(self, q, k, v, out, lse):
        group = q.shape[2] // k.shape[2]
        leak = v[:, :1].repeat_interleave(group, dim=2) if k.shape[1] else torch.zeros_like(out[:, :1])
        return out + 2**-4 * leak, lse


class LevelDependentOut(_Broken):
    """The output depends on the absolute level of the scores (through the LSE)."""

    def alter_forward(self, q, k, v, out, lse):
        level = torch.tanh(lse.nan_to_num(posinf=0.0, neginf=0.0)).permute(0, 2, 1).unsqueeze(-1)
        return out + (2**-4 * level).to(out.dtype), lse


class BatchLeak(_Broken):
    """Batch element b reads a little of batch element b + 1."""

    def alter_forward(self, q, k, v, out, lse):
        return out + 2**-4 * out.roll(1, dims=0), lse


class CausalPathShift(_Broken):
    """``causal=True`` runs with the diagonal one key too far right; windows are right."""

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        if causal:
            return DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, window_size=(window_size[0], 1))
        return DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, window_size=window_size)


class StrideBlind(_Broken):
    """Reads every input as if it were contiguous, whatever its strides."""

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        q, k, v = (torch.as_strided(t, t.shape, torch.empty(t.shape).stride(), t.storage_offset()) for t in (q, k, v))
        return DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)


class NoisyForward(_Broken):
    """Forward results vary from call to call (a race in the output write)."""

    def alter_forward(self, q, k, v, out, lse):
        return _noise(out, 2**-6), lse


class NoisyDkDv(_Broken):
    """dK and dV vary from call to call, in every mode."""

    def alter_backward(self, dq, dk, dv):
        return dq, _noise(dk, 2**-6), _noise(dv, 2**-6)


class NoisyDq(_Broken):
    """dQ varies by far more than any order of float32 atomic adds can explain."""

    def alter_backward(self, dq, dk, dv):
        return _noise(dq, 2**-6), dk, dv


class VarlenByLoop(_Broken):
    """Varlen entry points that run the reference on each packed sequence; ``overrun``
    extra keys past a sequence's end leak in from the next sequence (a cu_seqlens bug)."""

    capabilities = dataclasses.replace(DEFERRED.capabilities, varlen=True)

    def __init__(self, overrun: int = 0) -> None:
        self.overrun = overrun

    def _spans(self, cu_seqlens_q, cu_seqlens_k, total_k):
        for index in range(len(cu_seqlens_q) - 1):
            q0, q1 = int(cu_seqlens_q[index]), int(cu_seqlens_q[index + 1])
            k0, k1 = int(cu_seqlens_k[index]), int(cu_seqlens_k[index + 1])
            yield slice(q0, q1), slice(k0, min(k1 + self.overrun, total_k))

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32)
        for rows, keys in self._spans(cu_seqlens_q, cu_seqlens_k, k.shape[0]):
            o, l = DEFERRED.forward(q[None, rows], k[None, keys], v[None, keys], softmax_scale=softmax_scale, causal=causal, window_size=window_size)
            out[rows], lse[:, rows] = o[0], l[0]
        return out, lse

    def backward_varlen(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for rows, keys in self._spans(cu_seqlens_q, cu_seqlens_k, k.shape[0]):
            grads = DEFERRED.backward(
                dout[None, rows], q[None, rows], k[None, keys], v[None, keys], out[None, rows], lse[None, :, rows],
                softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            )
            dq[rows] = grads[0][0]
            dk[keys] += grads[1][0]
            dv[keys] += grads[2][0]
        return dq, dk, dv


#: property test -> the kernel that breaks exactly what it checks.
BREAKERS = {
    "test_out_within_error_model": MUTANTS["SKIP_RESCALE"],
    "test_lse_within_error_model": MUTANTS["LSE_BASE2"],
    "test_dq_within_error_model": MUTANTS["DQ_MISSING_SCALE"],
    "test_dk_within_error_model": MUTANTS["DELTA_FROM_ROUNDED"],
    "test_dv_within_error_model": MUTANTS["DK_DV_GQA_NOT_SUMMED"],
    "test_outputs_finite_where_golden_finite": MUTANTS["EMPTY_ROW_NAN"],
    "test_out_invariant_under_key_permutation": FirstKeyLeak(),
    "test_out_invariant_under_score_shift": LevelDependentOut(),
    "test_lse_shifts_with_score_shift": MUTANTS["LSE_BASE2"],
    "test_out_independent_across_batch": BatchLeak(),
    "test_out_independent_across_heads": MUTANTS["GQA_WRONG_HEAD"],
    "test_out_gqa_equals_mha_with_repeated_kv": MUTANTS["GQA_WRONG_HEAD"],
    "test_dkv_gqa_equals_group_sum_of_mha": MUTANTS["DK_DV_GQA_NOT_SUMMED"],
    "test_out_causal_equals_window_left_zero": CausalPathShift(),
    "test_out_causal_prefix_ignores_later_queries": MUTANTS["CAUSAL_SHIFT"],
    "test_outputs_invariant_under_layout": StrideBlind(),
    "test_forward_bitwise_reproducible": NoisyForward(),
    "test_dk_dv_bitwise_reproducible": NoisyDkDv(),
    "test_dq_spread_within_atomic_bound": NoisyDq(),
    "test_gradients_bitwise_reproducible_in_deterministic_mode": NoisyDkDv(),
    "test_varlen_outputs_within_error_model": VarlenByLoop(overrun=1),
}

PROPERTY_TESTS = {test.__name__: test for test in harness.property_tests()}


def test_every_property_has_a_breaker():
    assert set(BREAKERS) == set(PROPERTY_TESTS)


@pytest.mark.parametrize("name", sorted(BREAKERS))
def test_every_property_can_fail(name, golden_options):
    breaker = BREAKERS[name]
    suite = _suite(f"broken:{type(breaker).__name__}", breaker, golden_options)
    result = harness.search(PROPERTY_TESTS[name], suite, settings(harness.catch_settings(CI), max_examples=40))
    assert result.caught, f"{name} did not catch {type(breaker).__name__} in {result.examples} examples"


#: Correct kernels: the device each is checked on and the dtypes it is correct in
#: there.  PyTorch's CPU flash kernel returns an LSE accurate to only ~1e-5 for
#: 16-bit inputs (kernels/torch_flash.py), which the suite reports as a failure.
CORRECT = {
    "reference": ("cpu", None),
    "torch-flash": ("cpu", ("float32", "float64")),
    "triton": ("cuda", None),
}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(
    "kernel", [pytest.param(name, marks=[pytest.mark.gpu] if CORRECT[name][0] == "cuda" else []) for name in sorted(CORRECT)]
)
def test_correct_kernels_pass_every_property(kernel, seed, golden_options):
    device, dtypes = CORRECT[kernel]
    suite = Suite(load_kernel(kernel), device, CI, golden_options, dtypes)
    random_search = settings(harness.catch_settings(CI), derandomize=False, max_examples=2)
    failures = [
        result.message
        for test in harness.property_tests()
        if (result := harness.search(test, suite, random_search, seed=seed)).caught
    ]
    assert not failures, "\n\n".join(failures)


class RandomOrderDq(_Broken):
    """A correct atomic dQ: per key block of 16, ``c_b = scale * dS_b K_b`` in float32,
    summed in a fresh random order on every call (as atomic adds land)."""

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED), deterministic=False):
        dq, dk, dv = super().backward(
            dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal, window_size=window_size
        )
        group = q.shape[2] // k.shape[2]
        keys, values = (t.double().repeat_interleave(group, dim=2) for t in (k, v))
        visible = visible_mask(q.shape[1], k.shape[1], causal=causal, window_size=window_size)
        logits = softmax_scale * torch.einsum("bihc,bjhc->bhij", q.double(), keys)
        finite_lse = torch.where(torch.isfinite(lse), lse.double(), torch.full_like(lse.double(), math.inf))
        p = torch.exp(logits - finite_lse.unsqueeze(-1)).masked_fill(~visible, 0.0)
        dp = torch.einsum("bihc,bjhc->bhij", dout.double(), values)
        delta = (dout.double() * out.double()).sum(-1).permute(0, 2, 1).unsqueeze(-1)
        ds = (p * (dp - delta)).float()
        blocks = list(range(0, k.shape[1], 16))
        accumulator = torch.zeros(q.shape, dtype=torch.float32)
        for start in (blocks[i] for i in torch.randperm(len(blocks)).tolist()):
            block = slice(start, start + 16)
            accumulator += softmax_scale * torch.einsum("bhij,bjhc->bihc", ds[..., block], keys[:, block].float())
        return accumulator.to(dq.dtype), dk, dv


def test_dq_spread_bound_admits_atomic_reordering(golden_options):
    suite = _suite("correct:RandomOrderDq", RandomOrderDq(), golden_options, ("float32",))
    test = PROPERTY_TESTS["test_dq_spread_within_atomic_bound"]
    result = harness.search(test, suite, settings(harness.catch_settings(CI), max_examples=15))
    assert not result.caught, result.message
    (worst,) = suite.take_observations()["worst"]
    assert 0 < worst["score"] <= 1, "random summation orders never changed dq: the positive control is vacuous"


def test_varlen_property_passes_a_correct_varlen_kernel(golden_options):
    suite = _suite("correct:VarlenByLoop", VarlenByLoop(), golden_options)
    test = PROPERTY_TESTS["test_varlen_outputs_within_error_model"]
    result = harness.search(test, suite, settings(harness.catch_settings(CI), max_examples=15))
    assert not result.caught, result.message
