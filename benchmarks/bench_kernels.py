"""Benchmark and check the Triton FA2 kernels against PyTorch's built-in FA2 on a GPU.

Sections (``--sections``, default ``check,spread,bench``):

``check``   every feature on odd shapes (masks, GQA/MQA, seqlens 1 and
            primes, head dims 32..256, fp16/bf16/fp32, varlen with an empty
            sequence, strided inputs), outputs poisoned with NaN before each
            call, compared with float64 naive attention
            (:mod:`benchmarks.naive_attention`) by ``|actual - expected| / |expected|``;
            a NaN where the reference is finite fails.
``spread``  dq of the default (atomic) backward over repeated calls: the
            largest ULP distance to the first call; the deterministic
            backward must repeat dq, dk, dv bit for bit.
``sweep``   candidate tile configurations (:data:`SWEEP_TILES`) of a pass at
            16k tokens, head dims 64 and 128, causal and full; the best by
            geometric mean per (pass, head_dim, seqlen bucket).
``bench``   ``triton`` and SDPA's flash backend
            (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``) in the same run:
            forward and forward+backward, causal or not, head dims 64 and 128,
            seqlen 1k..16k at 16k tokens per batch (hidden 2048), fp16 and bf16.
            CUDA-event medians (``triton.testing.do_bench``) after warm-up;
            TFLOP/s of both, their ratio, its geometric mean, and the peak
            memory of each call; every row's outputs are also checked against
            float64 on two heads.

Kernels compile once per variant; ``--jobs N`` compiles them first in N
processes that share Triton's cache.  Tables go to stdout and, with
``--out DIR``, to files there.  Usage::

    python -m benchmarks.bench_kernels --sections check,spread,bench --out results/
    fa2-verify bench --sections bench
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator

import torch

from benchmarks.naive_attention import naive_attention
from fa2_verify.kernels.triton_fa2.configs import TileConfig, bucket

#: Tokens per batch (batch * seqlen) and model width (heads * head_dim) of the benchmark rows.
TOKENS = 16384
HIDDEN = 2048
SEQLENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
DTYPES = ("float16", "bfloat16")
SECTIONS = ("check", "spread", "sweep", "bench")

#: ||actual - expected|| / ||expected|| allowed per dtype (lse: absolute, in nats).
TOLERANCE = {"float16": 5e-3, "bfloat16": 3e-2, "float32": 1e-4}
LSE_TOLERANCE = 1e-3
#: dq and dk are sums that can cancel to ~0 (dS = 0 for a row with one visible key); their error is
#: relative to max(||expected||, CANCELLATION_FLOOR * ||sum of the terms' magnitudes||).
CANCELLATION_FLOOR = 1e-2

#: Where the inputs are made (the benchmark needs CUDA; the checks also run on the CPU interpreter).
DEVICE = "cuda"


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Floating tensors from ``torch.empty``/``empty_like`` start as NaN, so unwritten outputs show."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    torch.empty = lambda *args, **kwargs: poison(empty(*args, **kwargs))
    torch.empty_like = lambda *args, **kwargs: poison(empty_like(*args, **kwargs))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


def relative_error(actual: torch.Tensor, expected: torch.Tensor, floor: float = 0.0) -> float:
    """``||actual - expected|| / max(||expected||, floor)`` in float64; NaN when finiteness differs anywhere."""
    actual, expected = actual.to(torch.float64), expected.to(torch.float64)
    finite = torch.isfinite(expected)
    if not torch.equal(torch.isfinite(actual), finite) or not torch.equal(actual[~finite], expected[~finite]):
        return math.nan
    norm = max(expected[finite].norm().item(), floor)
    diff = (actual[finite] - expected[finite]).norm().item()
    return diff / norm if norm > 0 else diff


def lse_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest |actual - expected| of the LSE; a row that sees no key must be +-inf in both."""
    actual, expected = actual.to(torch.float64), expected.to(torch.float64)
    finite = torch.isfinite(expected)
    if not torch.equal(torch.isfinite(actual), finite) or bool(torch.isnan(actual).any()):
        return math.nan
    return (actual[finite] - expected[finite]).abs().max().item() if finite.any() else 0.0


def passes(error: float, tolerance: float) -> bool:
    return error == error and error <= tolerance  # NaN never passes


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in units in the last place of 16-bit floats (a, b of one dtype)."""
    def ordered(x: torch.Tensor) -> torch.Tensor:
        bits = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(a) - ordered(b)).abs()


def median_ms(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def peak_mib(fn: Callable[[], object]) -> float:
    """Peak device memory a call allocates beyond what was live before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _tensors(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, *, seed, scale_q=1.0):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, device=DEVICE, dtype=torch.float32).to(dtype)

    q = draw(batch, seqlen_q, heads_q, head_dim) * scale_q
    return (q.to(dtype), draw(batch, seqlen_k, heads_kv, head_dim), draw(batch, seqlen_k, heads_kv, head_dim),
            draw(batch, seqlen_q, heads_q, head_dim))


def _kernel():
    from fa2_verify.kernels.triton_fa2 import KERNEL

    return KERNEL


# --------------------------------------------------------------------------- check


@dataclasses.dataclass(frozen=True)
class CheckCase:
    name: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    causal: bool = False
    window_size: tuple[int, int] = (-1, -1)
    layout: str = "dense"  # dense | strided | varlen
    lengths_q: tuple[int, ...] = ()
    lengths_k: tuple[int, ...] = ()
    scale_q: float = 1.0


CHECK_CASES: tuple[CheckCase, ...] = (
    CheckCase("causal-odd", 2, 1000, 1000, 4, 4, 64, "float16", causal=True),
    CheckCase("sk>sq-prime", 1, 513, 1031, 4, 4, 128, "bfloat16"),
    CheckCase("window-d40", 2, 777, 777, 2, 2, 40, "float16", window_size=(64, 32)),
    CheckCase("causal-sq>sk-d80", 1, 1031, 513, 2, 2, 80, "bfloat16", causal=True),
    CheckCase("gqa-causal-d96", 1, 600, 600, 8, 2, 96, "float16", causal=True),
    CheckCase("mqa-window-d112", 1, 333, 999, 6, 1, 112, "bfloat16", causal=True, window_size=(100, -1)),
    CheckCase("sq1-d160", 2, 1, 1000, 4, 2, 160, "float16"),
    CheckCase("sk1-causal-d192", 1, 997, 1, 2, 2, 192, "bfloat16", causal=True),
    CheckCase("causal-d256", 1, 1024, 1024, 2, 2, 256, "float16", causal=True),
    CheckCase("d256-bf16", 1, 300, 700, 2, 1, 256, "bfloat16"),
    CheckCase("fp32-causal", 1, 257, 257, 2, 2, 64, "float32", causal=True),
    CheckCase("fp32-window-d128", 1, 200, 300, 2, 2, 128, "float32", window_size=(32, 32)),
    CheckCase("fp32-d256", 1, 100, 130, 2, 2, 256, "float32"),
    CheckCase("diagonal-d32", 1, 500, 500, 2, 2, 32, "float16", window_size=(0, 0)),
    CheckCase("large-logits", 1, 512, 512, 2, 2, 64, "float16", causal=True, scale_q=8.0),
    CheckCase("strided", 2, 300, 301, 4, 2, 64, "float16", causal=True, layout="strided"),
    CheckCase("varlen-empty-seq", 4, 1000, 1300, 4, 4, 128, "float16", causal=True, layout="varlen",
              lengths_q=(100, 0, 1000, 237), lengths_k=(0, 50, 1300, 240)),
    CheckCase("varlen-gqa-window", 3, 700, 700, 4, 2, 64, "bfloat16", window_size=(128, 16), layout="varlen",
              lengths_q=(700, 1, 333), lengths_k=(650, 17, 333)),
)


def _dense_inputs(case: CheckCase, seed: int):
    dtype = getattr(torch, case.dtype)
    q, k, v, dout = _tensors(case.batch, case.seqlen_q, case.seqlen_k, case.heads_q, case.heads_kv,
                             case.head_dim, dtype, seed=seed, scale_q=case.scale_q)
    if case.layout == "strided":
        # q and dout as (batch, heads, seqlen, head_dim) memory; k with head_dim stride 2.
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
        dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
        k = torch.stack([k, torch.full_like(k, float("nan"))], dim=-1)[..., 0]
    return q, k, v, dout


def _compare(actual: dict, expected: dict, dtype: str) -> dict:
    tolerance = TOLERANCE[dtype]
    floors = {name: CANCELLATION_FLOOR * expected[f"{name}_terms"].norm().item()
              for name in ("dq", "dk") if f"{name}_terms" in expected}
    errors = {name: relative_error(actual[name], expected[name], floors.get(name, 0.0))
              for name in ("out", "dq", "dk", "dv") if name in actual}
    expected_lse = torch.where(torch.isneginf(expected["lse"]), math.inf, expected["lse"])
    errors["lse"] = lse_error(actual["lse"], expected_lse)
    ok = all(passes(error, LSE_TOLERANCE if name == "lse" else tolerance) for name, error in errors.items())
    return {"errors": errors, "passed": ok}


def _run_varlen(case: CheckCase, seed: int, deterministic: bool):
    kernel = _kernel()
    dtype = getattr(torch, case.dtype)
    total_q, total_k = sum(case.lengths_q), sum(case.lengths_k)
    q, k, v, dout = _tensors(1, total_q, total_k, case.heads_q, case.heads_kv, case.head_dim, dtype, seed=seed)
    q, k, v, dout = q[0], k[0], v[0], dout[0]
    cu_q = torch.tensor([0, *torch.tensor(case.lengths_q).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, *torch.tensor(case.lengths_k).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    scale = 1.0 / math.sqrt(case.head_dim)
    mask = {"causal": case.causal, "window_size": case.window_size}
    with poisoned_allocations():
        out, lse = kernel.forward_varlen(q, k, v, cu_q, cu_k, max(case.lengths_q), max(case.lengths_k),
                                         softmax_scale=scale, **mask)
        dq, dk, dv = kernel.backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k, max(case.lengths_q),
                                            max(case.lengths_k), softmax_scale=scale, deterministic=deterministic,
                                            **mask)
    actual = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    return actual, (q, k, v, dout, cu_q, cu_k, scale, mask)


def _varlen_reference(inputs) -> dict:
    q, k, v, dout, cu_q, cu_k, scale, mask = inputs
    expected = {"out": torch.zeros(q.shape, dtype=torch.float64, device=q.device),
                "lse": torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float64, device=q.device),
                "dq": torch.zeros(q.shape, dtype=torch.float64, device=q.device),
                "dk": torch.zeros(k.shape, dtype=torch.float64, device=q.device),
                "dv": torch.zeros(v.shape, dtype=torch.float64, device=q.device),
                "dq_terms": torch.zeros(q.shape, dtype=torch.float64, device=q.device),
                "dk_terms": torch.zeros(k.shape, dtype=torch.float64, device=q.device)}
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(bounds_q) - 1):
        sq, sk = slice(bounds_q[b], bounds_q[b + 1]), slice(bounds_k[b], bounds_k[b + 1])
        if bounds_q[b + 1] == bounds_q[b]:
            continue
        part = naive_attention(q[None, sq], k[None, sk], v[None, sk], dout[None, sq], softmax_scale=scale, **mask)
        for name in ("out", "dq", "dq_terms"):
            expected[name][sq] = part[name][0]
        for name in ("dk", "dv", "dk_terms"):
            expected[name][sk] = part[name][0]
        expected["lse"][:, sq] = part["lse"][0]
    return expected


def _run_dense(case: CheckCase, seed: int, deterministic: bool):
    kernel = _kernel()
    q, k, v, dout = _dense_inputs(case, seed)
    scale = 1.0 / math.sqrt(case.head_dim)
    mask = {"causal": case.causal, "window_size": case.window_size}
    with poisoned_allocations():
        out, lse = kernel.forward(q, k, v, softmax_scale=scale, **mask)
        dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, softmax_scale=scale, deterministic=deterministic,
                                     **mask)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}, (q, k, v, dout, scale, mask)


def check_case(case: CheckCase, *, warm_only: bool = False) -> dict:
    """Both backward modes of one case against float64; the deterministic one run twice for bitwise equality."""
    run = _run_varlen if case.layout == "varlen" else _run_dense
    actual, inputs = run(case, seed=1, deterministic=False)
    actual_det, _ = run(case, seed=1, deterministic=True)
    repeat_det, _ = run(case, seed=1, deterministic=True)
    if warm_only:
        return {}
    if case.layout == "varlen":
        expected = _varlen_reference(inputs)
    else:
        q, k, v, dout, scale, mask = inputs
        expected = naive_attention(q, k, v, dout, softmax_scale=scale, **mask)
    result = {"case": dataclasses.asdict(case), "atomic": _compare(actual, expected, case.dtype),
              "deterministic": _compare(actual_det, expected, case.dtype)}
    result["bitwise_repeat"] = all(torch.equal(actual_det[name], repeat_det[name]) for name in ("dq", "dk", "dv"))
    result["passed"] = result["atomic"]["passed"] and result["deterministic"]["passed"] and result["bitwise_repeat"]
    return result


def negative_control() -> dict:
    """The check must fail a wrong answer: a causal output compared with the non-causal reference."""
    case = CHECK_CASES[0]
    actual, (q, k, v, dout, scale, _mask) = _run_dense(case, seed=1, deterministic=False)
    expected = naive_attention(q, k, v, dout, softmax_scale=scale, causal=False)
    compared = _compare(actual, expected, case.dtype)
    return {"name": "negative-control (causal kernel vs non-causal reference)", "errors": compared["errors"],
            "failed_as_it_must": not compared["passed"]}


# --------------------------------------------------------------------------- spread


def dq_spread(dtype: str, *, repeats: int = 20, seqlen: int = 4096, head_dim: int = 128,
              warm_only: bool = False) -> dict:
    kernel = _kernel()
    batch, heads = TOKENS // seqlen, HIDDEN // head_dim
    q, k, v, dout = _tensors(batch, seqlen, seqlen, heads, heads, head_dim, getattr(torch, dtype), seed=3)
    scale = 1.0 / math.sqrt(head_dim)
    out, lse = kernel.forward(q, k, v, softmax_scale=scale, causal=True)
    result = {"dtype": dtype, "seqlen": seqlen, "batch": batch, "heads": heads, "head_dim": head_dim,
              "causal": True, "repeats": repeats}
    for deterministic in (False, True):
        runs = [kernel.backward(dout, q, k, v, out, lse, softmax_scale=scale, causal=True,
                                deterministic=deterministic) for _ in range(1 if warm_only else repeats)]
        if warm_only:
            continue
        first = runs[0]
        distance = torch.stack([ulp_distance(run[0], first[0]).max() for run in runs[1:]])
        differing = torch.stack([(run[0] != first[0]).float().mean() for run in runs[1:]])
        key = "deterministic" if deterministic else "atomic"
        result[key] = {
            "dq_max_ulp": int(distance.max()),
            "dq_fraction_differing_max": float(differing.max()),
            "dq_bitwise_identical": all(torch.equal(run[0], first[0]) for run in runs[1:]),
            "dk_dv_bitwise_identical": all(torch.equal(run[1], first[1]) and torch.equal(run[2], first[2])
                                           for run in runs[1:]),
        }
    return result


# --------------------------------------------------------------------------- bench rows


@dataclasses.dataclass(frozen=True)
class BenchRow:
    mode: str  # "fwd" | "fwd+bwd"
    causal: bool
    head_dim: int
    seqlen: int
    dtype: str

    @property
    def batch(self) -> int:
        return TOKENS // self.seqlen

    @property
    def heads(self) -> int:
        return HIDDEN // self.head_dim

    def flops(self) -> float:
        """4 b h d * (visible pairs) for the forward (two matmuls); 3.5x that with the backward."""
        pairs = self.seqlen * (self.seqlen + 1) / 2 if self.causal else self.seqlen**2
        forward = 4.0 * self.batch * self.heads * self.head_dim * pairs
        return forward * (3.5 if self.mode == "fwd+bwd" else 1.0)

    def label(self) -> str:
        return f"{self.mode:<7} {'causal' if self.causal else 'full':<6} d={self.head_dim:<3} s={self.seqlen:<5} {self.dtype}"


BENCH_ROWS: tuple[BenchRow, ...] = tuple(
    BenchRow(mode, causal, head_dim, seqlen, dtype)
    for mode in ("fwd", "fwd+bwd")
    for causal in (False, True)
    for head_dim in HEAD_DIMS
    for dtype in DTYPES
    for seqlen in SEQLENS
)


def _row_inputs(row: BenchRow):
    return _tensors(row.batch, row.seqlen, row.seqlen, row.heads, row.heads, row.head_dim,
                    getattr(torch, row.dtype), seed=7)


def _ours(row: BenchRow, q, k, v, dout, tiles=None):
    from fa2_verify.kernels.triton_fa2 import launch

    scale = 1.0 / math.sqrt(row.head_dim)
    if row.mode == "fwd":
        return lambda: launch.forward(q, k, v, softmax_scale=scale, causal=row.causal, tiles=tiles)

    def forward_backward():
        out, lse = launch.forward(q, k, v, softmax_scale=scale, causal=row.causal, tiles=tiles)
        return launch.backward(dout, q, k, v, out, lse, softmax_scale=scale, causal=row.causal, tiles=tiles)

    return forward_backward


def _sdpa(row: BenchRow, q, k, v, dout):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    scale = 1.0 / math.sqrt(row.head_dim)
    qt, kt, vt, dot = (t.transpose(1, 2) for t in (q, k, v, dout))  # (batch, heads, seqlen, head_dim) views
    if row.mode == "fwd":
        def forward():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=row.causal, scale=scale)
        return forward
    qg, kg, vg = (t.detach().requires_grad_() for t in (qt, kt, vt))

    def forward_backward():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=row.causal, scale=scale)
        return torch.autograd.grad(out, (qg, kg, vg), dot)

    return forward_backward


def _check_row(row: BenchRow, q, k, v, dout) -> dict:
    """The row's own outputs (poisoned first) against float64 on heads 0 and h-1 of the first and last batch."""
    from fa2_verify.kernels.triton_fa2 import launch

    scale = 1.0 / math.sqrt(row.head_dim)
    with poisoned_allocations():
        out, lse = launch.forward(q, k, v, softmax_scale=scale, causal=row.causal)
        grads = launch.backward(dout, q, k, v, out, lse, softmax_scale=scale, causal=row.causal) \
            if row.mode == "fwd+bwd" else None
    pick = [0, row.batch - 1] if row.batch > 1 else [0]
    heads = [0, row.heads - 1]
    expected = naive_attention(q[pick], k[pick], v[pick], dout[pick] if grads else None, softmax_scale=scale,
                               causal=row.causal, heads=heads)
    actual = {"out": out[pick][:, :, heads], "lse": lse[pick][:, heads]}
    expected = {name: (value[:, heads] if name == "lse" else value[:, :, heads]) for name, value in expected.items()}
    if grads:
        actual.update({name: grad[pick][:, :, heads] for name, grad in zip(("dq", "dk", "dv"), grads)})
    return _compare(actual, expected, row.dtype)


def bench_row(row: BenchRow, *, tiles=None, warm_only: bool = False, with_check: bool = True) -> dict:
    q, k, v, dout = _row_inputs(row)
    ours, sdpa = _ours(row, q, k, v, dout, tiles), _sdpa(row, q, k, v, dout)
    if warm_only:
        ours()
        return {}
    check = _check_row(row, q, k, v, dout) if with_check else None
    ms_ours, ms_sdpa = median_ms(ours), median_ms(sdpa)
    flops = row.flops()
    return {
        "row": dataclasses.asdict(row), "label": row.label(),
        "ms_triton": ms_ours, "ms_sdpa": ms_sdpa,
        "tflops_triton": flops / ms_ours * 1e-9, "tflops_sdpa": flops / ms_sdpa * 1e-9,
        "ratio": ms_sdpa / ms_ours,
        "peak_mib_triton": peak_mib(ours), "peak_mib_sdpa": peak_mib(sdpa),
        "check": check,
    }


# --------------------------------------------------------------------------- sweep


#: (pass, head_dim) -> candidate tiles.  Earlier sweeps (docs/triton-kernel.md) settled the
#: long-sequence rows and TMA; this one looks for the best forward tiles of short sequences.
SWEEP_TILES: dict[tuple[str, int], tuple[TileConfig, ...]] = {
    ("forward", 64): tuple(TileConfig(*t) for t in (
        (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (128, 32, 4, 3), (64, 128, 4, 3),
        (128, 64, 8, 2))),
    ("forward", 128): tuple(TileConfig(*t) for t in (
        (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2),
        (128, 32, 8, 3), (64, 32, 4, 3))),
}

#: Sequence lengths each pass is swept at (16k tokens per batch).
SWEEP_SEQLENS: dict[str, tuple[int, ...]] = {"forward": (1024, 2048)}


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    pass_name: str
    head_dim: int
    causal: bool
    tile: TileConfig
    seqlen: int = 4096
    dtype: str = "float16"


SWEEP_POINTS: tuple[SweepPoint, ...] = tuple(
    SweepPoint(pass_name, head_dim, causal, tile, seqlen)
    for (pass_name, head_dim), tiles in SWEEP_TILES.items()
    for seqlen in SWEEP_SEQLENS[pass_name]
    for causal in (False, True)
    for tile in tiles
)


def sweep_point(point: SweepPoint, *, warm_only: bool = False) -> dict:
    """Time one pass with one tile config; the backward passes alone (forward done once outside)."""
    from fa2_verify.kernels.triton_fa2 import launch

    row = BenchRow("fwd", point.causal, point.head_dim, point.seqlen, point.dtype)
    q, k, v, dout = _row_inputs(row)
    scale = 1.0 / math.sqrt(point.head_dim)
    mask = {"softmax_scale": scale, "causal": point.causal}
    if point.pass_name == "forward":
        fn = lambda: launch.forward(q, k, v, tiles={"forward": point.tile}, **mask)  # noqa: E731
    else:
        out, lse = launch.forward(q, k, v, **mask)
        deterministic = point.pass_name == "backward_dq"
        fn = lambda: launch.backward(dout, q, k, v, out, lse, deterministic=deterministic,  # noqa: E731
                                     tiles={point.pass_name: point.tile}, **mask)
    try:
        fn()
        if warm_only:
            return {}
        ms = median_ms(fn)
    except Exception as exc:  # a tile that does not compile or fit is a sweep result, not a crash
        return {"point": _point_dict(point), "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {"point": _point_dict(point), "ms": ms}


def _point_dict(point: SweepPoint) -> dict:
    record = dataclasses.asdict(point)
    record["tile"] = point.tile.as_dict()
    return record


def best_tiles(results: list[dict]) -> dict[tuple[str, int, str], TileConfig]:
    """Per (pass, head_dim, seqlen bucket): the tile with the smallest geometric-mean time over
    causal/full and the bucket's seqlens (only tiles measured at all of them)."""
    times: dict[tuple[str, int, str, tuple], list[float]] = {}
    for result in results:
        if "ms" not in result:
            continue
        point = result["point"]
        key = (point["pass_name"], point["head_dim"], bucket(point["seqlen"]), tuple(point["tile"].values()))
        times.setdefault(key, []).append(result["ms"])
    best: dict[tuple[str, int, str], tuple[float, TileConfig]] = {}
    for (pass_name, head_dim, size, tile), values in times.items():
        needed = 2 * sum(1 for seqlen in SWEEP_SEQLENS[pass_name] if bucket(seqlen) == size)
        if len(values) < needed:
            continue
        score = math.exp(sum(map(math.log, values)) / len(values))
        if (pass_name, head_dim, size) not in best or score < best[(pass_name, head_dim, size)][0]:
            best[(pass_name, head_dim, size)] = (score, TileConfig(*tile))
    return {key: tile for key, (_score, tile) in best.items()}


# --------------------------------------------------------------------------- jobs and warm-up


def _jobs(sections: tuple[str, ...], rows: tuple[BenchRow, ...]) -> list[tuple[str, int]]:
    jobs: list[tuple[str, int]] = []
    if "check" in sections:
        jobs += [("check", i) for i in range(len(CHECK_CASES))]
    if "spread" in sections:
        jobs += [("spread", i) for i in range(len(DTYPES))]
    if "sweep" in sections:
        jobs += [("sweep", i) for i in range(len(SWEEP_POINTS))]
    if "bench" in sections:
        jobs += [("bench", i) for i in range(len(rows))]
    return jobs


def _warm(job: tuple[str, int]) -> str:
    """Run one job once without measuring, so that its kernels are compiled into Triton's cache."""
    section, index = job
    try:
        if section == "check":
            check_case(CHECK_CASES[index], warm_only=True)
        elif section == "spread":
            dq_spread(DTYPES[index], warm_only=True)
        elif section == "sweep":
            sweep_point(SWEEP_POINTS[index], warm_only=True)
        else:
            bench_row(BENCH_ROWS[index], warm_only=True)
        torch.cuda.synchronize()
        return ""
    except Exception as exc:
        return f"{section}[{index}]: {type(exc).__name__}: {str(exc)[:300]}"


def warm_up(jobs: list[tuple[str, int]], workers: int) -> list[str]:
    if workers <= 1 or not jobs:
        return []
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return [message for message in pool.map(_warm, jobs) if message]


# --------------------------------------------------------------------------- report


def _geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def _bench_table(results: list[dict]) -> str:
    lines = ["| row | triton TFLOP/s | sdpa-flash TFLOP/s | ratio | triton peak MiB | sdpa peak MiB | check |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['label']} | error: {r['error']} | | | | | |")
            continue
        check = r["check"]
        verdict = "-" if check is None else ("ok" if check["passed"] else "FAIL") + " " + ", ".join(
            f"{name} {error:.1e}" for name, error in check["errors"].items())
        lines.append(f"| {r['label']} | {r['tflops_triton']:.0f} | {r['tflops_sdpa']:.0f} | {r['ratio']:.2f} | "
                     f"{r['peak_mib_triton']:.0f} | {r['peak_mib_sdpa']:.0f} | {verdict} |")
    for mode in ("fwd", "fwd+bwd"):
        ratios = [r["ratio"] for r in results if "ratio" in r and r["row"]["mode"] == mode]
        if ratios:
            lines.append(f"\n{mode}: geometric-mean ratio {_geomean(ratios):.3f}, min {min(ratios):.3f} "
                         f"over {len(ratios)} rows")
    return "\n".join(lines)


def _check_table(results: list[dict]) -> str:
    lines = ["| case | atomic: out lse dq dk dv | deterministic: out lse dq dk dv | det. bitwise | passed |",
             "| --- | --- | --- | --- | --- |"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error']} | | | FAIL |")
            continue

        def fmt(errors):
            return " ".join(f"{errors[n]:.1e}" for n in ("out", "lse", "dq", "dk", "dv"))

        lines.append(f"| {r['case']['name']} | {fmt(r['atomic']['errors'])} | {fmt(r['deterministic']['errors'])} | "
                     f"{r['bitwise_repeat']} | {'ok' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def _write(out_dir: str | None, name: str, text: str) -> None:
    if out_dir is None:
        return
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sections", default="check,spread,bench",
                        help=f"comma-separated, from {','.join(SECTIONS)} (default: check,spread,bench)")
    parser.add_argument("--out", default=None, help="directory for the JSON results and tables")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes that compile the kernels before timing (1: compile while timing)")
    parser.add_argument("--seqlens", default=",".join(map(str, SEQLENS)), help="bench seqlens, comma-separated")
    parser.add_argument("--use-sweep", action="store_true",
                        help="bench with the sweep's best tiles where it has them, else the configuration table")


def run(args: argparse.Namespace) -> int:
    from fa2_verify.core.errors import UsageError

    sections = tuple(s for s in args.sections.split(",") if s)
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise UsageError(f"--sections={args.sections} names {unknown}: use some of {','.join(SECTIONS)}")
    seqlens = tuple(int(s) for s in args.seqlens.split(","))
    rows = tuple(r for r in BENCH_ROWS if r.seqlen in seqlens)
    started = time.time()
    warm_errors = warm_up(_jobs(sections, rows), args.jobs)
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "warm_errors": warm_errors,
                    "warm_seconds": time.time() - started}
    import triton

    report["triton"] = triton.__version__
    print(f"device {report['device']}, torch {torch.__version__}, triton {triton.__version__}; "
          f"compiled in {report['warm_seconds']:.0f}s; warm-up errors: {len(warm_errors)}", flush=True)
    for message in warm_errors:
        print("  warm-up:", message, flush=True)

    if "check" in sections:
        results = []
        for case in CHECK_CASES:
            try:
                results.append(check_case(case))
            except Exception as exc:
                results.append({"name": case.name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        report["check"] = results
        report["negative_control"] = negative_control()
        table = _check_table(results)
        _write(args.out, "check.md", table)
        print(table, "\n", json.dumps(report["negative_control"]), flush=True)

    if "spread" in sections:
        report["spread"] = [dq_spread(dtype) for dtype in DTYPES]
        print(json.dumps(report["spread"], indent=1), flush=True)

    tiles_override = None
    if "sweep" in sections:
        results = [sweep_point(point) for point in SWEEP_POINTS]
        report["sweep"] = results
        best = best_tiles(results)
        report["sweep_best"] = {f"{p} d={d} {size}": tile.as_dict() for (p, d, size), tile in best.items()}
        lines = [f"{r['point']['pass_name']:<12} d={r['point']['head_dim']:<3} s={r['point']['seqlen']:<5} "
                 f"causal={r['point']['causal']!s:<5} "
                 f"{tuple(r['point']['tile'].values())} " + (f"{r['ms']:.3f} ms" if "ms" in r else r["error"])
                 for r in results]
        _write(args.out, "sweep.txt", "\n".join(lines))
        print("\n".join(lines), "\nbest:", json.dumps(report["sweep_best"]), flush=True)
        if args.use_sweep:
            tiles_override = best

    if "bench" in sections:
        results = []
        for row in rows:
            tiles = None
            if tiles_override:
                tiles = {p: t for (p, d, size), t in tiles_override.items()
                         if d == row.head_dim and size == bucket(row.seqlen)}
            try:
                results.append(bench_row(row, tiles=tiles))
            except Exception as exc:
                results.append({"label": row.label(), "row": dataclasses.asdict(row),
                                "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        report["bench"] = results
        table = _bench_table(results)
        _write(args.out, "bench.md", table)
        print(table, flush=True)

    from fa2_verify.kernels.triton_fa2 import KERNEL

    report["config"] = KERNEL.config()
    _write(args.out, "report.json", json.dumps(report, indent=1, default=str))
    failed = [r for r in report.get("check", []) if not r.get("passed")]
    failed += [r for r in report.get("bench", []) if r.get("check") and not r["check"]["passed"]]
    return 1 if failed or warm_errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_kernels", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
