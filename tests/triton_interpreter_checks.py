"""Checks of the Triton FA2 kernels that run under the Triton CPU interpreter.

Each function raises ``AssertionError`` (with the failing case named) or
returns quietly.  They run in a child process started by
``tests/test_triton_interpreter.py`` with ``TRITON_INTERPRET=1`` set before
anything imports Triton, so that the interpreter mode never leaks into other
tests.  Shapes are tiny (the interpreter runs each tile op in NumPy) but span
several 16x16 tiles (the interpreter's tile table), so the masked, whole and
tail tile ranges all run.  Numbers are checked by the product's one path
(:func:`fa2_verify.verify.check.check_case` and ``check_varlen``: poisoned
outputs, the golden, the error model), through :mod:`fa2_verify.bench.checks`
where both backward modes are wanted; the layout and empty-row checks compare
bits and exact values.
"""

from __future__ import annotations

import math
import os

import torch

from fa2_verify.app.cases.bench_checks import CheckCase
from fa2_verify.bench import checks
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.layouts import guarded, to_layout
from fa2_verify.core.varlen import VarlenSpec, pack
from fa2_verify.verify.check import check_case, check_varlen
from fa2_verify.verify.interpreter_bounds import bounds_checked
from fa2_verify.verify.metrics import describe_failure
from fa2_verify.verify.poison import poisoned
from fa2_verify.verify.registry import load_kernel
from tests.naive import make_inputs

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


def _spec(name: str, dtype: str) -> CaseSpec:
    shape, mask = CASES[name]
    return CaseSpec(*shape, dtype, softmax_scale=SCALE, seed=len(name), name=name, **mask)


def forward_backward_match_naive() -> None:
    """out, lse, dq, dk, dv of every case, float16 and float32, atomic dq, pass the product's check."""
    _kernel()
    kernel = load_kernel("triton")
    for dtype in ("float32", "float16"):
        for name in CASES:
            result = check_case(kernel, make_case(_spec(name, dtype)))
            assert result.passed, describe_failure(result)


def deterministic_backward_matches_and_repeats() -> None:
    """deterministic=True: the gradients pass the check too, and repeat bit for bit on a second call."""
    _kernel()
    for name in ("window-gqa-d40", "mqa-causal-sq>sk"):
        record = checks.check(CheckCase(_spec(name, "float16")), device="cpu")
        assert record["passed"], record


def comparison_fails_on_wrong_mask() -> None:
    """The check can fail: a causal kernel checked as the non-causal case."""
    _kernel()
    control = checks.negative_control(device="cpu", spec=_spec("causal-odd", "float32"))
    assert control["failed_as_it_must"], "a causal output passed as non-causal attention"


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
    """Packed sequences (one of length 0 in q, one of length 0 in k) pass the check of each sequence alone."""
    _kernel()
    spec = VarlenSpec.packing(((9, 0), (0, 5), (40, 33), (23, 24)), heads_q=4, heads_kv=2, head_dim=40,
                              dtype="float16", causal=True, window_size=(11, -1), softmax_scale=SCALE, seed=3)
    for index, result in enumerate(check_varlen(load_kernel("triton"), pack(spec, "cpu"))):
        assert result.passed, f"sequence {index}: " + describe_failure(result)


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
    _kernel()
    dense = CaseSpec(1, 37, 45, 2, 1, 32, "float16", causal=True, seed=3, name="interpreter-dense")
    varlen = VarlenSpec.packing(((17, 0), (0, 9), (33, 40)), heads_q=2, heads_kv=2, head_dim=32, dtype="float32",
                                window_size=(7, 3), seed=4, name="interpreter-varlen")
    for case in (CheckCase(dense, layout="heads-major"), CheckCase(varlen)):
        record = checks.check(case, device="cpu")
        assert record["passed"], record
    control = checks.negative_control(device="cpu", spec=dense)
    assert control["failed_as_it_must"], control


def reads_and_writes_stay_in_bounds() -> None:
    """Every address the kernels touch lies inside their tensor arguments (fa2_verify/verify/interpreter_bounds.py),
    dense and packed, both backward modes, with inputs in strided layouts and guards around them.

    The packed batches put a short sequence first: the grid covers the longest sequence, so programs
    past the short one's last query tile exist, and must load nothing (row -1 of sequence 0 lies
    before the tensor: a fault on a GPU when that address is unmapped)."""
    kernel = _kernel()
    with bounds_checked():
        for name in ("causal-window-sk>sq", "window-gqa-d40", "one-query"):
            case = make_case(_spec(name, "float32"))
            mask = {"causal": case.spec.causal, "window_size": case.spec.window_size}
            q, k, v, dout = (to_layout(getattr(case, t), "strided-seqlen") for t in ("q", "k", "v", "dout"))
            out, lse = kernel.forward(q, k, v, softmax_scale=SCALE, **mask)
            for deterministic in (False, True):
                kernel.backward(dout, q, k, v, out, lse, softmax_scale=SCALE, deterministic=deterministic, **mask)
        for layout in ("contiguous", "heads-major"):
            spec = VarlenSpec.packing(((9, 40), (0, 5), (40, 33), (23, 0)), heads_q=4, heads_kv=2, head_dim=40,
                                      dtype="float32", window_size=(11, -1), softmax_scale=SCALE, seed=3)
            packed = pack(spec, "cpu", layout)
            q, k, v, dout = (guarded(getattr(packed, t)) for t in ("q", "k", "v", "dout"))
            lengths = (packed.cu_seqlens_q, packed.cu_seqlens_k, packed.max_seqlen_q, packed.max_seqlen_k)
            out, lse = kernel.forward_varlen(q, k, v, *lengths, softmax_scale=SCALE, window_size=(11, -1))
            for deterministic in (False, True):
                kernel.backward_varlen(dout, q, k, v, out, lse, *lengths, softmax_scale=SCALE,
                                       window_size=(11, -1), deterministic=deterministic)


def bounds_check_fails_on_a_read_before_a_tensor() -> None:
    """The bounds check can fail: a copy kernel that reads one element before its input."""
    _kernel()
    import triton
    import triton.language as tl

    @triton.jit
    def shifted_copy(X, Y, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(Y + offsets, tl.load(X + offsets + SHIFT, mask=offsets < n), mask=offsets < n)

    x = guarded(torch.arange(8, dtype=torch.float32))
    with bounds_checked():
        shifted_copy[(1,)](x, torch.empty_like(x), 8, SHIFT=0, BLOCK=8)
        try:
            shifted_copy[(1,)](x, torch.empty_like(x), 8, SHIFT=-1, BLOCK=8)
        except Exception as raised:  # the interpreter wraps the check's AssertionError
            assert "4 bytes before" in str(raised), raised
        else:
            raise AssertionError("a read one element before the input passed the bounds check")


def fused_bound_weights_equal_the_dense_equations() -> None:
    """The error model's bounds and flush shares with :mod:`fa2_verify.verify.bound_weights`' Triton passes equal
    the dense equations (tests/test_error_model.py's oracle) and the torch evaluation, in one block per head and in
    blocks of 5 rows (masked bands, rows that see no key); a forward-only case equals the torch evaluation.  The
    trial block of ``bound_weights.compiles`` runs (else a GPU would silently keep the torch evaluation)."""
    _kernel()
    from fa2_verify.verify import bound_weights, error_model

    assert bound_weights.compiles(torch.device("cpu")), "the trial block of bound_weights.compiles failed"
    from tests.test_error_model import BLOCKED, _blocked_golden, _dense_bounds

    def assert_close(actual: dict, expected: dict, what: str) -> None:
        assert actual.keys() == expected.keys(), what
        for name, value in expected.items():
            assert torch.allclose(actual[name], value, rtol=1e-12, atol=0), f"{what}: {name}"

    whole = error_model.WORK_ELEMENTS["cpu"]
    forward_only = CaseSpec(batch=2, seqlen_q=21, seqlen_k=33, heads_q=4, heads_kv=2, head_dim=16, dtype="bfloat16",
                            causal=True, backward=False, seed=15)
    for spec in (*BLOCKED, forward_only):
        case = make_case(spec)
        result = _blocked_golden(case)
        group = spec.heads_q // spec.heads_kv
        for work in (whole, 5 * group * spec.seqlen_k):
            error_model.WORK_ELEMENTS["cpu"] = work
            for flush in (True, False):
                fused = error_model.bounds_and_flush_shares(case, result, flush_shares=flush, fused_weights=True)
                plain = error_model.bounds_and_flush_shares(case, result, flush_shares=flush, fused_weights=False)
                what = f"{spec}, {work} elements a block, flush shares {flush}"
                assert_close(fused[0], plain[0], f"bounds against torch, {what}")
                assert_close(fused[1], plain[1], f"flush shares against torch, {what}")
                if spec.backward:
                    assert_close(fused[0], _dense_bounds(case, result), f"bounds against the equations, {what}")
                if spec.backward and flush:
                    assert_close(fused[1], _dense_bounds(case, result, flush_only=True),
                                 f"flush shares against the equations, {what}")
    error_model.WORK_ELEMENTS["cpu"] = whole


def _golden_problem(shape, dtype, causal=False, window=(-1, -1), spread=0, seed=1, equal_keys=False):
    """The golden's head-major inputs of normal values, each times ``2**-u`` with ``u`` uniform in
    ``[0, spread)`` (a spread of 40 makes no 16-bit matrix one exact slice: the two-slice products); with
    ``equal_keys`` every key is the first (every score of a row ties)."""
    from fa2_verify.golden import inputs

    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = shape
    generator = torch.Generator().manual_seed(seed)

    def draw(*size):
        powers = torch.randint(0, max(spread, 1), size, generator=generator)
        return (torch.randn(*size, generator=generator) * 2.0 ** -powers).to(dtype)

    q, dout = (draw(batch, seqlen_q, heads_q, head_dim) for _ in range(2))
    k, v = (draw(batch, seqlen_k, heads_kv, head_dim) for _ in range(2))
    if equal_keys:
        k[:] = k[:, :1].clone()
    return inputs.prepare(q, k, v, dout, softmax_scale=head_dim ** -0.5, causal=causal, window_size=window)


def fused_golden_passes_equal_the_torch_evaluation() -> None:
    """:func:`golden.fast.attention` with :mod:`fa2_verify.golden.passes` equals the torch evaluation to float64
    rounding (the same pivots), and certifies, in one block and in blocks of 600 scores: causal GQA, cross
    lengths, a window with rows that see no key, float32, spread-out bfloat16 (the two-slice products) and equal
    keys (every score of a row ties: the first key is the pivot, as torch's ``argmax`` takes it), every block
    served by the passes; kv heads whose products take different paths keep the torch code, bit for bit;
    the double-double accumulation equals torch's bit for bit; the trial of ``passes.compiles`` runs."""
    _kernel()
    from fa2_verify.golden import certify, fast, passes

    assert passes.compiles(torch.device("cpu")), "the trial of golden.passes.compiles failed"
    torch_steps = {"_forward": 0, "_backward": 0}

    def counted(name, step):
        def call(*args):
            torch_steps[name] += 1
            return step(*args)
        return call

    fast._forward, fast._backward = counted("_forward", fast._forward), counted("_backward", fast._backward)
    served = [
        ((2, 70, 70, 4, 2, 32), torch.float16, {"causal": True}),
        ((1, 33, 130, 3, 1, 40), torch.float16, {}),
        ((1, 129, 65, 2, 2, 64), torch.float16, {"window": (16, 0)}),
        ((1, 96, 40, 2, 1, 16), torch.float32, {"causal": True}),
        ((1, 77, 150, 4, 2, 32), torch.bfloat16, {"causal": True, "spread": 40}),
        ((1, 9, 300, 2, 1, 16), torch.float16, {"window": (280, 0), "equal_keys": True}),  # ties over two tiles
    ]
    whole = fast.BLOCK_ELEMENTS["cpu"]
    for shape, dtype, options in served:
        problem = _golden_problem(shape, dtype, **options)
        for block_elements in (whole, 600):
            fast.BLOCK_ELEMENTS["cpu"] = block_elements
            what = f"{shape} {dtype} {options}, {block_elements} scores a block"
            plain = fast.attention(problem, fused=False)
            torch_steps.update(_forward=0, _backward=0)
            fused = fast.attention(problem, fused=True)
            assert torch_steps == {"_forward": 0, "_backward": 0}, f"{what}: blocks left to torch {torch_steps}"
            assert torch.equal(fused.pivot, plain.pivot), f"{what}: pivots"
            # with equal keys dq is 0 but for rounding (sum_j dS_ij = 0): the certification measures it instead
            for name in ("out", "lse", "delta", "dk", "dv") + (() if options.get("equal_keys") else ("dq",)):
                a, b = getattr(fused, name), getattr(plain, name)
                finite = torch.isfinite(b)
                assert torch.equal(finite, torch.isfinite(a)), f"{what}: {name} finite elsewhere"
                largest = float(b[finite].abs().max()) or 1.0
                assert float((a[finite] - b[finite]).abs().max()) <= 1e-13 * largest, f"{what}: {name}"
            bounds = certify.certify(problem, fused, rows=16, precision_bits=113, seed=7)
            assert max(bounds.values()) <= certify.LIMIT, f"{what}: certified {bounds}"
    fast.BLOCK_ELEMENTS["cpu"] = whole
    # kv head 0 spread out, kv head 1 not: P V and dS K take both paths in one stack
    problem = _golden_problem((1, 40, 60, 2, 2, 16), torch.bfloat16, causal=True)
    spread = _golden_problem((1, 40, 60, 2, 2, 16), torch.bfloat16, causal=True, spread=40)
    for name in ("k", "v"):
        getattr(problem, name)[:, 0] = getattr(spread, name)[:, 0]
    torch_steps.update(_forward=0, _backward=0)
    fused = fast.attention(problem, fused=True)
    assert torch_steps["_forward"] > 0 and torch_steps["_backward"] > 0, "mixed paths: torch steps not taken"
    plain = fast.attention(problem, fused=False)
    for name in ("out", "lse", "delta", "dq", "dk", "dv"):
        assert torch.equal(getattr(fused, name), getattr(plain, name)), f"mixed paths: {name} differs from torch"
    generator = torch.Generator().manual_seed(3)
    total = [torch.randn(2, 3, 9, 5, dtype=torch.float64, generator=generator) for _ in range(2)]
    term = [torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=generator) * 1e-9 for _ in range(2)]
    expected = [part.clone() for part in total]
    fast._accumulate(expected, term, slice(3, 7))
    passes.accumulate(total, term, slice(3, 7))
    assert all(torch.equal(a, b) for a, b in zip(total, expected)), "double-double accumulation differs from torch"
