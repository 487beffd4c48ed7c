"""The tiled FA2 reference kernel (kernels/reference.py) through the product's check
(:func:`fa2_verify.verify.check.check_case`: the golden and the error model): masks,
GQA/MQA, empty rows, odd sizes, all dtypes, block sizes from 1 to larger than the
sequence, eager vs deferred, poisoning; and the same kernel with a deliberate error
failing that check."""

from __future__ import annotations

import pytest
import torch

from fa2_verify.core.case import make_case
from fa2_verify.kernels.reference import DEFERRED, EAGER, TiledAttention
from fa2_verify.properties.relations import compare_runs
from tests import mutants
from tests.degraded import ScaleInBfloat16
from tests.helpers import DTYPES, MASKS, SHAPES, checked, failures, grid_spec, over_the_grid
from tests.naive import make_inputs
from fa2_verify.core.errors import UsageError
from fa2_verify.verify import error_model
from fa2_verify.verify.check import golden_for
from fa2_verify.verify.poison import poisoned

KERNELS = {
    "deferred": DEFERRED,
    "eager": EAGER,
    "blocks-larger-than-seqlen": TiledAttention(block_q=128, block_k=256),
    "blocks-1x1": TiledAttention(block_q=1, block_k=1),
    "blocks-7x5": TiledAttention(block_q=7, block_k=5),
}


@over_the_grid()
def test_reference_passes_the_check(shape, mask, dtype) -> None:
    """out, lse, dq, dk, dv of `reference` are within the error model's bounds of the golden."""
    result = checked("reference", DEFERRED, grid_spec(shape, dtype, mask))
    assert result.passed, failures(result)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_reference_with_its_scale_in_bfloat16_fails_the_check(shape, dtype) -> None:
    """The check above can fail on these cases: the same kernel with softmax_scale rounded to bfloat16 does."""
    result = checked("reference-scale-in-bf16", ScaleInBfloat16(DEFERRED), grid_spec(shape, dtype, MASKS["causal-window"]))
    assert result.status == "failed" and "lse" in result.failed_outputs(), failures(result)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask", [MASKS["none"], MASKS["causal-window"]], ids=["none", "causal-window"])
@pytest.mark.parametrize("kernel", KERNELS.values(), ids=KERNELS.keys())
def test_any_tiling_passes_the_check(kernel, mask, dtype) -> None:
    """The check passes whatever the tiling: 1x1 tiles, odd tiles, tiles larger than the sequence."""
    result = checked("reference-tiling", kernel, grid_spec(SHAPES["gqa-long-k"], dtype, mask))
    assert result.passed, failures(result)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_eager_equals_deferred(dtype) -> None:
    """FA1's eager and FA2's deferred rescaling give the same out and lse: each within tau * B of the
    exact value, so within tau * 2B of each other (the tolerance of properties.relations.compare_runs);
    deferred rescaling that skips the rescale of the output (mutants.SKIP_RESCALE) is not."""
    case = make_case(grid_spec((2, 50, 77, 4, 2, 16), dtype, {"causal": True}, softmax_scale=0.5))
    eager, deferred, skipped = (
        kernel.forward(case.q, case.k, case.v, softmax_scale=0.5, causal=True)
        for kernel in (EAGER, DEFERRED, mutants.SKIP_RESCALE)
    )
    bounds = error_model.first_order_bounds(case, golden_for(case))

    def agree(name, first, second):
        return compare_runs(name, first, second, 2 * bounds[name], threshold=error_model.THRESHOLDS[name]).passed

    assert agree("out", eager[0], deferred[0]) and agree("lse", eager[1], deferred[1])
    assert not agree("out", eager[0], skipped[0])


EMPTY_ROWS = {
    # name -> (seqlen_q, seqlen_k, mask, rows that see no key)
    "causal-more-queries": (6, 3, {"causal": True}, [0, 1, 2]),
    "narrow-window": (5, 3, {"window_size": (0, 0)}, [0, 1]),
    "no-keys": (4, 0, {}, [0, 1, 2, 3]),
}


@pytest.mark.parametrize("kernel", [DEFERRED, EAGER], ids=["deferred", "eager"])
@pytest.mark.parametrize("case", EMPTY_ROWS.values(), ids=EMPTY_ROWS.keys())
def test_empty_rows_are_zero_with_lse_minus_inf(case, kernel) -> None:
    """A row that sees no key: out = 0, lse = -inf, dq = 0, and no NaN anywhere (memory poisoned)."""
    seqlen_q, seqlen_k, mask, empty = case
    q, k, v, dout = make_inputs((2, seqlen_q, seqlen_k, 2, 1, 8), torch.float16)
    with poisoned("cpu"):
        out, lse = kernel.forward(q, k, v, softmax_scale=1.0, **mask)
        dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, softmax_scale=1.0, **mask)
    assert not any(t.isnan().any() for t in (out, lse, dq, dk, dv))
    assert torch.equal(out[:, empty], torch.zeros_like(out[:, empty]))
    assert torch.equal(dq[:, empty], torch.zeros_like(dq[:, empty]))
    assert (lse[:, :, empty] == float("-inf")).all()
    assert lse.isfinite().sum() == lse.numel() - 2 * 2 * len(empty)


def test_zero_queries() -> None:
    q, k, v, dout = make_inputs((1, 0, 5, 2, 2, 4), torch.float32)
    out, lse = DEFERRED.forward(q, k, v, softmax_scale=1.0)
    dq, dk, dv = DEFERRED.backward(dout, q, k, v, out, lse, softmax_scale=1.0)
    assert out.shape == q.shape and lse.shape == (1, 2, 0)
    assert torch.equal(dk, torch.zeros_like(k)) and torch.equal(dv, torch.zeros_like(v))


def test_every_output_element_is_written() -> None:
    """Under NaN-poisoned allocation the outputs are finite and equal the unpoisoned ones,
    while a kernel that skips its tail query block shows NaN there."""
    q, k, v, dout = make_inputs((2, 40, 37, 4, 2, 8), torch.bfloat16)
    args = {"softmax_scale": 0.5, "window_size": (9, 4)}
    plain = DEFERRED.forward(q, k, v, **args)
    plain += DEFERRED.backward(dout, q, k, v, *plain, **args)
    with poisoned("cpu"):
        out, lse = DEFERRED.forward(q, k, v, **args)
        poisoned_outputs = (out, lse, *DEFERRED.backward(dout, q, k, v, out, lse, **args))
        unwritten, _ = mutants.TAIL_BLOCK_UNWRITTEN.forward(q, k, v, **args)
    for expected, actual in zip(plain, poisoned_outputs):
        assert torch.equal(actual, expected)
    assert unwritten[:, 32:].isnan().all() and not unwritten[:, :32].isnan().any()


def test_the_check_detects_a_wrong_mask() -> None:
    """The check used above fails a kernel whose causal diagonal is off by one, in out."""
    result = checked("causal-shift", mutants.CAUSAL_SHIFT, grid_spec(SHAPES["square"], torch.float32, MASKS["causal"]))
    assert result.status == "failed" and "out" in result.failed_outputs(), failures(result)


def test_backward_is_deterministic() -> None:
    q, k, v, dout = make_inputs((2, 30, 45, 4, 2, 8), torch.float16)
    out, lse = DEFERRED.forward(q, k, v, softmax_scale=0.4, causal=True)
    first = DEFERRED.backward(dout, q, k, v, out, lse, softmax_scale=0.4, causal=True, deterministic=True)
    second = DEFERRED.backward(dout, q, k, v, out, lse, softmax_scale=0.4, causal=True, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_inputs_are_not_modified_and_no_graph_is_built() -> None:
    q, k, v, dout = make_inputs((1, 9, 11, 2, 1, 4), torch.float32)
    q.requires_grad_()
    before = [t.clone() for t in (q, k, v, dout)]
    out, lse = DEFERRED.forward(q, k, v, softmax_scale=1.0)
    DEFERRED.backward(dout, q, k, v, out, lse, softmax_scale=1.0)
    assert out.grad_fn is None and all(torch.equal(a, b) for a, b in zip(before, (q, k, v, dout)))


def test_capabilities_and_config() -> None:
    caps = DEFERRED.capabilities
    assert caps.dtypes == {"cpu": ("float16", "bfloat16", "float32", "float64"), "cuda": ("float16", "bfloat16", "float32", "float64")}
    assert caps.head_dims == tuple(range(1, 513))
    assert caps.deterministic_backward and caps.gqa and caps.window and caps.causal and not caps.varlen
    assert DEFERRED.config() == {
        "algorithm": "FlashAttention-2, tiled (plain PyTorch)",
        "rescaling": "deferred",
        "block_q": 32,
        "block_k": 16,
        "accumulate": "float32",
    }
    assert EAGER.config()["rescaling"] == "eager"
    assert repr(EAGER) == "TiledAttention(rescaling='eager', block_q=32, block_k=16, accumulate='float32')"


def _tensors(dtype=torch.float32):
    q, k, v, _ = make_inputs((1, 4, 6, 4, 2, 8), dtype)
    return q, k, v


BAD_CALLS = {
    "q-3d": (lambda q, k, v: DEFERRED.forward(q[0], k, v, softmax_scale=1.0), "q.shape=(4, 4, 8)"),
    "dtype-mix": (lambda q, k, v: DEFERRED.forward(q, k.half(), v, softmax_scale=1.0), "k.dtype=float16"),
    "head-dim": (lambda q, k, v: DEFERRED.forward(q, k[..., :4], v[..., :4], softmax_scale=1.0), "k.shape=(1, 6, 2, 4)"),
    "heads": (lambda q, k, v: DEFERRED.forward(q[:, :, :3], k, v, softmax_scale=1.0), "heads_kv=2 does not divide heads_q=3"),
    "int-dtype": (lambda q, k, v: DEFERRED.forward(q.int(), k.int(), v.int(), softmax_scale=1.0), "q.dtype=int32"),
    "lse-shape": (
        lambda q, k, v: DEFERRED.backward(q, q, k, v, q, torch.zeros(1, 4), softmax_scale=1.0),
        "lse.shape=(1, 4)",
    ),
    "dout-shape": (
        lambda q, k, v: DEFERRED.backward(q[:, :2], q, k, v, q, torch.zeros(1, 4, 4), softmax_scale=1.0),
        "dout.shape=(1, 2, 4, 8)",
    ),
    "not-a-tensor": (lambda q, k, v: DEFERRED.forward(q, k, [1.0], softmax_scale=1.0), "v is a list"),
    "block-q": (lambda q, k, v: TiledAttention(block_q=0), "block_q=0"),
    "block-k": (lambda q, k, v: TiledAttention(block_k=2.5), "block_k=2.5"),
    "accumulate": (lambda q, k, v: TiledAttention(accumulate=torch.int32), "accumulate=torch.int32"),
    "rescaling": (lambda q, k, v: TiledAttention(rescaling="lazy"), "rescaling='lazy'"),
}


@pytest.mark.parametrize("call, message", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_arguments_raise_usage_error(call, message) -> None:
    with pytest.raises(UsageError) as info:
        call(*_tensors())
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_on_cuda_passes_the_check(dtype) -> None:
    result = checked("reference", DEFERRED, grid_spec(SHAPES["gqa-long-k"], dtype, MASKS["causal-window"]), "cuda")
    assert result.passed, failures(result)
