"""The adapters of PyTorch's other backends and FlashAttention-4, checked on the CPU.

Their kernels run on CUDA only; here each adapter's own logic runs against the
golden through a CPU stand-in of the op: the SDPA path (layout, masks as a
bias, GQA by repetition, LSE trimming, backward through autograd) around
PyTorch's CPU flash op, and the FlexAttention path (bottom-right ``mask_mod``,
``enable_gqa``, its LSE) with the uncompiled ``flex_attention``.  Their
capabilities and "cannot run here" reasons are checked as listed by
``fa2-verify kernels``.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from fa2_verify.cli.main import main
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.contract import Capabilities, visible_mask
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.core.varlen import VarlenSpec
from fa2_verify.kernels import flash_attn_4, flex_attention, sdpa_cudnn, sdpa_ops
from fa2_verify.kernels.flash_attn_4 import fa4_window
from fa2_verify.verify.check import check_case, check_spec
from fa2_verify.verify.registry import LoadedKernel, load_kernel

CPU = Capabilities(dtypes={"cpu": ("float32",)}, head_dims=(16, 32))

#: The last case leaves its first rows without a visible key: the stand-in, like the memory-efficient op on
#: CUDA, writes lse = 0 there, and the adapter must report the contract's -inf.
CASES = {
    "unmasked-gqa": dict(seqlen_q=17, seqlen_k=33, heads_q=4, heads_kv=2),
    "square-causal": dict(seqlen_q=24, seqlen_k=24, heads_q=2, heads_kv=2, causal=True),
    "bottom-right-causal-mqa": dict(seqlen_q=17, seqlen_k=40, heads_q=3, heads_kv=1, causal=True),
    "window": dict(seqlen_q=33, seqlen_k=33, heads_q=2, heads_kv=2, window_size=(5, 2)),
    "causal-rows-without-keys": dict(seqlen_q=33, seqlen_k=17, heads_q=2, heads_kv=2, causal=True),
}


def _spec(**fields) -> CaseSpec:
    return CaseSpec(batch=2, head_dim=16, dtype="float32", seed=5, **fields)


def _cpu_flash(q, k, v, bias, is_causal, softmax_scale):
    """A BHSD op with the SDPA ops' calling convention: PyTorch's CPU flash kernel (it has an autograd formula)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, is_causal, attn_mask=bias, scale=softmax_scale
    )


SDPA_ON_CPU = sdpa_ops.SdpaTarget("sdpa-on-cpu", _cpu_flash, CPU, lambda: None, dict)


@pytest.mark.parametrize("fields", CASES.values(), ids=CASES.keys())
def test_sdpa_adapter_path_matches_the_golden(fields):
    result = check_case(LoadedKernel("sdpa-on-cpu", SDPA_ON_CPU), make_case(_spec(**fields)))
    assert result.status == "passed", result.reason or result.failed_outputs()
    assert set(result.comparisons) == {"out", "lse", "dq", "dk", "dv"}


def test_sdpa_bias_is_the_bottom_right_mask_on_aligned_storage():
    q = torch.zeros(2, 3, 5, 8)
    bias, is_causal = sdpa_ops.mask_arguments(q, 21, causal=True, window_size=(4, -1))
    assert not is_causal and bias.shape == (2, 3, 5, 21)
    assert bias.stride(-2) == 32 and bias.stride(0) == bias.stride(1) == 0
    visible = visible_mask(5, 21, causal=True, window_size=(4, -1))
    assert torch.equal(bias[0, 0] == 0, visible) and bool(bias[0, 0][~visible].eq(-math.inf).all())
    assert sdpa_ops.mask_arguments(q, 5, causal=True, window_size=(-1, -1)) == (None, True)
    assert sdpa_ops.mask_arguments(q, 21, causal=False, window_size=(-1, -1)) == (None, False)


def test_sdpa_lse_is_trimmed_to_the_contract_shape():
    padded = torch.arange(2 * 3 * 32, dtype=torch.float32).reshape(2, 3, 32)
    assert torch.equal(sdpa_ops.trimmed_lse(padded, 2, 3, 17), padded[:, :, :17])
    assert torch.equal(sdpa_ops.trimmed_lse(padded[..., None], 2, 3, 17), padded[:, :, :17])


def test_sdpa_backward_limit_is_an_unsupported_case_before_the_op_runs():
    """The cuDNN target's one-query-one-key limit: the backward raises UnsupportedCase; other lengths run."""
    limited = sdpa_ops.SdpaTarget("limited", _cpu_flash, CPU, lambda: None, dict, sdpa_cudnn._backward_limit)
    one = make_case(_spec(seqlen_q=1, seqlen_k=1, heads_q=2, heads_kv=2))
    result = check_case(LoadedKernel("limited", limited), one)
    assert result.status == "unsupported" and "s_q = s_kv = 1" in result.reason
    assert sdpa_cudnn._backward_limit(1, 2) is None and sdpa_cudnn._backward_limit(2, 1) is None
    two_keys = make_case(_spec(seqlen_q=1, seqlen_k=2, heads_q=2, heads_kv=2))
    assert check_case(LoadedKernel("limited", limited), two_keys).status == "passed"


@pytest.fixture
def eager_flex(monkeypatch):
    """FlexAttention uncompiled: on the CPU, compiled FlexAttention has no LSE and no backward."""
    from torch.nn.attention.flex_attention import flex_attention as eager

    monkeypatch.setattr(flex_attention, "_compiled", lambda: eager)


class _FlexOnCpu:
    """The flex-attention adapter's forward without its CUDA requirement."""

    capabilities = Capabilities(dtypes={"cpu": ("float32",)}, head_dims=(16, 32), backward=False)

    def forward(self, q, k, v, **masking):
        return flex_attention._attention(q, k, v, **masking)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("fields", CASES.values(), ids=CASES.keys())
def test_flex_adapter_forward_matches_the_golden(eager_flex, fields):
    """Forward only: FlexAttention has no backward on the CPU, compiled or not."""
    result = check_case(LoadedKernel("flex-on-cpu", _FlexOnCpu()), make_case(_spec(backward=False, **fields)))
    assert result.status == "passed", result.reason or result.failed_outputs()
    assert set(result.comparisons) == {"out", "lse"}


def _dynamo_limits() -> tuple:
    config = torch._dynamo.config
    return config.recompile_limit, config.accumulated_recompile_limit, config.fail_on_recompile_limit_hit, config.suppress_errors


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_calls_run_under_never_eager(monkeypatch):
    """Every call of the compiled function runs with room for a run's shapes and no eager fallback;
    the process's own Dynamo settings are back afterwards."""
    from torch.nn.attention.flex_attention import flex_attention as eager

    seen = []

    def recording(*args, **kwargs):
        seen.append(_dynamo_limits())
        return eager(*args, **kwargs)

    monkeypatch.setattr(flex_attention, "_compiled", lambda: recording)
    before = _dynamo_limits()
    case = make_case(_spec(backward=False, causal=True, seqlen_q=5, seqlen_k=7, heads_q=2, heads_kv=1))
    flex_attention._attention(case.q, case.k, case.v, softmax_scale=0.25, causal=True, window_size=(-1, -1))
    never_eager = flex_attention.NEVER_EAGER
    assert seen == [(never_eager["recompile_limit"], never_eager["accumulated_recompile_limit"], True, False)]
    assert _dynamo_limits() == before


def test_never_eager_makes_the_recompile_limit_an_error():
    """What the settings buy: past the limit Dynamo raises where by default it would run the function eagerly."""
    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    with torch._dynamo.config.patch({**flex_attention.NEVER_EAGER, "recompile_limit": 1}):
        compiled(torch.ones(2))
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            compiled(torch.ones(3))


@pytest.mark.parametrize("window", [(-1, 0), (3, 1), (-1, 2), (4, -1), (0, 0)])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(7, 12), (12, 7), (9, 9)])
def test_flex_mask_mod_is_the_bottom_right_window(window, seqlen_q, seqlen_k):
    mask_mod = flex_attention.window_mask_mod(seqlen_q, seqlen_k, window)
    q_idx, kv_idx = torch.arange(seqlen_q)[:, None], torch.arange(seqlen_k)[None, :]
    expected = visible_mask(seqlen_q, seqlen_k, window_size=window)
    assert torch.equal(mask_mod(0, 0, q_idx, kv_idx).expand(seqlen_q, seqlen_k), expected)


@pytest.mark.parametrize(
    "seqlen_q, heads_q, heads_kv, declined",
    [(33, 4, 1, True), (127, 4, 2, True), (65, 2, 1, True), (64, 2, 1, False), (33, 4, 4, False),
     (127, 4, 4, False), (128, 8, 1, False), (1, 8, 1, False), (16, 8, 1, False), (17, 8, 1, True)],
)  # fmt: skip
def test_flex_declines_short_gqa_queries_whose_group_rows_exceed_128(seqlen_q, heads_q, heads_kv, declined):
    """The probe grid of docs/targets.md: 66 rows compile, 132 do not, 128 queries and up always do."""
    reason = flex_attention._group_rows_limit(seqlen_q, heads_q, heads_kv)
    assert (reason is not None) == declined
    if declined:
        assert "NoValidChoicesError" in reason and str(heads_q // heads_kv * seqlen_q) in reason


def test_flex_forward_declines_before_compiling(monkeypatch):
    """A declined shape raises UnsupportedCase with the reason, and nothing is compiled."""
    monkeypatch.setattr(flex_attention.FlexAttention, "unavailable_reason", lambda self: None)
    monkeypatch.setattr(flex_attention, "_compiled", lambda: pytest.fail("compiled a declined shape"))
    case = make_case(_spec(backward=False, seqlen_q=40, seqlen_k=40, heads_q=4, heads_kv=1))
    with pytest.raises(UnsupportedCase, match="4 x 40 = 160"):
        flex_attention.KERNEL.forward(case.q, case.k, case.v, softmax_scale=0.25)


def test_fa4_window_spells_unbounded_as_none():
    assert fa4_window(True, (-1, -1)) == (None, 0)
    assert fa4_window(False, (-1, -1)) == (None, None)
    assert fa4_window(True, (5, 3)) == (5, 0)
    assert fa4_window(False, (2, -1)) == (2, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given on a machine without CUDA")
@pytest.mark.parametrize(
    "name, reason",
    [
        ("sdpa-efficient", "needs a CUDA device"),
        ("sdpa-cudnn", "needs a CUDA device"),
        ("flex-attention", "needs a CUDA device"),
        ("flash-attn-4", "package flash-attn-4 not installed"),
    ],
)
def test_new_targets_say_why_they_cannot_run_here(name, reason, capsys):
    kernel = load_kernel(name)
    assert reason in kernel.unavailable_reason("cuda")
    assert main(["kernels", name]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.startswith(name) and f"cpu: no ({reason}" in row
    spec = _spec(seqlen_q=16, seqlen_k=16, heads_q=1, heads_kv=1)
    assert check_case(kernel, make_case(spec)).status == "unsupported"


def _fa4_stand_in(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), return_lse=False, **_):
    """flash_attn.cute.flash_attn_func as documented, in float32 PyTorch: ``None`` is an unbounded side,
    ``causal`` sets the right side to 0; returns ``(out, lse)``, lse None unless asked or needed.
    A negative bound is refused: the real function reads ``(-1, 0)`` as no mask at all (it drops a
    window whose bounds sum below zero)."""
    if any(bound is not None and bound < 0 for bound in window_size):
        raise ValueError(f"window_size={window_size}: FlashAttention-4 spells an unbounded side None")
    if causal:
        window_size = (window_size[0], 0)
    left, right = (-1 if bound is None else bound for bound in window_size)
    visible = visible_mask(q.shape[1], k.shape[1], window_size=(left, right))
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2).float() for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) * softmax_scale
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probabilities = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probabilities, v).to(q.dtype)
    return out, lse.detach() if return_lse or q.requires_grad else None


def _fa4_varlen_stand_in(q, k, v, qv=None, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         return_lse=False, **kwargs):  # fmt: skip
    """flash_attn.cute.flash_attn_varlen_func as documented: (total, heads, head_dim) inputs, keyword
    cu_seqlens (its fourth positional parameter is ``qv``), each sequence through :func:`_fa4_stand_in`;
    returns ``(out, lse)`` with lse (heads, total_q)."""
    assert qv is None, "cu_seqlens_q passed positionally lands on qv"
    outs, lses = [], []
    for index in range(len(cu_seqlens_q) - 1):
        rows = slice(int(cu_seqlens_q[index]), int(cu_seqlens_q[index + 1]))
        keys = slice(int(cu_seqlens_k[index]), int(cu_seqlens_k[index + 1]))
        assert rows.stop - rows.start <= max_seqlen_q and keys.stop - keys.start <= max_seqlen_k
        out, lse = _fa4_stand_in(q[None, rows], k[None, keys], v[None, keys], return_lse=True, **kwargs)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=-1).detach() if return_lse or q.requires_grad else None


class _Fa4OnCpu:
    """The flash-attn-4 adapter, declared for the CPU, calling the stand-in package."""

    capabilities = dataclasses.replace(CPU, varlen=True)

    def __getattr__(self, name):
        return getattr(flash_attn_4.KERNEL, name)


@pytest.fixture
def fa4_stand_in(monkeypatch):
    import types

    package = types.ModuleType("flash_attn")
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = _fa4_stand_in
    cute.flash_attn_varlen_func = _fa4_varlen_stand_in
    package.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    monkeypatch.setattr(flash_attn_4.FlashAttn4, "unavailable_reason", lambda self: None)


@pytest.mark.parametrize("fields", CASES.values(), ids=CASES.keys())
def test_fa4_adapter_passes_the_contract_through_to_flash_attn_func(fa4_stand_in, fields):
    result = check_case(LoadedKernel("fa4-on-cpu", _Fa4OnCpu()), make_case(_spec(**fields)))
    assert result.status == "passed", result.reason or result.failed_outputs()
    assert set(result.comparisons) == {"out", "lse", "dq", "dk", "dv"}


#: Packed sequences with the masks of CASES, an empty query side and an empty key side among them.
PACKED = VarlenSpec.packing(((17, 40), (33, 17), (0, 9), (8, 0), (24, 24)), heads_q=4, heads_kv=2, head_dim=16,
                            dtype="float32", seed=5)  # fmt: skip


@pytest.mark.parametrize("window", [(-1, -1), (5, 2), (3, -1)])
def test_fa4_adapter_passes_packed_sequences_through_to_flash_attn_varlen_func(fa4_stand_in, window):
    spec = dataclasses.replace(PACKED, causal=window == (-1, -1), window_size=window)
    results = check_spec(LoadedKernel("fa4-on-cpu", _Fa4OnCpu()), spec, "cpu")
    assert len(results) == len(spec.seqlens)
    for result in results:
        assert result.status == "passed", result.reason or result.failed_outputs()
        assert set(result.comparisons) == {"out", "lse", "dq", "dk", "dv"}
