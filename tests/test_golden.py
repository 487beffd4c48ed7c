"""The golden checked against closed forms, finite differences and its own argument checks.

Shapes are tiny: every case here is served by mpmath in milliseconds.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

from fa2_verify import golden
from fa2_verify.golden import mp
from fa2_verify.golden.options import AUTO_MPMATH_MAX_WORK
from fa2_verify.core.contract import visible_mask
from fa2_verify.core.errors import UsageError

METHODS = ("mpmath", "fast")


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def _inputs(batch=1, seqlen_q=4, seqlen_k=5, heads_q=2, heads_kv=1, head_dim=3, dtype=torch.float16, seed=0):
    q = _randn(batch, seqlen_q, heads_q, head_dim, seed=seed, dtype=dtype)
    k = _randn(batch, seqlen_k, heads_kv, head_dim, seed=seed + 1, dtype=dtype)
    v = _randn(batch, seqlen_k, heads_kv, head_dim, seed=seed + 2, dtype=dtype)
    dout = _randn(batch, seqlen_q, heads_q, head_dim, seed=seed + 3, dtype=dtype)
    return q, k, v, dout


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_equal_scores_give_mean_of_v_and_lse_s_plus_log_n(method, causal):
    """Identical keys: every visible score is s_i, so out_i = mean of visible v, LSE_i = s_i + log n_i, dq = 0."""
    q, _, v, dout = _inputs(seqlen_q=3, seqlen_k=6, heads_q=2, heads_kv=2)
    k = _randn(1, 1, 2, 3, seed=7).expand(1, 6, 2, 3).contiguous()
    scale = 0.7
    options = golden.GoldenOptions(method=method)
    result = golden.compute(q, k, v, dout, softmax_scale=scale, causal=causal, options=options)
    visible = visible_mask(3, 6, causal=causal)
    q64, k64, v64 = (t.double() for t in (q, k, v))
    for h in range(2):
        for i in range(3):
            keys = visible[i].nonzero().flatten()
            expected_out = v64[0, keys, h].mean(0)
            score = scale * float(q64[0, i, h] @ k64[0, 0, h])
            torch.testing.assert_close(result.out[0, i, h], expected_out, rtol=1e-15, atol=1e-15)
            assert result.lse[0, h, i].item() == pytest.approx(score + math.log(len(keys)), rel=1e-15, abs=1e-15)
    torch.testing.assert_close(result.dq, torch.zeros_like(result.dq), rtol=0, atol=1e-15)


@pytest.mark.parametrize("method", METHODS)
def test_one_visible_key_gives_that_v_row(method):
    """window (0, 0), seqlen_q = seqlen_k: query i sees only key i.

    So out_i = v_i, LSE_i = S_ii, dq = dk = 0 and dv_i = the sum of the group's dout_i.
    """
    q, k, v, dout = _inputs(seqlen_q=5, seqlen_k=5, heads_q=4, heads_kv=2)
    scale = 0.5
    result = golden.compute(
        q, k, v, dout, softmax_scale=scale, window_size=(0, 0), options=golden.GoldenOptions(method=method)
    )
    kv_of = torch.arange(4) // 2
    q64, k64, v64, dout64 = (t.double() for t in (q, k, v, dout))
    torch.testing.assert_close(result.out, v64[:, :, kv_of], rtol=0, atol=0)
    scores = scale * (q64 * k64[:, :, kv_of]).sum(-1).transpose(1, 2)
    torch.testing.assert_close(result.lse, scores, rtol=1e-15, atol=0)
    torch.testing.assert_close(result.dq, torch.zeros_like(result.dq), rtol=0, atol=1e-15)
    torch.testing.assert_close(result.dk, torch.zeros_like(result.dk), rtol=0, atol=1e-15)
    expected_dv = dout64.reshape(1, 5, 2, 2, 3).sum(3)
    torch.testing.assert_close(result.dv, expected_dv, rtol=1e-15, atol=0)


@pytest.mark.parametrize("method", METHODS)
def test_rows_that_see_no_key_are_zero_with_lse_minus_inf(method):
    """seqlen_q > seqlen_k with causal: the first seqlen_q - seqlen_k queries see no key."""
    q, k, v, dout = _inputs(seqlen_q=5, seqlen_k=3, heads_q=2, heads_kv=1)
    result = golden.compute(q, k, v, dout, softmax_scale=0.6, causal=True, options=golden.GoldenOptions(method=method))
    assert torch.equal(result.out[:, :2], torch.zeros_like(result.out[:, :2]))
    assert torch.equal(result.dq[:, :2], torch.zeros_like(result.dq[:, :2]))
    assert torch.equal(result.delta[:, :, :2], torch.zeros_like(result.delta[:, :, :2]))
    assert torch.isneginf(result.lse[:, :, :2]).all()
    assert torch.isfinite(result.lse[:, :, 2:]).all()
    assert result.out[:, 2:].abs().sum() > 0


@pytest.mark.parametrize("method", METHODS)
def test_keys_no_query_sees_have_zero_dk_dv(method):
    """window (0, 0) with seqlen_k > seqlen_q: only the last seqlen_q keys are seen."""
    q, k, v, dout = _inputs(seqlen_q=2, seqlen_k=5)
    options = golden.GoldenOptions(method=method)
    result = golden.compute(q, k, v, dout, softmax_scale=0.6, window_size=(0, 0), options=options)
    assert torch.equal(result.dk[:, :3], torch.zeros_like(result.dk[:, :3]))
    assert torch.equal(result.dv[:, :3], torch.zeros_like(result.dv[:, :3]))
    assert result.dv[:, 3:].abs().min() > 0


def test_delta_is_rowsum_of_dout_times_out():
    """D = rowsum(dout o out) (FA2 Algorithm 2), from the unrounded mpmath out."""
    q, k, v, dout = _inputs()
    result = golden.compute(q, k, v, dout, softmax_scale=0.4, options=golden.GoldenOptions(method="mpmath"))
    expected = (dout.double() * result.out).sum(-1).transpose(1, 2)
    torch.testing.assert_close(result.delta, expected, rtol=1e-14, atol=1e-15)


def test_forward_only_leaves_backward_fields_none():
    q, k, v, _ = _inputs()
    result = golden.compute(q, k, v, softmax_scale=0.4)
    assert (result.delta, result.dq, result.dk, result.dv) == (None, None, None, None)
    assert set(result.certified_bound) == {"out", "lse"}
    assert result.out.dtype == torch.float64 and result.out.shape == q.shape
    assert result.lse.shape == (1, 2, 4)


def _finite_difference_case():
    """Inputs as mpf nested lists (one batch element), GQA 2:1 and a sliding window."""
    ctx = mp.context(113)
    q, k, v, dout = (t.double().numpy()[0].transpose(1, 0, 2) for t in _inputs(seqlen_q=3, seqlen_k=4, head_dim=2))
    to_mpf = lambda array: [[[ctx.mpf(float(x)) for x in row] for row in head] for head in array]
    mask = visible_mask(3, 4, window_size=(1, 1)).numpy()
    return ctx, to_mpf(q), to_mpf(k), to_mpf(v), to_mpf(dout), mask


def _numeric_gradients(ctx, q, k, v, dout, mask, scale) -> dict:
    """Central differences of sum(dout o out) with step 2**-40, for every input element."""
    step = ctx.ldexp(1, -40)

    def loss(inputs):
        out = mp.attention_mpf(ctx, inputs["q"], inputs["k"], inputs["v"], None, mask=mask, scale=scale)["out"]
        return ctx.fsum(o * d for oh, dh in zip(out, dout) for orow, drow in zip(oh, dh) for o, d in zip(orow, drow))

    inputs = {"q": q, "k": k, "v": v}
    numeric = {}
    for name, tensor in inputs.items():
        for h, head in enumerate(tensor):
            for i, row in enumerate(head):
                for c in range(len(row)):
                    values = []
                    for sign in (1, -1):
                        shifted = [[list(r) for r in hd] for hd in tensor]
                        shifted[h][i][c] += sign * step
                        values.append(loss({**inputs, name: shifted}))
                    numeric[(name, h, i, c)] = (values[0] - values[1]) / (2 * step)
    return numeric


def _worst_discrepancy(ctx, numeric: dict, gradients: dict):
    return max(
        abs(value - gradients["d" + name][h][i][c]) / (1 + abs(value)) for (name, h, i, c), value in numeric.items()
    )


def test_backward_matches_finite_differences_in_mpmath():
    """dq, dk, dv = d/dx sum(dout o out) at 113 bits, to 2**-60; a gradient from a wrong mask is far off."""
    ctx, q, k, v, dout, mask = _finite_difference_case()
    scale = ctx.mpf(0.75)
    numeric = _numeric_gradients(ctx, q, k, v, dout, mask, scale)
    assert len(numeric) == 2 * 3 * 2 + 4 * 2 + 4 * 2
    right = mp.attention_mpf(ctx, q, k, v, dout, mask=mask, scale=scale)
    assert _worst_discrepancy(ctx, numeric, right) <= ctx.ldexp(1, -60)
    wrong = mp.attention_mpf(ctx, q, k, v, dout, mask=np.roll(mask, 1, axis=1), scale=scale)
    assert _worst_discrepancy(ctx, numeric, wrong) > 1e-3


def test_auto_uses_mpmath_up_to_the_threshold_and_fast_above():
    options = golden.GoldenOptions()
    assert options.resolved_method(AUTO_MPMATH_MAX_WORK) == "mpmath"
    assert options.resolved_method(AUTO_MPMATH_MAX_WORK + 1) == "fast"
    small = golden.compute(*_inputs(), softmax_scale=0.3)
    assert small.method == "mpmath" and set(small.certified_bound.values()) == {0.0}
    large = golden.compute(*_inputs(seqlen_q=40, seqlen_k=32, head_dim=32, heads_q=1), softmax_scale=0.3)
    assert large.method == "fast"
    assert set(large.certified_bound) == {"out", "lse", "dq", "dk", "dv"}
    assert all(0 <= bound <= 2.0**-40 for bound in large.certified_bound.values())


def test_precision_bits_is_honoured():
    """64 and 113 bits differ, by less than 2**-58 relative, and both round to nearly the same float64."""
    _, q, k, v, dout, mask = _finite_difference_case()
    low = mp.attention_mpf(mp.context(64), q, k, v, dout, mask=mask, scale=0.75)
    high = mp.attention_mpf(mp.context(113), q, k, v, dout, mask=mask, scale=0.75)
    differences = [abs(a - b) / abs(b) for a, b in zip(low["lse"][0], high["lse"][0])]
    assert 0 < max(differences) < 2.0**-58
    inputs = _inputs()
    results = [
        golden.compute(*inputs, softmax_scale=0.3, options=golden.GoldenOptions(method="mpmath", precision_bits=bits))
        for bits in (64, 113)
    ]
    torch.testing.assert_close(results[0].dq, results[1].dq, rtol=1e-15, atol=1e-17)


def test_inputs_on_any_dtype_are_taken_exactly():
    """A bfloat16 input and its exact float64 copy give the same golden."""
    inputs = _inputs(dtype=torch.bfloat16)
    as_bf16 = golden.compute(*inputs, softmax_scale=0.3)
    as_f64 = golden.compute(*(t.double() for t in inputs), softmax_scale=0.3)
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert torch.equal(getattr(as_bf16, name), getattr(as_f64, name)), name


def _bad_calls() -> dict:
    """name -> (overrides of a valid call, text the error must contain)."""
    q, k, v, dout = _inputs()
    nan_q = q.clone()
    nan_q[0, 1, 0, 2] = float("nan")
    return {
        "q-not-tensor": ({"q": q.tolist()}, "q is a list"),
        "q-3d": ({"q": q[0]}, "q.shape="),
        "q-int": ({"q": q.to(torch.int32)}, "q.dtype="),
        "q-nan": ({"q": nan_q}, r"q\[0, 1, 0, 2\]=nan"),
        "k-batch": ({"k": torch.cat([k, k])}, "k.shape="),
        "v-shape": ({"v": v[:, :3]}, "v.shape="),
        "heads-not-multiple": ({"k": torch.cat([k] * 3, 2), "v": torch.cat([v] * 3, 2)}, "heads_q=2"),
        "dout-shape": ({"dout": dout[:, :2]}, "dout.shape="),
        "scale-none": ({"softmax_scale": None}, "softmax_scale=None"),
        "scale-nan": ({"softmax_scale": float("nan")}, "softmax_scale=nan"),
        "scale-bool": ({"softmax_scale": True}, "softmax_scale=True"),
        "causal-str": ({"causal": "yes"}, "causal='yes'"),
        "window-short": ({"window_size": (1,)}, r"window_size=\(1,\)"),
        "window-below-minus-one": ({"window_size": (-2, 0)}, r"window_size=\(-2, 0\)"),
        "options-dict": ({"options": {"method": "fast"}}, "options="),
    }


@pytest.mark.parametrize("name", list(_bad_calls()))
def test_bad_arguments_raise_usage_errors_naming_them(name):
    q, k, v, dout = _inputs()
    overrides, message = _bad_calls()[name]
    call = {"q": q, "k": k, "v": v, "dout": dout, "softmax_scale": 0.3, **overrides}
    with pytest.raises(UsageError, match=message):
        golden.compute(call.pop("q"), call.pop("k"), call.pop("v"), call.pop("dout"), **call)


@pytest.mark.parametrize(
    "options, argument",
    [
        ({"precision_bits": 53}, "precision_bits"),
        ({"precision_bits": "113"}, "precision_bits"),
        ({"precision_bits": True}, "precision_bits"),
        ({"method": "fastest"}, "method"),
        ({"certify_rows": 0}, "certify_rows"),
        ({"certify_rows": 2.5}, "certify_rows"),
        ({"cache_dir": 123}, "cache_dir"),
        ({"cache_dir": ""}, "cache_dir"),
    ],
    ids=lambda x: str(x),
)
def test_bad_options_raise_usage_errors_naming_them(options, argument):
    with pytest.raises(UsageError, match=argument):
        golden.GoldenOptions(**options)


def test_mpmath_golden_is_the_formulas_in_mpmath():
    """Spot check of one element against a direct mpmath evaluation (no mask, one head)."""
    q, k, v, dout = _inputs(heads_q=1)
    result = golden.compute(q, k, v, dout, softmax_scale=0.3, options=golden.GoldenOptions(method="mpmath"))
    with mpmath.workprec(113):
        qm, km, vm = (mpmath.matrix(t[0, :, 0].double().tolist()) for t in (q, k, v))
        s = [mpmath.mpf(0.3) * mpmath.fsum(qm[1, c] * km[j, c] for c in range(3)) for j in range(5)]
        lse = mpmath.log(mpmath.fsum(mpmath.exp(x) for x in s))
        out = mpmath.fsum(mpmath.exp(s[j] - lse) * vm[j, 2] for j in range(5))
        lse, out = float(lse), float(out)
    assert result.lse[0, 0, 1].item() == pytest.approx(lse, rel=2.0**-52)
    assert result.out[0, 1, 0, 2].item() == pytest.approx(out, rel=2.0**-52)
