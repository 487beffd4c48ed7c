"""The building blocks of the metamorphic and determinism properties, checked directly.

Each transformation does exactly what its relation needs (checked in exact
arithmetic on the rounded tensors), the run comparison never lets NaN pass,
and the dQ spread bound holds for random summation orders yet is not vacuous.
"""

from __future__ import annotations

import math

import pytest
import torch

from fa2_verify import golden
from fa2_verify.core import layouts
from fa2_verify.properties import determinism, relations
from fa2_verify.properties.determinism import dq_spread_bound, key_blocks
from fa2_verify.core.varlen import VarlenSpec, pack
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.errors import UsageError
from fa2_verify.kernels.reference import DEFERRED
from fa2_verify.verify.kernel_call import KernelFailure, run_case, run_varlen
from fa2_verify.verify.registry import LoadedKernel
from tests import breakers


def _case(**overrides) -> CaseSpec:
    fields = dict(batch=2, seqlen_q=7, seqlen_k=11, heads_q=4, heads_kv=2, head_dim=8, dtype="bfloat16", seed=3)
    return make_case(CaseSpec(**{**fields, **overrides}))


def _scores(case) -> torch.Tensor:
    group = case.spec.heads_q // case.spec.heads_kv
    keys = case.k.double().repeat_interleave(group, dim=2)
    return case.spec.scale * torch.einsum("bihc,bjhc->bhij", case.q.double(), keys)


@pytest.mark.parametrize("scale", [None, 2.0**-6, 4.0, 0.3])
def test_score_shift_is_exact_per_row(scale):
    base, shifted, shift = relations.shift_scores(_case(softmax_scale=scale))
    scale = base.spec.scale
    unscaled = (_scores(shifted) - _scores(base)) / scale
    steps = (shift / scale).unsqueeze(-1).expand_as(unscaled)
    assert torch.equal(unscaled.round(), steps.round()) and torch.allclose(unscaled, steps, rtol=1e-12, atol=0)
    assert float(shift.abs().max()) >= 1


def test_key_permutation_moves_keys_and_values_together():
    case = _case()
    permuted, permutation = relations.permute_keys(case)
    assert torch.equal(permuted.k, case.k[:, permutation]) and torch.equal(permuted.v, case.v[:, permutation])
    assert not torch.equal(permutation, torch.arange(case.spec.seqlen_k))


def test_replace_except_keeps_exactly_one_batch_element_or_head():
    case, other = _case(), _case(seed=4)
    by_batch = relations.replace_except(case, other, batch=1)
    assert torch.equal(by_batch.q[1], case.q[1]) and torch.equal(by_batch.q[0], other.q[0])
    by_head = relations.replace_except(case, other, head=3)
    assert torch.equal(by_head.q[:, :, 3], case.q[:, :, 3]) and torch.equal(by_head.k[:, :, 1], case.k[:, :, 1])
    assert torch.equal(by_head.q[:, :, 2], other.q[:, :, 2]) and torch.equal(by_head.k[:, :, 0], other.k[:, :, 0])


def test_repeat_kv_and_group_sum_invert_each_other():
    case = _case()
    mha = relations.repeat_kv(case)
    assert mha.spec.heads_kv == mha.spec.heads_q == 4 and torch.equal(mha.k[:, :, 2], case.k[:, :, 1])
    assert torch.equal(relations.group_sum(mha.k.double(), 2), 2 * case.k.double())


def test_causal_prefix_keeps_the_diagonal():
    prefix = relations.causal_prefix(_case(causal=True), 3)
    assert (prefix.spec.seqlen_q, prefix.spec.seqlen_k) == (3, 7) and prefix.q.is_contiguous()


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_layouts_are_the_same_values_in_other_memory(layout):
    tensor = _case().q
    arranged = layouts.to_layout(tensor, layout)
    assert torch.equal(arranged, tensor) and arranged.stride(-1) == 1
    # unaligned-offset has contiguous strides; what it changes is the data pointer's alignment
    assert arranged.is_contiguous() == (layout in ("contiguous", "unaligned-offset"))
    assert (arranged.data_ptr() % 16 != 0) == (layout == "unaligned-offset")


def _outside(tensor: torch.Tensor) -> torch.Tensor:
    """The elements of ``tensor``'s storage that it does not cover."""
    flat = tensor.new_empty(0).set_(tensor.untyped_storage())
    covered = torch.zeros(flat.numel(), dtype=torch.bool)
    covered.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset()).fill_(True)
    return flat[~covered]


@pytest.mark.parametrize("layout", layouts.LAYOUTS + layouts.JOINT_LAYOUTS)
def test_every_layout_holds_nan_before_after_and_between_its_elements(layout):
    """A read outside a tensor (a tile past seqlen_k, flash-attn #2374) reads NaN, whatever the layout."""
    case = _case()
    laid = layouts.in_layout(case, layout)
    for name in ("q", "k", "v", "dout"):
        tensor = getattr(laid, name)
        assert tensor.storage_offset() > 0 and tensor.stride(-1) == 1, name
        outside = _outside(tensor)
        if layout == "packed-qkv" and name in ("q", "k", "v"):  # the other two tensors share the storage
            others = sum(getattr(laid, t).numel() for t in ("q", "k", "v") if t != name)
            assert outside.isnan().sum() == outside.numel() - others, name
        else:
            assert outside.numel() > 0 and outside.isnan().all(), name
    assert laid.out_layout == (layout if layout in layouts.LAYOUTS else "contiguous")


def test_joint_layouts_share_storage_or_broadcast_kv():
    case = _case(seqlen_k=7, heads_kv=4)
    packed = layouts.in_layout(case, "packed-qkv")
    assert packed.q.untyped_storage().data_ptr() == packed.k.untyped_storage().data_ptr() == packed.v.untyped_storage().data_ptr()
    assert packed.q.stride() == packed.k.stride() == (7 * 12 * 8, 12 * 8, 8, 1)  # (B, S, 3, H, D) sliced
    assert torch.equal(packed.q, case.q) and torch.equal(packed.k, case.k) and torch.equal(packed.v, case.v)
    for layout, dim in (("kv-expanded-batch", 0), ("kv-expanded-heads", 2)):
        laid = layouts.in_layout(case, layout)
        assert laid.k.stride(dim) == laid.v.stride(dim) == 0 and torch.equal(laid.q, case.q)
        contiguous = layouts.in_layout(laid, "contiguous")  # what the layout property compares with
        assert contiguous.k.is_contiguous() and torch.equal(contiguous.k, laid.k)
        assert torch.equal(contiguous.v.narrow(dim, 1, 1), case.v.narrow(dim, 0, 1))


def test_backward_is_handed_out_in_the_case_layout():
    seen = {}

    class Recording(type(DEFERRED)):
        def backward(self, dout, q, k, v, out, lse, **options):
            seen["out"] = (out.stride(), out.storage_offset())
            return super().backward(dout, q, k, v, out, lse, **options)

    kernel = LoadedKernel("recording", Recording())
    case = make_case(CaseSpec(batch=2, seqlen_q=5, seqlen_k=5, heads_q=2, heads_kv=2, head_dim=8, dtype="float32",
                              backward=True))
    run_case(kernel, case)
    assert seen["out"] == (case.q.stride(), 0)  # no layout named: a plain copy
    run_case(kernel, layouts.in_layout(case, "outer-stride"))
    assert seen["out"][0] == layouts.in_layout(case, "outer-stride").q.stride() and seen["out"][1] > 0


def test_pack_refuses_a_layout_that_changes_values():
    spec = VarlenSpec.packing(((3, 4), (2, 5)), heads_q=2, heads_kv=2, head_dim=8, dtype="float32")
    assert pack(spec, "cpu", "packed-qkv").v.stride(0) == 6 * 8
    with pytest.raises(ValueError, match="kv-expanded-heads"):
        pack(spec, "cpu", "kv-expanded-heads")


def test_compare_runs_never_passes_nan():
    first = torch.tensor([1.0, math.nan, 2.0, math.nan])
    second = torch.tensor([1.0, math.nan, math.nan, 5.0])
    comparison = relations.compare_runs("out", first, second, torch.ones(4), threshold=1.0)
    assert comparison.mismatches == 3 and not comparison.passed


def test_compare_runs_applies_the_tolerance():
    first, second = torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0])
    assert relations.compare_runs("out", first, second, torch.tensor([0.5, 0.5]), threshold=1.0).passed
    assert not relations.compare_runs("out", first, second, torch.tensor([0.4, 0.5]), threshold=1.0).passed


def test_key_blocks_counts_touched_tiles():
    visible = torch.tensor([0.0, 1.0, 16.0, 17.0, 40.0])
    assert key_blocks(visible, None).tolist() == visible.tolist()
    assert key_blocks(visible, 16).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dq_spread_bound_holds_for_random_orders_and_is_not_vacuous(dtype):
    case = _case(dtype=dtype, seqlen_q=20, seqlen_k=130, batch=1, head_dim=16, generator="normal-x2^2")
    golden_result = golden.compute(case.q, case.k, case.v, case.dout, softmax_scale=case.spec.scale)
    scale = case.spec.scale
    out, lse = DEFERRED.forward(case.q, case.k, case.v, softmax_scale=scale)
    torch.manual_seed(0)
    runs = [
        breakers.RANDOM_ORDER_DQ.backward(case.dout, case.q, case.k, case.v, out, lse, softmax_scale=scale)[0]
        for _ in range(6)
    ]
    bound = dq_spread_bound(case, golden_result, runs, block_k=16)
    spreads = torch.stack([(run.double() - runs[0].double()).abs() for run in runs[1:]])
    assert bool((spreads <= bound).all())
    if dtype == "float32":
        assert float(spreads.max()) > 0 and float((spreads / bound).max()) > 1e-3


@pytest.mark.parametrize(
    "mask", [{}, {"causal": True}, {"window_size": (3, 2)}, {"window_size": (-1, 0)}], ids=["none", "causal", "window", "right-0"]
)
def test_dq_spread_bound_is_the_same_in_any_row_blocks(monkeypatch, mask):
    """Row blocks of one query and the whole head in one block give the same bound (GQA, masks, seqlen_q != seqlen_k)."""
    case = _case(dtype="float16", seqlen_q=9, seqlen_k=13, backward=True, **mask)
    golden_result = golden.compute(
        case.q, case.k, case.v, case.dout, softmax_scale=case.spec.scale, causal=case.spec.causal,
        window_size=case.spec.window_size,
    )
    runs = [golden_result.dq.to(torch.float16)]
    whole = dq_spread_bound(case, golden_result, runs, block_k=4)
    monkeypatch.setitem(determinism.BLOCK_ELEMENTS, "cpu", 1)
    assert torch.allclose(dq_spread_bound(case, golden_result, runs, block_k=4), whole, rtol=1e-13, atol=0)


def test_pack_lays_sequences_end_to_end_with_empty_ones():
    spec = VarlenSpec.packing(((3, 0), (0, 4), (2, 5)), heads_q=2, heads_kv=1, head_dim=8, dtype="float16")
    assert (spec.batch, spec.seqlen_q, spec.seqlen_k) == (3, 3, 5)
    assert spec.sequence(1) == CaseSpec(
        batch=1, seqlen_q=0, seqlen_k=4, heads_q=2, heads_kv=1, head_dim=8, dtype="float16", seed=1
    )
    packed = pack(spec, "cpu")
    assert packed.cu_seqlens_q.tolist() == [0, 3, 3, 5] and packed.cu_seqlens_k.tolist() == [0, 0, 4, 9]
    assert packed.q.shape == (5, 2, 8) and packed.k.shape == (9, 1, 8)
    rows_q, rows_k = packed.rows(2)
    assert torch.equal(packed.q[rows_q], make_case(spec.sequence(2)).q[0])
    assert torch.equal(packed.k[rows_k], make_case(spec.sequence(2)).k[0])


def test_a_varlen_spec_whose_sizes_disagree_with_its_seqlens_is_a_usage_error():
    with pytest.raises(UsageError, match=r"seqlens=\[\[3, 0\]\] does not match batch=2"):
        VarlenSpec(batch=2, seqlen_q=3, seqlen_k=0, heads_q=1, heads_kv=1, head_dim=8, dtype="float16", seqlens=((3, 0),))


class _VarlenWriter:
    """Varlen entry points with the right shapes that write into the input named ``written``."""

    capabilities = DEFERRED.capabilities

    def __init__(self, written: str) -> None:
        self.written = written

    def forward_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **masking):
        if self.written == "cu_seqlens_k":
            cu_seqlens_k[-1] -= 1
        return torch.zeros_like(q), torch.zeros(q.shape[1], q.shape[0])

    def backward_varlen(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **masking):
        if self.written == "out":
            out.fill_(1.0)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


@pytest.mark.parametrize(
    "written, message",
    [("cu_seqlens_k", "forward_varlen modified its input cu_seqlens_k in place"), ("out", "backward_varlen modified its input out in place")],
)
def test_varlen_entry_points_must_leave_their_inputs_alone(written, message):
    spec = VarlenSpec.packing(((3, 2), (2, 5)), heads_q=2, heads_kv=1, head_dim=8, dtype="float32")
    with pytest.raises(KernelFailure, match=message):
        run_varlen(LoadedKernel("writer", _VarlenWriter(written)), pack(spec, "cpu"), backward=True)
