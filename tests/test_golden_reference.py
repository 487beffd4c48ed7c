"""The certification's reference rows: double-double arithmetic, exact fixed-point products, their check
against mpmath, and the inputs' fingerprint that seeds the row sample."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import mpmath
import pytest
import torch

from fa2_verify import golden
from fa2_verify.core.errors import GoldenError
from fa2_verify.golden import certify, dd, dd_rows, fast, fixed, inputs

CTX = mpmath.MPContext()
CTX.prec = 300


def _mp(pair: dd.DD, index) -> mpmath.mpf:
    return CTX.mpf(float(pair[0][index])) + CTX.mpf(float(pair[1][index]))


def _pair(hi: torch.Tensor) -> dd.DD:
    """A double-double whose low part is a random fraction of an ulp of the high part."""
    generator = torch.Generator().manual_seed(1)
    return hi, hi * 2.0**-54 * (torch.rand(hi.shape, generator=generator, dtype=torch.float64) - 0.5)


def test_double_double_exp_log_div_sum_agree_with_mpmath_to_2_to_the_minus_95():
    generator = torch.Generator().manual_seed(0)
    x = _pair(torch.cat((torch.randn(200, generator=generator, dtype=torch.float64) * 30 - 20,
                         torch.tensor([0.0, -1e-300, -700.0, -744.0], dtype=torch.float64))))
    e = dd.exp(x)
    for i in range(len(x[0])):
        want = CTX.exp(_mp(x, i))
        assert abs(_mp(e, i) - want) <= 2.0**-95 * want + 2.0**-1070, i
    a = _pair(torch.rand(200, generator=generator, dtype=torch.float64) * 1e4 + 1)
    b = _pair(torch.randn(200, generator=generator, dtype=torch.float64))
    logs, quotients = dd.log(a), dd.div(a, b)
    for i in range(200):
        assert abs(_mp(logs, i) - CTX.log(_mp(a, i))) <= 2.0**-95
        want = _mp(a, i) / _mp(b, i)
        assert abs(_mp(quotients, i) - want) <= 2.0**-100 * abs(want)
    rows = _pair(torch.randn(3, 1001, generator=generator, dtype=torch.float64))
    sums = dd.total(rows)
    for r in range(3):
        want = CTX.fsum(_mp(rows, (r, j)) for j in range(1001))
        assert abs(_mp(sums, r) - want) <= 2.0**-100 * sum(abs(float(t)) for t in rows[0][r])


@pytest.mark.parametrize("chunk", [fixed.CHUNK, 16])
def test_fixed_point_products_are_exact_for_inputs_and_within_their_slack_for_double_doubles(monkeypatch, chunk):
    """Inputs of a float16 range take few limbs and multiply exactly; double-double weights of any range
    stay within the slack :func:`fixed.matmul` returns, across contraction chunks."""
    monkeypatch.setattr(fixed, "CHUNK", chunk)
    generator = torch.Generator().manual_seed(0)
    k = 100
    a = torch.randn(3, k, generator=generator, dtype=torch.float64) * torch.exp(
        torch.randn(3, k, generator=generator, dtype=torch.float64) * 5)
    b = torch.randn(k, 4, generator=generator).half().double()
    fb = fixed.fixed(b, axis=0)
    assert len(fb.limbs) < fixed.LIMBS and not bool(fb.remainder.any())
    exact_a = (a / a.abs().max() * 1000).half().double()
    (hi, lo), slack = fixed.matmul(fixed.fixed(exact_a, axis=-1), fb)
    for i in range(3):
        for c in range(4):
            want = sum(Fraction(float(exact_a[i, j])) * Fraction(float(b[j, c])) for j in range(k))
            got = Fraction(float(hi[i, c])) + Fraction(float(lo[i, c]))
            assert abs(got - want) <= abs(want) * Fraction(2) ** -104
    assert not bool(slack.any())
    weights = _pair(a)
    (hi, lo), slack = fixed.matmul(fixed.fixed(weights, axis=-1), fb)
    assert bool((slack > 0).all())
    for i in range(3):
        for c in range(4):
            want = CTX.fsum(_mp(weights, (i, j)) * CTX.mpf(float(b[j, c])) for j in range(k))
            assert abs(CTX.mpf(float(hi[i, c])) + CTX.mpf(float(lo[i, c])) - want) <= float(slack[i, c]) + 2.0**-100 * abs(want)


def _case(seed=0, heads_q=4, heads_kv=2, seqlen=40, head_dim=16):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(1, seqlen, heads_q, head_dim), (1, seqlen, heads_kv, head_dim), (1, seqlen, heads_kv, head_dim),
              (1, seqlen, heads_q, head_dim)]
    return [torch.randn(*shape, generator=generator).half() for shape in shapes]


def test_reference_rows_reproduce_the_fast_golden_and_mpmath():
    """On a causal GQA case the reference rows certify the fast path to about its float64 rounding."""
    q, k, v, dout = _case()
    problem = inputs.prepare(q, k, v, dout, softmax_scale=0.3, causal=True, window_size=(-1, -1))
    bounds = certify.certify(problem, fast.attention(problem), rows=8, precision_bits=113, seed=3)
    assert set(bounds) == {"out", "lse", "dq", "dk", "dv"}
    assert all(certify.REFERENCE_LIMIT <= value <= 2.0**-50 for value in bounds.values()), bounds


def test_a_reference_that_loses_precision_fails_its_check_against_mpmath(monkeypatch):
    """An exp that keeps only float64 accuracy (the low part dropped) is caught by the mpmath rows."""
    exact_exp = dd.exp
    monkeypatch.setattr(dd, "exp", lambda x: (dd.value(exact_exp(x)), torch.zeros_like(x[0])))
    q, k, v, dout = _case()
    with pytest.raises(GoldenError, match="reference rows disagree with mpmath"):
        golden.compute(q, k, v, dout, softmax_scale=0.3, causal=True, options=golden.GoldenOptions(method="fast"))


def test_reference_key_rows_see_every_query_head_of_the_group(monkeypatch):
    """A dK wrong by 1e-9 relative in one kv head of a GQA case is caught by the key rows."""
    original = fast.attention

    def wrong_dk(problem):
        result = original(problem)
        dk = result.dk.clone()
        dk[:, 1] *= 1 + 1e-9
        return dataclasses.replace(result, dk=dk)

    monkeypatch.setattr(fast, "attention", wrong_dk)
    q, k, v, dout = _case(seed=1)
    with pytest.raises(GoldenError, match=r"certification.*dk"):
        golden.compute(q, k, v, dout, softmax_scale=0.3, options=golden.GoldenOptions(method="fast", certify_rows=40))


def test_fingerprint_follows_every_value_and_shape():
    q, k, v, dout = _case()
    problem = inputs.prepare(q, k, v, dout, softmax_scale=0.3, causal=False, window_size=(-1, -1))
    same = inputs.prepare(q.clone(), k, v, dout, softmax_scale=0.3, causal=False, window_size=(-1, -1))
    assert inputs.fingerprint(problem) == inputs.fingerprint(same)
    nudged = v.clone()
    nudged[0, 17, 1, 3] = -nudged[0, 17, 1, 3] if nudged[0, 17, 1, 3] != 0 else 1.0
    other = inputs.prepare(q, k, nudged, dout, softmax_scale=0.3, causal=False, window_size=(-1, -1))
    forward_only = inputs.prepare(q, k, v, None, softmax_scale=0.3, causal=False, window_size=(-1, -1))
    assert len({inputs.fingerprint(p) for p in (problem, other, forward_only)}) == 3


def test_query_rows_of_a_row_that_sees_one_key():
    """A row that sees a single key: P = 1, out = v, lse = the score, dq = 0."""
    q = torch.tensor([[0.5, -1.0]], dtype=torch.float64)
    k = torch.tensor([[2.0, 1.0], [3.0, 7.0]], dtype=torch.float64)
    v = torch.tensor([[1.5, -2.0], [4.0, 4.0]], dtype=torch.float64)
    reference = dd_rows.query_rows(q, k, v, q, torch.tensor([[True, False]]), 0.5)
    assert torch.equal(dd.value(reference.values["out"]), v[:1])
    assert float(dd.value(reference.values["lse"])[0]) == 0.0
    assert torch.equal(dd.value(reference.values["dq"]), torch.zeros(1, 2, dtype=torch.float64))


def test_kv_heads_stacked_into_one_batch_give_the_bounds_of_one_batch_each(monkeypatch):
    """On CUDA the rows of several kv heads are evaluated at once over the union of their keys: the masked
    extra keys add exact zeros, so the certification's bounds are those of one batch per kv head."""
    q, k, v, dout = _case(heads_q=8, heads_kv=4)
    problem = inputs.prepare(q, k, v, dout, softmax_scale=0.3, causal=True, window_size=(-1, -1))
    served = fast.attention(problem)
    separate = certify.certify(problem, served, rows=12, precision_bits=113, seed=5)
    original = certify._batches
    counts = []

    def stacked(*args, **kwargs):
        batches = list(original(*args[:3], torch.device("cuda"), *args[4:], **kwargs))
        counts.append(len(batches))
        return batches

    monkeypatch.setattr(certify, "_batches", stacked)
    assert certify.certify(problem, served, rows=12, precision_bits=113, seed=5) == pytest.approx(separate, rel=1e-9)
    assert counts == [1, 1]


def test_exp_is_zero_below_float64s_range():
    x = torch.tensor([-746.0, -1e4, -1e12, -745.0], dtype=torch.float64)
    hi, lo = dd.exp(dd.of(x))
    assert hi[:3].tolist() == [0.0, 0.0, 0.0] and lo[:3].tolist() == [0.0, 0.0, 0.0] and 0 < float(hi[3]) < 1e-323


@pytest.mark.parametrize("spread", [8, 12])
def test_float64_inputs_over_many_binades_certify(spread):
    """float64 inputs whose values span 2**(2 spread) binades: scores far below the row's largest (exp underflows
    to 0) and first causal rows that see one key (dS exactly 0 there, in the key rows as in mpmath)."""
    generator = torch.Generator().manual_seed(spread)

    def draw(*shape):
        powers = torch.randint(-spread, spread + 1, shape, generator=generator).double()
        return torch.randn(*shape, generator=generator, dtype=torch.float64) * torch.exp2(powers)

    q, dout, k, v = draw(1, 40, 4, 16), draw(1, 40, 4, 16), draw(1, 40, 2, 16), draw(1, 40, 2, 16)
    problem = inputs.prepare(q, k, v, dout, softmax_scale=0.25, causal=True, window_size=(-1, -1))
    bounds = certify.certify(problem, fast.attention(problem), rows=32, precision_bits=113, seed=1)
    assert max(bounds.values()) <= 2.0**-45, bounds
