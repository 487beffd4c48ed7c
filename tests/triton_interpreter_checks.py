"""Checks of the Triton FA2 kernels that run under the Triton CPU interpreter.

Each function raises ``AssertionError`` (with the failing case named) or
returns quietly.  They run in a child process started by
``tests/test_triton_interpreter.py`` with ``TRITON_INTERPRET=1`` set before
anything imports Triton, so that the interpreter mode never leaks into other
tests.  Shapes are tiny (the interpreter runs each tile op in NumPy) but span
several 16x16 tiles (the interpreter's tile table), so the masked, whole and
tail tile ranges all run.  Expected values: float64 attention of
:mod:`tests.naive`, within :data:`tests.naive.FA2_TOLERANCE`.
"""

from __future__ import annotations

import math
import os

import torch

from tests.naive import FA2_TOLERANCE, assert_matches, attention, attention_grads, make_inputs
from fa2_verify.verify.poison import poisoned

SCALE = 0.3

#: name -> ((batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), mask)
CASES = {
    "causal-odd": ((2, 37, 37, 2, 2, 32), {"causal": True}),
    "window-gqa-d40": ((1, 33, 45, 4, 2, 40), {"window_size": (7, 3)}),
    "mqa-causal-sq>sk": ((1, 45, 17, 3, 1, 32), {"causal": True}),
    "causal-window-sk>sq": ((1, 19, 50, 2, 2, 48), {"causal": True, "window_size": (5, -1)}),
    "right-only": ((1, 30, 30, 2, 1, 32), {"window_size": (-1, 2)}),
    "one-query": ((2, 1, 29, 2, 2, 32), {}),
}


def _kernel():
    assert os.environ.get("TRITON_INTERPRET") == "1", "run these checks with TRITON_INTERPRET=1"
    from fa2_verify.kernels.triton_fa2 import KERNEL

    return KERNEL


def _same_infinities(lse: torch.Tensor) -> torch.Tensor:
    """The contract allows +-inf for a row that sees no key; the naive reference writes -inf."""
    return torch.where(torch.isinf(lse), -math.inf, lse)


def _check_case(kernel, name, shape, mask, dtype, *, deterministic=False, reference_mask=None) -> None:
    q, k, v, dout = make_inputs(shape, dtype, seed=len(name))
    tol = FA2_TOLERANCE[dtype]
    with poisoned("cpu"):
        out, lse = kernel.forward(q, k, v, softmax_scale=SCALE, **mask)
        grads = kernel.backward(dout, q, k, v, out, lse, softmax_scale=SCALE, deterministic=deterministic, **mask)
    expected_mask = mask if reference_mask is None else reference_mask
    expected_out, expected_lse = attention(q, k, v, softmax_scale=SCALE, **expected_mask)
    expected_grads = attention_grads(dout, q, k, v, softmax_scale=SCALE, **expected_mask)
    label = f"{name} {dtype}"
    assert (out.dtype, out.shape, lse.dtype, lse.shape) == (dtype, q.shape, torch.float32, expected_lse.shape), label
    assert_matches(f"{label} out", out, expected_out, tol.out)
    assert_matches(f"{label} lse", _same_infinities(lse), expected_lse, tol.lse)
    for grad_name, actual, expected in zip(("dq", "dk", "dv"), grads, expected_grads):
        assert (actual.dtype, actual.shape) == (dtype, expected.shape), f"{label} {grad_name}"
        assert_matches(f"{label} {grad_name}", actual, expected, tol.grads)


def forward_backward_match_naive() -> None:
    """out, lse, dq, dk, dv = float64 attention for every case, float16 and float32, atomic dq."""
    kernel = _kernel()
    for dtype in (torch.float32, torch.float16):
        for name, (shape, mask) in CASES.items():
            _check_case(kernel, name, shape, mask, dtype)


def deterministic_backward_matches_and_repeats() -> None:
    """deterministic=True: the same gradients within tolerance, and bit for bit on a second call."""
    kernel = _kernel()
    for name in ("window-gqa-d40", "mqa-causal-sq>sk"):
        shape, mask = CASES[name]
        _check_case(kernel, name, shape, mask, torch.float16, deterministic=True)
        q, k, v, dout = make_inputs(shape, torch.float16, seed=1)
        out, lse = kernel.forward(q, k, v, softmax_scale=SCALE, **mask)
        first, second = (kernel.backward(dout, q, k, v, out, lse, softmax_scale=SCALE, deterministic=True, **mask)
                         for _ in range(2))
        for grad_name, a, b in zip(("dq", "dk", "dv"), first, second):
            assert torch.equal(a, b), f"{name}: deterministic {grad_name} differs between two calls"


def comparison_fails_on_wrong_mask() -> None:
    """The comparison above can fail: a causal kernel checked against a non-causal reference."""
    kernel = _kernel()
    shape, mask = CASES["causal-odd"]
    try:
        _check_case(kernel, "causal-odd", shape, mask, torch.float32, reference_mask={})
    except AssertionError:
        return
    raise AssertionError("a causal output passed as non-causal attention")


def empty_rows_are_zero_with_infinite_lse() -> None:
    """Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see no key; and empty sequences."""
    kernel = _kernel()
    q, k, v, dout = make_inputs((1, 40, 7, 2, 1, 32), torch.float16)
    with poisoned("cpu"):
        out, lse = kernel.forward(q, k, v, softmax_scale=SCALE, causal=True)
        dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, softmax_scale=SCALE, causal=True)
    assert not any(t.isnan().any() for t in (out, lse, dq, dk, dv)), "NaN in an output"
    assert (out[:, :33] == 0).all() and (dq[:, :33] == 0).all(), "an empty row is not 0"
    assert (lse[:, :, :33] == math.inf).all() and lse[:, :, 33:].isfinite().all(), "lse of empty rows is not +inf"
    for seqlen_q, seqlen_k in ((0, 7), (5, 0)):
        q, k, v, dout = make_inputs((2, seqlen_q, seqlen_k, 2, 1, 32), torch.float16)
        with poisoned("cpu"):
            out, lse = kernel.forward(q, k, v, softmax_scale=SCALE)
            grads = kernel.backward(dout, q, k, v, out, lse, softmax_scale=SCALE)
        assert (out.shape, lse.shape) == (q.shape, (2, 2, seqlen_q)), f"seqlen_q={seqlen_q}, seqlen_k={seqlen_k}"
        assert (out == 0).all() and (lse == math.inf).all(), f"seqlen_k={seqlen_k}: out/lse of rows seeing nothing"
        assert all((g == 0).all() and g.shape == t.shape for g, t in zip(grads, (q, k, v))), "grads of empty input"


def varlen_matches_per_sequence() -> None:
    """Packed sequences (one of length 0 in q, one of length 0 in k) = each sequence alone."""
    kernel = _kernel()
    lengths_q, lengths_k = (9, 0, 40, 23), (0, 5, 33, 24)
    mask = {"causal": True, "window_size": (11, -1)}
    q, k, v, dout = make_inputs((1, sum(lengths_q), sum(lengths_k), 4, 2, 40), torch.float16, seed=3)
    q, k, v, dout = q[0], k[0], v[0], dout[0]
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    with poisoned("cpu"):
        out, lse = kernel.forward_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                         softmax_scale=SCALE, **mask)
        dq, dk, dv = kernel.backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                            softmax_scale=SCALE, **mask)
    assert lse.shape == (4, sum(lengths_q)), f"lse shape {tuple(lse.shape)}"
    tol = FA2_TOLERANCE[torch.float16]
    for b in range(len(lengths_q)):
        sq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        sk = slice(int(cu_k[b]), int(cu_k[b + 1]))
        if sq.start == sq.stop:
            assert (dk[sk] == 0).all() and (dv[sk] == 0).all(), f"sequence {b}: keys seen by no query have dk/dv != 0"
            continue
        expected_out, expected_lse = attention(q[None, sq], k[None, sk], v[None, sk], softmax_scale=SCALE, **mask)
        expected = attention_grads(dout[None, sq], q[None, sq], k[None, sk], v[None, sk], softmax_scale=SCALE, **mask)
        assert_matches(f"sequence {b} out", out[sq], expected_out[0], tol.out)
        assert_matches(f"sequence {b} lse", _same_infinities(lse[:, sq]), expected_lse[0], tol.lse)
        for name, actual, want in zip(("dq", "dk", "dv"), (dq[sq], dk[sk], dv[sk]), expected):
            assert_matches(f"sequence {b} {name}", actual, want[0], tol.grads)


def strided_inputs_give_identical_results() -> None:
    """q in (batch, heads, seqlen, head_dim) memory and k with a head_dim stride of 2 give the
    same bits as contiguous inputs."""
    kernel = _kernel()
    q, k, v, dout = make_inputs((2, 21, 26, 4, 2, 32), torch.float16, seed=5)
    mask = {"causal": True}
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    k_strided = torch.stack([k, torch.full_like(k, math.nan)], dim=-1)[..., 0]
    assert not q_strided.is_contiguous() and k_strided.stride(-1) == 2
    expected = kernel.forward(q, k, v, softmax_scale=SCALE, **mask)
    actual = kernel.forward(q_strided, k_strided, v, softmax_scale=SCALE, **mask)
    for name, a, b in zip(("out", "lse"), actual, expected):
        assert torch.equal(a, b), f"strided {name} differs"
    out, lse = expected
    expected_grads = kernel.backward(dout, q, k, v, out, lse, softmax_scale=SCALE, deterministic=True, **mask)
    actual_grads = kernel.backward(dout.transpose(1, 2).contiguous().transpose(1, 2), q_strided, k_strided, v,
                                   out, lse, softmax_scale=SCALE, deterministic=True, **mask)
    for name, a, b in zip(("dq", "dk", "dv"), actual_grads, expected_grads):
        assert torch.equal(a, b), f"strided {name} differs"


def registry_and_capabilities_under_interpreter() -> None:
    """``load_kernel("triton")`` runs on CPU float16/float32 here and records the tiles it used."""
    from fa2_verify.verify.registry import load_kernel

    kernel = load_kernel("triton")
    assert kernel.unavailable_reason("cpu") is None, kernel.unavailable_reason("cpu")
    assert dict(kernel.capabilities.dtypes) == {"cpu": ("float16", "float32")}
    q, k, v, _ = make_inputs((1, 20, 20, 2, 2, 32), torch.float32)
    kernel.forward(q, k, v, softmax_scale=SCALE, causal=True)
    calls = kernel.config()["tiles_by_call"]
    key = "forward dense float32 head_dim=32 batch=1 seqlen_q=20 seqlen_k=20 heads_q=2 heads_kv=2 window=(-1,0)"
    assert calls[key]["forward"] == {"block_m": 16, "block_n": 16, "num_warps": 1, "num_stages": 1,
                                     "use_tma": False}, calls
    assert calls[key]["target"] == "interpreter" and calls[key]["tma_used"] is False, calls


def bench_check_section_passes_and_fails_a_wrong_mask() -> None:
    """:mod:`fa2_verify.bench.checks` on small cases: dense in a strided layout and varlen with empty
    sequences pass the product's check in both backward modes; its negative control fails."""
    from fa2_verify.bench import checks
    from fa2_verify.core.case import CaseSpec
    from fa2_verify.core.varlen import VarlenSpec

    _kernel()
    dense = CaseSpec(1, 37, 45, 2, 1, 32, "float16", causal=True, seed=3, name="interpreter-dense")
    varlen = VarlenSpec.packing(((17, 0), (0, 9), (33, 40)), heads_q=2, heads_kv=2, head_dim=32, dtype="float32",
                                window_size=(7, 3), seed=4, name="interpreter-varlen")
    for case in (checks.CheckCase(dense, layout="heads-major"), checks.CheckCase(varlen)):
        record = checks.check(case, device="cpu")
        assert record["passed"], record
    control = checks.negative_control(device="cpu", spec=dense)
    assert control["failed_as_it_must"], control
