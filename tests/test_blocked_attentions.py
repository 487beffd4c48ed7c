"""The naive and the model attentions of the comparison (verify.lowprec, verify.model_kernel), in row blocks
masked on their column bands, against the dense masked attention and against themselves in one block."""

from __future__ import annotations

import pytest
import torch

from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.contract import visible_mask
from fa2_verify.verify import error_model, lowprec, model_kernel
from tests import naive

SPECS = {
    "causal-sq>sk-gqa": dict(seqlen_q=41, seqlen_k=23, heads_q=4, heads_kv=2, causal=True),
    "window": dict(seqlen_q=50, seqlen_k=64, heads_q=2, heads_kv=2, window_size=(9, 3)),
    "diagonal-top-left": dict(seqlen_q=30, seqlen_k=12, heads_q=3, heads_kv=1, window_size=(0, 0),
                              causal_alignment="top_left"),
    "unmasked": dict(seqlen_q=20, seqlen_k=37, heads_q=2, heads_kv=1),
}


def _case(name: str):
    spec = CaseSpec(batch=2, head_dim=16, dtype="float16", seed=7, backward=True, **SPECS[name])
    return make_case(spec, "cpu")


def _visible(spec: CaseSpec) -> torch.Tensor:
    return visible_mask(spec.seqlen_q, spec.seqlen_k, causal=spec.causal, window_size=spec.window_size,
                        alignment=spec.causal_alignment)


def _dense(case):
    """``out``, ``lse``, ``dq``, ``dk``, ``dv`` of the dense masked attention in float64 (:mod:`tests.naive`)."""
    spec = case.spec
    mask = {"softmax_scale": spec.scale, "causal": spec.causal, "window_size": spec.window_size,
            "alignment": spec.causal_alignment}
    out, lse = naive.attention(case.q, case.k, case.v, **mask)
    dq, dk, dv = naive.attention_grads(case.dout, case.q, case.k, case.v, **mask)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


@pytest.mark.parametrize("attention", [lowprec.naive_attention, model_kernel.model_attention],
                         ids=["naive", "model"])
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("work", [40, 10**6])
def test_blocked_attentions_are_the_masked_attention_in_the_case_dtype(monkeypatch, attention, name, work):
    """In blocks of a few rows (a budget of 40 scores) or one, every output is the dense masked attention's to
    the case dtype's rounding, rows that see no key give out 0, dq 0 and lse -inf, and the model's logit_max is
    max |S_ij| over the visible keys (0 for a row that sees none)."""
    monkeypatch.setitem(error_model.WORK_ELEMENTS, "cpu", work)
    case = _case(name)
    result, dense = attention(case), _dense(case)
    for output in ("out", "dq", "dk", "dv"):
        torch.testing.assert_close(result[output].double(), dense[output], rtol=2e-2, atol=2e-2, msg=output)
    assert torch.equal(torch.isinf(result["lse"]), torch.isinf(dense["lse"]))
    finite = torch.isfinite(dense["lse"])
    torch.testing.assert_close(result["lse"].double()[finite], dense["lse"][finite], rtol=1e-2, atol=1e-2)
    visible = _visible(case.spec)
    empty = ~visible.any(-1)
    assert not bool(result["out"][:, empty].any()) and not bool(result["dq"][:, empty].any())
    if "logit_max" in result:
        group = case.spec.heads_q // case.spec.heads_kv
        scores = (case.q.float().transpose(1, 2) @ case.k.float().transpose(1, 2).repeat_interleave(group, 1).mT
                  * case.spec.scale).abs()
        torch.testing.assert_close(result["logit_max"], scores.masked_fill(~visible, 0.0).amax(-1))


@pytest.mark.parametrize("attention", [lowprec.naive_attention, model_kernel.model_attention],
                         ids=["naive", "model"])
def test_a_chunk_of_batches_gives_the_outputs_of_one_batch_at_a_time(monkeypatch, attention):
    """Many short sequences (9 batches of 3 x 5 scores) in one chunk give bitwise the outputs of a loop over the
    batches, on the CPU."""
    spec = CaseSpec(batch=9, seqlen_q=3, seqlen_k=5, heads_q=4, heads_kv=2, head_dim=16, dtype="bfloat16", seed=3,
                    backward=True, causal=True)
    case = make_case(spec, "cpu")
    _, blocks = lowprec.blocked_buffers(case)
    assert lowprec.batch_chunks(case, blocks) == [slice(0, 9)]
    chunked = attention(case)
    monkeypatch.setattr(lowprec, "batch_chunks", lambda case, blocks: [slice(b, b + 1) for b in range(case.spec.batch)])
    monkeypatch.setattr(model_kernel, "batch_chunks", lowprec.batch_chunks)
    for name, single in attention(case).items():
        assert torch.equal(chunked[name], single), name
