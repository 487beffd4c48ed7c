"""The ``torch-flash`` adapter (kernels/torch_flash.py): PyTorch's CPU flash
kernel through the product's check (:func:`fa2_verify.verify.check.check_case`:
the contract's layout, bottom-right masks, GQA, LSE, empty rows, against the
golden under the error model), the same kernel with a deliberate error failing
that check, the cases it refuses, and the CUDA call plumbing (checked on the
meta device here; on a GPU by the ``gpu`` tests)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from fa2_verify.kernels import torch_flash
from fa2_verify.core.contract import heads_first, visible_mask
from fa2_verify.kernels.torch_flash import KERNEL
from tests.degraded import ScaleInBfloat16
from tests.naive import make_inputs
from tests.helpers import DTYPES, MASKS, SHAPES, checked, failures, grid_spec, over_the_grid
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.verify.poison import poisoned
from fa2_verify.verify.registry import load_kernel


#: The dtypes whose lse PyTorch's CPU kernel computes in float32 or better, and the 16-bit ones.
EXACT_LSE_DTYPES = (torch.float64, torch.float32)
HALF_DTYPES = (torch.float16, torch.bfloat16)


@over_the_grid(EXACT_LSE_DTYPES)
def test_cpu_passes_the_check(shape, mask, dtype) -> None:
    """out, lse, dq, dk, dv through the adapter are within the error model's bounds of the golden."""
    result = checked("torch-flash", KERNEL, grid_spec(shape, dtype, mask))
    assert result.passed, failures(result)


def _half_precision_verdict(result) -> bool:
    """For 16-bit inputs PyTorch's CPU kernel computes lse to only about 1e-5 relative, outside the FA2
    model (kernels/torch_flash.py; docs/benchmarks.md).  So: out within its bounds, lse free, and the
    backward, which recomputes ``P = exp(S - lse)`` from that lse, within its bounds scaled by the lse's
    excess ``r = max(1, max normalized error of lse)``.  Each gradient bound (docs/error-model.md, eqs. 4
    and 6 to 9) is a sum of non-negative terms in which the lse error enters only through
    ``E_ij = Delta_ij + B^L_i + ...``; an lse error of ``r B^L_i`` scales no term by more than ``r``.
    Handed an accurate lse, the backward is held to the plain bounds (:class:`_Float32Lse`).
    """
    if result.status not in ("passed", "failed") or not result.comparisons["out"].passed:
        return False
    lse_excess = max(1.0, result.comparisons["lse"].normalized.quantiles["max"])
    return all(result.comparisons[name].normalized.quantiles["max"] <= lse_excess for name in ("dq", "dk", "dv"))


@over_the_grid(HALF_DTYPES)
def test_cpu_16_bit_passes_the_check_but_its_lse(shape, mask, dtype) -> None:
    """The check's verdict on 16-bit inputs, with the lse outside the model (:func:`_half_precision_verdict`)."""
    result = checked("torch-flash", KERNEL, grid_spec(shape, dtype, mask))
    assert _half_precision_verdict(result), failures(result)


class _Float32Lse:
    """torch-flash with the lse of its float32 call on the same inputs upcast: the 16-bit backward handed an
    lse within the model, its out and everything else its own."""

    capabilities = KERNEL.capabilities

    def config(self):
        return KERNEL.config()

    def forward(self, q, k, v, **options):
        out, _ = KERNEL.forward(q, k, v, **options)
        _, lse = KERNEL.forward(q.float(), k.float(), v.float(), **options)
        return out, lse

    def backward(self, *args, **kwargs):
        return KERNEL.backward(*args, **kwargs)


@over_the_grid(HALF_DTYPES)
def test_cpu_16_bit_backward_passes_the_check_given_a_float32_lse(shape, mask, dtype) -> None:
    """Every output within its plain bounds, dV and dK with the partial sums PyTorch rounds to the dtype
    between query blocks (docs/error-model.md, eqs. 7b and 9b; without them dv reached 1.08 times its bound)."""
    result = checked("torch-flash-float32-lse", _Float32Lse(), grid_spec(shape, dtype, mask))
    assert result.passed, failures(result)


@pytest.mark.parametrize(
    "shape, mask",
    [((1, 40, 1100, 2, 1, 16), MASKS["none"]), ((1, 200, 300, 2, 2, 16), MASKS["causal"])],
    ids=["dq-in-512-key-blocks", "dkv-in-64-row-blocks"],
)
def test_cpu_16_bit_backward_passes_the_check_in_its_larger_blocks(shape, mask) -> None:
    """Past 512 keys dq is rounded between key blocks (eq. 8b); from seqlen_q 192 PyTorch takes 64-row blocks."""
    result = checked("torch-flash-float32-lse", _Float32Lse(), grid_spec(shape, torch.float16, mask))
    assert result.passed, failures(result)


class _Float32LseUndeclared(_Float32Lse):
    """:class:`_Float32Lse` without ``config()["partial_sums"]``: checked as a FlashAttention-2 kernel."""

    def config(self):
        return {key: value for key, value in KERNEL.config().items() if key != "partial_sums"}


def test_cpu_16_bit_dv_fails_the_check_without_its_partial_sums_declared() -> None:
    """The term of eq. 7b is what admits PyTorch's dv: without it this grid case fails (dv about 1.09; over
    the grid's other cases and seeds it reaches 0.7 to 1.09 times the bound without the term)."""
    result = checked("torch-flash-undeclared", _Float32LseUndeclared(), grid_spec(SHAPES["square"], torch.float16, MASKS["causal"]))
    assert result.failed_outputs() == ["dv"], failures(result)


class _DvRoundedEveryRow(_Float32Lse):
    """:class:`_Float32Lse` with dv accumulated in the input dtype one query row at a time (heads in order),
    rounded 32 times as often as the partial sums it declares; P as PyTorch's, float32 rounded to the dtype."""

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(-1, -1), **options):
        dq, dk, dv = KERNEL.backward(
            dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal, window_size=window_size, **options
        )
        group = q.shape[2] // k.shape[2]
        visible = visible_mask(q.shape[1], k.shape[1], causal=causal, window_size=window_size)
        logits = softmax_scale * torch.einsum("bihc,bjhc->bhij", q.float(), k.float().repeat_interleave(group, dim=2))
        p = torch.where(visible, torch.exp(logits - lse[..., None]), 0.0).to(q.dtype).float()
        dv = torch.zeros_like(dv)
        for head, row in itertools.product(range(q.shape[2]), range(q.shape[1])):
            partial = dv[:, :, head // group].float() + p[:, head, row, :, None] * dout[:, row, None, head].float()
            dv[:, :, head // group] = partial.to(dv.dtype)
        return dq, dk, dv


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_cpu_16_bit_dv_rounded_every_query_row_fails_the_check(dtype) -> None:
    """The partial-sum term admits the roundings declared, not more: dv rounded after every row fails
    (normalized 1.6 in float16, 2.2 in bfloat16, against 0.54 and 0.61 for PyTorch's own dv)."""
    result = checked("torch-flash-dv-every-row", _DvRoundedEveryRow(), grid_spec(SHAPES["square"], dtype, MASKS["none"]))
    assert result.failed_outputs() == ["dv"], failures(result)


class _DqTooLarge:
    """torch-flash with dq 2^-3 relative too large, as a kernel applying part of the softmax scale twice."""

    capabilities = KERNEL.capabilities

    def forward(self, *args, **kwargs):
        return KERNEL.forward(*args, **kwargs)

    def backward(self, *args, **kwargs):
        dq, dk, dv = KERNEL.backward(*args, **kwargs)
        return (dq * 1.125).to(dq.dtype), dk, dv


@pytest.mark.parametrize("shape", [SHAPES["square"], SHAPES["gqa-long-k"]], ids=["square", "gqa-long-k"])
def test_cpu_16_bit_verdict_fails_a_wrong_dq(shape) -> None:
    """The 16-bit verdict above can fail: dq 12.5% too large is caught in float16 (dq's normalized error
    about 40 to 50, over an lse excess of 2 to 13 on these cases)."""
    result = checked("torch-flash-dq-too-large", _DqTooLarge(), grid_spec(shape, torch.float16, MASKS["causal"]))
    assert not _half_precision_verdict(result), failures(result)


@pytest.mark.parametrize("dtype", EXACT_LSE_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_cpu_with_its_scale_in_bfloat16_fails_the_check(shape, dtype) -> None:
    """The check above can fail on these cases: the same kernel with softmax_scale rounded to bfloat16 does."""
    result = checked("torch-flash-scale-in-bf16", ScaleInBfloat16(KERNEL), grid_spec(shape, dtype, MASKS["causal-window"]))
    assert result.status == "failed" and "lse" in result.failed_outputs(), failures(result)


class _TopLeftCausal:
    """PyTorch's CPU flash op with its own ``is_causal`` (top-left aligned), forward only."""

    capabilities = KERNEL.capabilities

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1)):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            *map(heads_first, (q, k, v)), 0.0, causal, scale=softmax_scale
        )
        return heads_first(out), lse.float()


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(20, 50), (50, 20)])
def test_cpu_causal_is_bottom_right_aligned(seqlen_q, seqlen_k) -> None:
    """With seqlen_q != seqlen_k the adapter's causal mask is the contract's: it passes the check, and
    PyTorch's top-left ``is_causal`` fails it in out."""
    spec = grid_spec((1, seqlen_q, seqlen_k, 2, 2, 8), torch.float64, {"causal": True})
    result = checked("torch-flash", KERNEL, spec)
    assert result.passed, failures(result)
    top_left = checked("torch-flash-top-left", _TopLeftCausal(), dataclasses.replace(spec, backward=False))
    assert top_left.status == "failed" and "out" in top_left.failed_outputs(), failures(top_left)


def test_cpu_empty_rows() -> None:
    """A row that sees no key: out = 0, lse = -inf (PyTorch writes 0), dq = 0, no NaN under poisoning."""
    q, k, v, dout = make_inputs((2, 6, 3, 4, 2, 8), torch.bfloat16)
    with poisoned("cpu"):
        out, lse = KERNEL.forward(q, k, v, softmax_scale=0.5, causal=True)
        dq, dk, dv = KERNEL.backward(dout, q, k, v, out, lse, softmax_scale=0.5, causal=True)
    assert not any(t.isnan().any() for t in (out, lse, dq, dk, dv))
    assert (out[:, :3] == 0).all() and (dq[:, :3] == 0).all()
    assert (lse[:, :, :3] == -math.inf).all() and lse[:, :, 3:].isfinite().all()


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(0, 4), (4, 0)])
def test_cpu_refuses_empty_sequences(seqlen_q, seqlen_k) -> None:
    """PyTorch's CPU kernel kills the process on an empty sequence: the adapter refuses first."""
    q, k, v, dout = make_inputs((1, seqlen_q, seqlen_k, 1, 1, 8), torch.float32)
    with pytest.raises(UnsupportedCase, match=f"seqlen_q={seqlen_q}, seqlen_k={seqlen_k}"):
        KERNEL.forward(q, k, v, softmax_scale=1.0)
    with pytest.raises(UnsupportedCase, match="SIGFPE"):
        KERNEL.backward(dout, q, k, v, dout, torch.zeros(1, 1, seqlen_q), softmax_scale=1.0)


def test_outside_capabilities_is_unsupported() -> None:
    q, k, v, _ = make_inputs((1, 4, 4, 2, 2, 600), torch.float32)
    with pytest.raises(UnsupportedCase, match="torch-flash: head_dim=600 is not supported on cpu"):
        KERNEL.forward(q, k, v, softmax_scale=1.0)


@pytest.mark.parametrize("head_dim, supported", [(64, True), (256, True), (12, False), (264, False), (600, False)])
def test_cuda_head_dims_are_declared_per_device(head_dim, supported) -> None:
    reason = KERNEL.capabilities.unsupported_reason(device="cuda", dtype="float16", head_dim=head_dim)
    assert (reason is None) == supported
    if not supported:
        assert reason == f"head_dim={head_dim} is not supported on cuda"
    assert KERNEL.capabilities.unsupported_reason(device="cpu", dtype="float16", head_dim=12) is None


@pytest.mark.parametrize("window, causal", [((-1, -1), False), ((-1, 0), True), ((3, 1), False)])
def test_cuda_call_plumbing_on_meta_device(window, causal) -> None:
    """The CUDA ops accept the adapter's arguments (GQA, windows, no cu_seqlens) and return contract shapes."""
    q = torch.empty(2, 5, 4, 64, dtype=torch.float16, device="meta")
    k = torch.empty(2, 7, 2, 64, dtype=torch.float16, device="meta")
    out, lse = torch_flash.cuda_forward(q, k, k, softmax_scale=0.125, window=window, causal=causal)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == (q.shape, q.dtype, (2, 4, 5), torch.float32)
    dq, dk, dv = torch_flash.cuda_backward(q, q, k, k, out, lse, softmax_scale=0.125, window=window, causal=causal)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)


# (seqlen_q, seqlen_k, window) -> the window flash-attn applies, and whether its mask differs
CUDA_WINDOWS = {
    "right-unbounded-long-q": (3, 1, (0, -1), (0, 1), True),  # seen on an H200: rows 0, 1 lost their key
    "right-unbounded-long-q-2": (5, 2, (0, -1), (0, 2), True),
    "right-at-seqlen_k": (6, 2, (1, 3), (1, 2), True),
    "right-unbounded-q-one-longer": (3, 2, (0, -1), (0, 2), False),
    "right-unbounded-short-q": (4, 9, (2, -1), (2, 9), False),
    "left-unbounded": (9, 2, (-1, 0), (2, 0), False),
    "both-too-large": (7, 3, (5, 4), (-1, -1), True),
    "none": (7, 3, (-1, -1), (-1, -1), False),
    "inside": (8, 8, (2, 1), (2, 1), False),
}


@pytest.mark.parametrize("seqlen_q, seqlen_k, window, applied, differs", CUDA_WINDOWS.values(), ids=CUDA_WINDOWS.keys())
def test_cuda_windows_the_op_cannot_apply_are_unsupported(seqlen_q, seqlen_k, window, applied, differs) -> None:
    assert torch_flash.cuda_op_window(seqlen_q, seqlen_k, window) == applied
    reason = torch_flash.cuda_window_unsupported_reason(seqlen_q, seqlen_k, window)
    assert (reason is not None) == differs
    if differs:
        assert f"applies window {applied}" in reason


def test_cuda_window_check_agrees_with_comparing_the_masks() -> None:
    """Every window of every small shape: unsupported exactly when the applied mask differs."""
    for seqlen_q, seqlen_k in itertools.product(range(7), range(1, 7)):
        for window in itertools.product(range(-1, 8), repeat=2):
            applied = torch_flash.cuda_op_window(seqlen_q, seqlen_k, window)
            differs = not torch.equal(
                visible_mask(seqlen_q, seqlen_k, window_size=window), visible_mask(seqlen_q, seqlen_k, window_size=applied)
            )
            assert (torch_flash.cuda_window_unsupported_reason(seqlen_q, seqlen_k, window) is not None) == differs


def test_deterministic_mode_is_restored() -> None:
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    with torch_flash._deterministic_algorithms(True):
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) == before


def test_cpu_backward_is_deterministic() -> None:
    q, k, v, dout = make_inputs((2, 70, 90, 4, 2, 16), torch.float32)
    out, lse = KERNEL.forward(q, k, v, softmax_scale=0.25, window_size=(20, 5))
    runs = [KERNEL.backward(dout, q, k, v, out, lse, softmax_scale=0.25, window_size=(20, 5), deterministic=True) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_registered_with_capabilities_and_config() -> None:
    kernel = load_kernel("torch-flash")
    assert kernel.target is KERNEL
    assert kernel.capabilities.dtypes == {"cpu": ("float16", "bfloat16", "float32", "float64"), "cuda": ("float16", "bfloat16")}
    assert kernel.unavailable_reason("cpu") is None
    assert kernel.config()["torch"] == torch.__version__


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
@pytest.mark.parametrize(
    "shape", [(2, 33, 70, 4, 2, 64), (1, 70, 33, 6, 1, 128), (1, 1, 40, 4, 2, 32)], ids=["gqa-long-k", "mqa-long-q", "decode"]
)
def test_cuda_passes_the_check(shape, mask, dtype) -> None:
    result = checked("torch-flash", KERNEL, grid_spec(shape, dtype, mask), "cuda")
    assert result.passed, failures(result)


@pytest.mark.gpu
def test_cuda_empty_rows_and_deterministic_backward() -> None:
    q, k, v, dout = (t.cuda() for t in make_inputs((2, 6, 3, 4, 2, 64), torch.float16))
    with poisoned("cuda"):
        out, lse = KERNEL.forward(q, k, v, softmax_scale=0.5, causal=True)
        runs = [KERNEL.backward(dout, q, k, v, out, lse, softmax_scale=0.5, causal=True, deterministic=True) for _ in range(2)]
    assert (out[:, :3] == 0).all() and lse[:, :, :3].isinf().all() and (runs[0][0][:, :3] == 0).all()
    assert not any(t.isnan().any() for t in (out, lse, *runs[0]))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
