"""benchmarks/sensitivity.py on a tiny CPU configuration: every bug class tabled, the dropped-key outputs
exact, and a large planted bug caught by fa2-verify's worst-case verdict."""

from __future__ import annotations

import torch

from benchmarks import sensitivity
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.verify.check import golden_for
from fa2_verify.verify.registry import load_kernel


def _attention_without(case, keys: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """out and lse, float64, of the case's attention with ``keys`` masked, straight from the definition."""
    spec = case.spec
    group = spec.heads_q // spec.heads_kv
    q = case.q.double()[0].transpose(0, 1)
    k = case.k.double()[0].transpose(0, 1).repeat_interleave(group, 0)
    v = case.v.double()[0].transpose(0, 1).repeat_interleave(group, 0)
    first, last = spec.visible_ranges()
    index = torch.arange(spec.seqlen_k)
    visible = (index >= first[:, None]) & (index <= last[:, None])
    visible &= (index < keys.start) | (index >= keys.stop)
    logits = torch.where(visible, q @ k.mT * spec.scale, float("-inf"))
    lse = torch.logsumexp(logits, -1)
    probs = torch.where(visible, torch.exp(logits - lse[..., None].nan_to_num(neginf=0.0)), 0.0)
    return (probs @ v).transpose(0, 1)[None], lse[None]


def test_without_keys_equals_attention_computed_without_them():
    spec = CaseSpec(batch=1, seqlen_q=8, seqlen_k=20, heads_q=2, heads_kv=1, head_dim=8, dtype="float16",
                    causal=True, seed=3)
    case = make_case(spec)
    golden = golden_for(case)
    for keys in (slice(5, 6), slice(3, 9), slice(0, 13)):  # the last leaves row 0 without a key
        out, lse = sensitivity.without_keys(case, golden, keys)
        want_out, want_lse = _attention_without(case, keys)
        torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    assert lse[0, 0, 0] == float("-inf") and bool((out[0, 0] == 0).all())


def test_tiny_cpu_table_has_every_bug_class_and_catches_a_large_noise():
    config = sensitivity.Config(128, "float16", False)
    setting = sensitivity.Setting(load_kernel("reference"), config.spec(128), "cpu")
    assert all(how == "" for how in setting.verdicts({}).values())  # the correct outputs pass every rule
    *_, (multiple, changed) = setting.noise("row")
    assert multiple == 64
    assert "worst-case" in setting.verdicts(changed, ("fa2-verify",))["fa2-verify"]

    baseline, rows = sensitivity.config_rows(setting, config.label())
    assert [row[0] for row in rows] == list(setting.bugs())
    assert baseline[2:] == ["passes"] * len(sensitivity.RULES)
    assert rows[[row[0] for row in rows].index("(b) keys past 2^16 dropped")][2:] == ["n/a"] * len(sensitivity.RULES)
    text = sensitivity.markdown("cpu", "python -m benchmarks.sensitivity", [baseline], rows)
    assert all(bug in text for bug in setting.bugs())
