"""The model kernel and the statistical and local verdicts (docs/error-model.md, "Statistical and local verdicts")."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.verify import error_model, metrics, noise_verdicts
from fa2_verify.verify.check import compare_outputs, golden_for
from fa2_verify.verify.error_model import PartialSums
from fa2_verify.verify.kernel_call import run_case
from fa2_verify.verify.model_kernel import model_attention
from fa2_verify.verify.registry import load_kernel
from fa2_verify.verify.results import CaseResult

OUTPUTS = ("out", "lse", "dq", "dk", "dv")


def _case(**fields):
    # every row sums 210 keys and every key 2 x 200 rows: at least FEWEST_TERMS = 128
    spec = dict(batch=2, seqlen_q=200, seqlen_k=210, heads_q=4, heads_kv=2, head_dim=32, dtype="float16", seed=3)
    spec.update(fields)
    return make_case(CaseSpec(**spec), "cpu")


@pytest.fixture(scope="module")
def long_case():
    case = _case()
    return case, golden_for(case)


def test_the_model_kernel_is_a_correct_kernel_under_the_worst_case_bounds(long_case):
    case, golden = long_case
    model = model_attention(case)
    bounds = error_model.first_order_bounds(case, golden)
    for name in OUTPUTS:
        comparison = metrics.compare(name, model[name], getattr(golden, name), bounds[name], threshold=1.0)
        assert comparison.passed, (name, comparison.worst)
        assert comparison.abs_err.quantiles["max"] > 0  # it rounds: it is a noise model, not the golden


def test_outputs_through_declared_partial_sums_are_left_to_the_worst_case_verdict(long_case):
    spec = long_case[0].spec
    assert noise_verdicts.judged_outputs(spec, PartialSums()) == OUTPUTS
    assert noise_verdicts.judged_outputs(spec, PartialSums(dkv_rows=32, dq_keys=16)) == ("out", "lse")
    assert noise_verdicts.judged_outputs(spec, PartialSums(out_splits=3)) == ("lse", "dq", "dk", "dv")
    assert noise_verdicts.judged_outputs(dataclasses.replace(spec, dtype="float32"), PartialSums()) == ()


def _judged(case, golden, actual):
    kernel = load_kernel("reference")
    return compare_outputs(kernel, case, actual, golden)


def test_the_models_own_outputs_have_r_at_most_one(long_case):
    case, golden = long_case
    model = model_attention(case)
    bounds = error_model.first_order_bounds(case, golden)
    for name in OUTPUTS:
        noise = noise_verdicts.noise_units(case.spec, name, model[name], getattr(golden, name), model[name],
                                           bounds[name])
        r, unit = noise.r, noise.unit
        tokens = case.spec.seqlen_k if name in ("dk", "dv") else case.spec.seqlen_q
        heads = case.spec.heads_kv if name in ("dk", "dv") else case.spec.heads_q
        channels = 1 if name == "lse" else case.spec.head_dim
        assert r.shape == unit.shape == (case.spec.batch, heads, tokens, channels)
        assert float(r.max()) <= 1.0


def test_a_correct_kernel_passes_every_verdict(long_case):
    case, golden = long_case
    comparisons = _judged(case, golden, run_case(load_kernel("reference"), case))
    for comparison in comparisons.values():
        assert comparison.passed and comparison.failed_verdicts == []
        assert comparison.statistical["score"] < 1 and comparison.local["score"] < 1
        assert comparison.bias is None or comparison.bias["score"] < 1


def _reference_units(case, golden, name):
    """The reference kernel's outputs of ``case`` and the noise units of output ``name``."""
    actual = run_case(load_kernel("reference"), case)
    model = model_attention(case, actual)
    bound = error_model.first_order_bounds(case, golden)[name]
    return actual, noise_verdicts.noise_units(case.spec, name, actual[name], getattr(golden, name), model[name],
                                              bound).unit


def test_an_error_of_a_few_noise_units_fails_the_statistical_verdict(long_case):
    case, golden = long_case
    actual, unit = _reference_units(case, golden, "out")
    # element out[b=1, i=100, h=3, c=5]: 6 noise units
    bumped = actual["out"].clone()
    bumped[1, 100, 3, 5] = (golden.out[1, 100, 3, 5] + 6 * unit[1, 3, 100, 5]).to(bumped.dtype)
    comparison = _judged(case, golden, {**actual, "out": bumped})["out"]
    assert "statistical" in comparison.failed_verdicts and not comparison.passed
    assert comparison.statistical["path"] == "out[b=1, i=100, h=3, c=5]"
    assert comparison.statistical["tile"] == "rows 64-127 of batch 1, head 3"


def test_a_stale_tile_fails_the_local_verdict_and_is_named(long_case):
    case, golden = long_case
    actual, unit = _reference_units(case, golden, "dq")
    # rows 64-127 of batch 0, head 2 off by three noise units each, random signs: below the statistical threshold
    signs = torch.randint(0, 2, (64, 32), generator=torch.Generator().manual_seed(0)) * 2 - 1
    stale = actual["dq"].clone()
    stale[0, 64:128, 2] = (golden.dq[0, 64:128, 2] + 3 * signs * unit[0, 2, 64:128]).to(stale.dtype)
    comparison = _judged(case, golden, {**actual, "dq": stale})["dq"]
    assert comparison.statistical["score"] <= 1 and comparison.mismatches == 0
    assert comparison.failed_verdicts == ["local"]
    assert comparison.local["flagged"]["tile"] == "rows 64-127 of batch 0, head 2"


def test_keys_are_named_for_dk_and_dv(long_case):
    case, golden = long_case
    actual = run_case(load_kernel("reference"), case)
    wrong = actual["dv"].clone()
    wrong[1, 7, 0] *= 1.05
    comparison = _judged(case, golden, {**actual, "dv": wrong})["dv"]
    assert not comparison.passed
    assert comparison.local["group"].startswith("key 7 of batch 1, kv head 0")


def test_an_exact_model_and_one_ulp_everywhere_in_a_group_is_not_out_of_line():
    spec = _case(generator="uniform").spec
    expected = torch.full((1, 128, 2, 16), 0.5, dtype=torch.float64)
    exact = expected.to(torch.float16)
    one_ulp_off = exact.clone()
    one_ulp_off[0, :64, 0] += 2.0**-11  # float16's gap at 0.5
    spec = dataclasses.replace(spec, batch=1, seqlen_q=128, seqlen_k=128, heads_q=2, heads_kv=2, head_dim=16,
                               causal=False)
    noise = noise_verdicts.noise_units(spec, "out", one_ulp_off, expected, exact, torch.ones_like(expected))
    assert float(noise.r.max()) == pytest.approx(2.0)
    judged = noise_verdicts.premise(spec, "out", {"logit_max": torch.zeros(1, 2, 128)})
    assert bool(judged.all())
    assert noise_verdicts.local("out", noise.r, noise.r_model, judged)["score"] <= 1


def test_a_lone_lse_row_in_the_last_tile_is_left_to_the_statistical_verdict():
    """seqlen_q 65: the last tile of ``lse`` is one element.  Its ``r`` of 2.5 (a tail of legitimate noise,
    below the statistical threshold 4) was a group of one facing the local verdict's 2 units; groups under
    MIN_GROUP_ELEMENTS are not judged locally, and the whole head still is."""
    r = torch.full((1, 1, 65, 1), 0.5, dtype=torch.float64)
    r[0, 0, 64] = 2.5
    judged = torch.ones(1, 1, 65, 1, dtype=torch.bool)
    record = noise_verdicts.local("lse", r, torch.zeros_like(r), judged)
    assert record["score"] <= 1 and record["flagged"] == {}
    r[0, 0, :] = 2.5  # a whole head out of line still fails
    assert noise_verdicts.local("lse", r, torch.zeros_like(r), judged)["flagged"]["head"] == "head 0 of batch 0"
    assert noise_verdicts.local("lse", r[:, :, :15], torch.zeros_like(r[:, :, :15]), judged[:, :, :15]) is None


def test_a_short_last_tile_takes_its_noise_unit_from_the_last_64_tokens():
    """The unit is the largest of TILE model errors (the statistical threshold is a ratio to it): at seqlen_q
    65 the lone row 64 takes the largest model error of rows 1-64, not its own alone."""
    spec = dataclasses.replace(_case().spec, batch=1, seqlen_q=65, seqlen_k=65, heads_q=1, heads_kv=1, head_dim=16)
    expected = torch.full((1, 65, 1, 16), 0.5, dtype=torch.float64)
    model = expected.clone()
    model[0, 1:64, 0] += 2.0**-11
    noise = noise_verdicts.noise_units(spec, "out", expected, expected, model, torch.ones_like(expected))
    own = 2.0**-12  # half of float16's ulp at 0.5
    assert float(noise.unit[0, 0, 64, 0]) == pytest.approx(2.0**-11 + own)
    assert float(noise.unit[0, 0, 0, 0]) == pytest.approx(2.0**-11 + own)
    model[0, 1:64, 0] = 0.5
    model[0, 0, 0] += 2.0**-11  # row 0 lies outside the last 64 tokens
    noise = noise_verdicts.noise_units(spec, "out", expected, expected, model, torch.ones_like(expected))
    assert float(noise.unit[0, 0, 64, 0]) == pytest.approx(own)


def test_rows_whose_logits_float32_cannot_resolve_to_u_are_left_to_the_worst_case_verdict():
    """Split-KV weights in float32 err by ``u_a |LSE|``, far above ``u`` at logits near -1e5 (eq. 2b): a
    correct kernel's noise the model does not make.  Those rows are outside the premise."""
    case = _case(generator="far-below-zero", seqlen_q=64)
    golden = golden_for(case)
    kernel = load_kernel("tests.variants:SPLIT_KV3")
    actual = run_case(kernel, case)
    comparisons = compare_outputs(kernel, case, actual, golden)
    assert all(c.passed for c in comparisons.values())
    assert 0 < comparisons["out"].statistical["judged"] < 1


def test_short_sums_are_left_to_the_worst_case_verdict():
    """Causal, bottom-right: row i of 200 sees 11 + i of 210 keys, so rows from 117 on sum at least 128 keys;
    key j is seen by the rows from j - 10 on, so keys up to 146 are summed over at least 2 x 64 rows."""
    spec = _case(causal=True).spec
    rows = noise_verdicts.premise(spec, "out", {"logit_max": torch.zeros(2, 4, 200)})[0, 0, :, 0]
    keys = noise_verdicts.premise(spec, "dk", {"logit_max": torch.zeros(2, 4, 200), "ds_signal": torch.ones(2, 4, 200),
                                                  "ds_magnitude": torch.ones(2, 4, 200)})[0, 0, :, 0]
    assert rows.nonzero().flatten().tolist() == list(range(117, 200))
    assert keys.nonzero().flatten().tolist() == list(range(0, 147))
    far = noise_verdicts.premise(spec, "out", {"logit_max": torch.full((2, 4, 200), 600.0)})  # u_a (2 M + 1) > u / 8 in float16
    assert not bool(far.any())


def test_float32_cases_keep_the_worst_case_verdict_alone():
    case = _case(dtype="float32", seqlen_q=20, seqlen_k=20)
    comparisons = _judged(case, golden_for(case), run_case(load_kernel("reference"), case))
    assert all(c.statistical is None and c.local is None and c.passed for c in comparisons.values())


def test_records_survive_json_and_the_failure_message_names_the_verdict(long_case):
    case, golden = long_case
    actual = run_case(load_kernel("reference"), case)
    wrong = actual["dv"].clone()
    wrong[1, 7, 0] *= 1.05
    comparisons = _judged(case, golden, {**actual, "dv": wrong})
    record = comparisons["dv"].to_dict()
    assert metrics.OutputComparison.from_dict(record) == comparisons["dv"]
    result = CaseResult(spec=case.spec, kernel="reference", device="cpu", status="failed", comparisons=comparisons)
    message = metrics.describe_failure(result, "dv")
    assert "fails the local verdict" in message or "statistical:" in message
    assert "local: key 7 of batch 1, kv head 0" in message


def test_a_head_scaled_by_one_unit_roundoff_fails_the_bias_verdict_alone(long_case):
    """``out`` of one head times ``1 + u``: each element moves by at most one ulp, within the statistical and
    local verdicts, but every row errs in the golden's direction, which rounding to nearest does not."""
    case, golden = long_case
    actual = run_case(load_kernel("reference"), case)
    scaled = actual["out"].clone()
    scaled[1, :, 3] = (golden.out[1, :, 3] * (1 + 2.0**-11)).to(scaled.dtype)
    comparisons = _judged(case, golden, {**actual, "out": scaled})
    assert comparisons["out"].failed_verdicts == ["bias"]
    assert comparisons["out"].bias["group"] == "head 3 of batch 1" and comparisons["out"].bias["z"] > 6
    result = CaseResult(spec=case.spec, kernel="reference", device="cpu", status="failed", comparisons=comparisons)
    assert "bias: head 3 of batch 1: errors lean one way" in metrics.describe_failure(result, "out")
    assert metrics.OutputComparison.from_dict(comparisons["out"].to_dict()) == comparisons["out"]


def test_rows_whose_keys_all_tie_are_left_out_of_the_bias_verdict():
    """``score-plateau`` gives half of the (batch, kv head) pairs rows whose scores are one number: the model
    rounds no ``P~`` there (each is 1), nothing shows their rows' errors to be independent, and those heads are
    not judged; the heads whose scores spread are, and a correct kernel passes them."""
    case = _case(generator="score-plateau")
    alpha = model_attention(case)["scale_errors"]
    tied = alpha.abs().amax(-1) == 0
    assert bool(tied.any()) and not bool(tied.all())
    noise = noise_verdicts.noise_units(case.spec, "out", case.q, golden_for(case).out, case.q,
                                       torch.ones(case.q.shape, dtype=torch.float64))
    judged = noise_verdicts.premise(case.spec, "out", {"logit_max": torch.zeros(alpha.shape)}) & tied[..., None, None]
    assert noise_verdicts.bias("out", noise.lean, noise.lean_model, judged, alpha, 2.0**-11) is None
    out = _judged(case, golden_for(case), run_case(load_kernel("reference"), case))["out"]
    assert out.passed and out.bias["groups_judged"] > 0


def test_an_exact_model_leaves_no_group_to_the_bias_verdict():
    """Where the model rounds no ``P~`` (every row's keys tie at its maximum) nothing shows the rows' errors to be
    independent, so a group of one-ulp errors all one way is not judged."""
    spec = CaseSpec(batch=1, seqlen_q=128, seqlen_k=128, heads_q=2, heads_kv=2, head_dim=16, dtype="float16")
    expected = torch.full((1, 128, 2, 16), 0.5, dtype=torch.float64)
    one_ulp_off = expected.to(torch.float16)
    one_ulp_off[0, :, 0] += 2.0**-11
    noise = noise_verdicts.noise_units(spec, "out", one_ulp_off, expected, expected.to(torch.float16),
                                       torch.ones_like(expected))
    judged = noise_verdicts.premise(spec, "out", {"logit_max": torch.zeros(1, 2, 128)})
    assert noise_verdicts.bias("out", noise.lean, noise.lean_model, judged, torch.zeros(1, 2, 128), 2.0**-11) is None


@pytest.mark.parametrize("common, judged_groups", [(2.0**-11 / 200, 3), (2.0**-11 / 20, 0)])
def test_rows_that_share_a_scale_error_are_judged_only_when_it_is_far_below_u(common, judged_groups):
    """Long bfloat16 rows round ``P~`` down slightly more often than up, a common scale error of about
    ``u / 1000`` that every kernel rounding ``P~`` to ``T`` shares: still judged.  A common error of ``u / 20``
    (rows that tie alike) is not."""
    spec = CaseSpec(batch=1, seqlen_q=128, seqlen_k=128, heads_q=2, heads_kv=2, head_dim=16, dtype="float16")
    spread = torch.randn(1, 2, 128, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2.0**-20
    alpha = common + spread
    lean = torch.zeros(1, 2, 128, 16, dtype=torch.float64)
    judged = noise_verdicts.premise(spec, "out", {"logit_max": torch.zeros(1, 2, 128)})
    record = noise_verdicts.bias("out", lean, lean, judged, alpha, 2.0**-11)
    assert (record["groups_judged"] if record else 0) == judged_groups


def test_an_output_judged_one_batch_at_a_time_gets_the_records_of_the_whole(long_case, monkeypatch):
    """Every group lies within a batch, so judging in parts of whole batches (the memory bound of large cases)
    changes no verdict: the same scores, the same share judged, the same element and groups, named with their
    own batch."""
    case, golden = long_case
    actual = run_case(load_kernel("reference"), case)
    model = model_attention(case, actual)
    bounds = error_model.first_order_bounds(case, golden)
    out = actual["out"].clone()
    out[1, :, 3] = (golden.out[1, :, 3] * (1 + 2.0**-11)).to(out.dtype)
    dv = actual["dv"].clone()
    dv[1, 7, 0] *= 1.05
    for name, tensor in (("out", out), ("dv", dv)):
        whole = noise_verdicts.judge(case.spec, name, tensor, getattr(golden, name), bounds[name], model)
        monkeypatch.setattr(noise_verdicts, "JUDGE_ELEMENTS", 1)
        parts = noise_verdicts.judge(case.spec, name, tensor, getattr(golden, name), bounds[name], model)
        monkeypatch.undo()
        keys = {"statistical": ("score", "judged", "path", "tile"), "local": ("score", "group"),
                "bias": ("score", "group", "groups_judged")}
        for verdict, fields in keys.items():
            if whole[verdict] is None:
                assert parts[verdict] is None
            else:
                assert [parts[verdict][f] for f in fields] == pytest.approx([whole[verdict][f] for f in fields])
    assert parts["local"]["group"].startswith("key 7 of batch 1")


def _dq_with_delta_off_by_float32_ulps(case, out, lse, ulps):
    """FA2's dQ (Algorithm 2, in float32 from the T inputs) with ``D_i`` off by ``ulps`` float32 ulps of
    ``sum_c |dO_ic O_ic|``: another summation order of ``D = rowsum(dO * O)``, as a correct kernel may have
    (one of ``head_dim`` terms' worth of rounding)."""
    spec, group = case.spec, case.spec.heads_q // case.spec.heads_kv
    q, dout, o = (t.transpose(1, 2).float() for t in (case.q, case.dout, out))
    k, v = (t.transpose(1, 2).float().repeat_interleave(group, dim=1) for t in (case.k, case.v))
    p = torch.exp(spec.scale * q @ k.mT - lse[..., None].float())
    delta = (dout * o).sum(-1, keepdim=True) + ulps * metrics.ulp((dout * o).abs().sum(-1, keepdim=True), torch.float32)
    ds = (p.to(spec.torch_dtype).float() * (dout @ v.mT - delta)).to(spec.torch_dtype).float()
    return (spec.scale * ds @ k).to(spec.torch_dtype).transpose(1, 2)


def test_rows_whose_ds_cancels_below_float32_are_left_to_the_worst_case_verdict(long_case):
    """A one-hot softmax row has ``D_i = dP_ij*``: ``dS`` is the difference of two float32 sums that agree to
    their last bits, so their summation orders, not the rounding to ``T``, make dQ's noise, and the model may
    happen to make none (the ``scale`` profile's false alarm on triton, dq in bfloat16, dominant-key: 1.7e11
    units).  Those rows are outside the premise: without it, ``D`` off by one ulp scores 1.8 here, by four 7.7.
    Rows of random inputs keep it."""
    case = make_case(CaseSpec(batch=2, seqlen_q=128, seqlen_k=128, heads_q=2, heads_kv=1, head_dim=32,
                              dtype="bfloat16", generator="dominant-key", seed=0, backward=True), "cpu")
    golden = golden_for(case)
    model = model_attention(case)
    actual = {name: model[name] for name in OUTPUTS}
    actual["dq"] = _dq_with_delta_off_by_float32_ulps(case, model["out"], model["lse"], 4)
    comparisons = _judged(case, golden, actual)
    assert comparisons["dq"].passed and comparisons["dq"].statistical["judged"] == 0
    case, golden = long_case
    random = _judged(case, golden, {name: model_attention(case)[name] for name in OUTPUTS})
    assert random["dq"].statistical["judged"] == random["out"].statistical["judged"] > 0


def test_elements_near_float32_underflow_are_left_to_the_worst_case_verdict(long_case):
    """A kernel that flushes float32 subnormal softmax weights (``ex2.approx.ftz``, as triton does) errs by
    ``eta_a``-sized amounts the worst-case bound allows and the model, which keeps subnormals, does not make:
    bfloat16 dv of keys whose every weight is below 2^-126 (the ``scale`` profile's case, triton on an H100:
    128 units of 9.3e-40, 0.36 of the bound; here 32 units without this rule).  Elements whose bound's share
    for flushing exceeds ``u / 8`` of ``|x*|`` are outside the premise; float16, whose own underflow unit
    dominates any flush, keeps every element."""
    spec = CaseSpec(batch=7, seqlen_q=16, seqlen_k=4097, heads_q=8, heads_kv=1, head_dim=32, dtype="bfloat16",
                    generator="normal-x2^3", seed=0, softmax_scale=1.0, backward=True)
    case = make_case(spec, "cpu")
    golden = golden_for(case)
    model = model_attention(case)
    q, dout = (t.transpose(1, 2).float() for t in (case.q, case.dout))
    k = case.k.transpose(1, 2).float().repeat_interleave(8, dim=1)
    p = torch.exp(spec.scale * q @ k.mT - model["lse"][..., None].float())
    p = torch.where(p < torch.finfo(torch.float32).smallest_normal, 0.0, p).to(torch.bfloat16).float()
    flushed = (p.mT @ dout).sum(1, keepdim=True).to(torch.bfloat16).transpose(1, 2)
    comparisons = _judged(case, golden, {**{name: model[name] for name in OUTPUTS}, "dv": flushed})
    assert comparisons["dv"].passed and 0 < comparisons["dv"].statistical["judged"] < 1
    assert noise_verdicts.flush_matters(torch.bfloat16) and not noise_verdicts.flush_matters(torch.float16)
    case, golden = long_case
    random = _judged(case, golden, {name: model_attention(case)[name] for name in OUTPUTS})
    assert random["dv"].statistical["judged"] == random["out"].statistical["judged"] > 0
