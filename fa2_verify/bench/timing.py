"""The benchmark's ``bench`` and ``spread`` sections: ``triton`` against PyTorch's FA2 on a GPU.

``bench``: ``triton`` and SDPA's flash backend
(``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``) in the same run: forward and
forward+backward, causal or not, head dims 64 and 128, seqlen 1k..16k at 16k
tokens per batch (hidden 2048), fp16 and bf16.  CUDA-event medians
(``triton.testing.do_bench``) after warm-up; TFLOP/s of both, their ratio,
and the peak memory of each call.  Each row's correctness column is a
:func:`verify.check.check_case` verdict of the row's configuration (mode,
causal, head_dim, dtype) on one batch element and two heads at
``min(seqlen, CHECK_SEQLEN)``, so the golden stays cheap.

``spread``: dq of the default (atomic) backward over repeated calls, the
largest distance in units in the last place to the first call
(:func:`verify.metrics.ulp`); the deterministic backward must repeat dq, dk,
dv bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fa2_verify.app.runs import golden_options
from fa2_verify.app.targets import load_target
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.contract import DTYPES
from fa2_verify.kernels.triton_fa2.configs import TileConfig
from fa2_verify.verify.check import check_case
from fa2_verify.verify.metrics import ulp

#: Tokens per batch (batch * seqlen) and model width (heads * head_dim) of the benchmark rows.
TOKENS = 16384
HIDDEN = 2048
SEQLENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
DTYPES_BENCHED = ("float16", "bfloat16")
#: Longest sequence a row's correctness check runs at (the golden's cost grows as seqlen^2).
CHECK_SEQLEN = 2048


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


def timing_inputs(batch: int, seqlen: int, heads: int, head_dim: int, dtype: str, *, seed: int):
    """Standard normal (q, k, v, dout) on the GPU, (batch, seqlen, heads, head_dim): timing inputs only."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, seqlen, heads, head_dim)
    return tuple(
        torch.randn(*shape, generator=generator, device="cuda", dtype=torch.float32).to(DTYPES[dtype]) for _ in range(4)
    )


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

    def check_spec(self) -> CaseSpec:
        """The row's configuration as a case small enough for the golden (module docstring)."""
        seqlen = min(self.seqlen, CHECK_SEQLEN)
        return CaseSpec(
            batch=1, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=2, heads_kv=2, head_dim=self.head_dim, dtype=self.dtype,
            causal=self.causal, backward=self.mode == "fwd+bwd", seed=7,
            name=f"bench {self.mode} {'causal' if self.causal else 'full'} d={self.head_dim} s={seqlen} {self.dtype}",
        )  # fmt: skip


BENCH_ROWS: tuple[BenchRow, ...] = tuple(
    BenchRow(mode, causal, head_dim, seqlen, dtype)
    for mode in ("fwd", "fwd+bwd")
    for causal in (False, True)
    for head_dim in HEAD_DIMS
    for dtype in DTYPES_BENCHED
    for seqlen in SEQLENS
)


def row_inputs(row: BenchRow):
    return timing_inputs(row.batch, row.seqlen, row.heads, row.head_dim, row.dtype, seed=7)


def _ours(row: BenchRow, q, k, v, dout, tiles: Mapping[str, TileConfig] | None = None):
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


def check_row(row: BenchRow) -> dict[str, Any]:
    """The row's correctness column: :func:`verify.check.check_case` of :meth:`BenchRow.check_spec`."""
    return _checked(row.check_spec())


@functools.lru_cache(maxsize=None)
def _checked(spec: CaseSpec) -> dict[str, Any]:
    """Rows whose check specs coincide (the longer seqlens) are checked once per run."""
    result = check_case(load_target("triton"), make_case(spec, "cuda"), golden_options=golden_options())
    worst = {name: comparison.normalized.quantiles["max"] for name, comparison in result.comparisons.items()}
    return {"passed": result.passed, "status": result.status, "reason": result.reason, "normalized_max": worst}


def bench_row(row: BenchRow, *, tiles=None, warm_only: bool = False, with_check: bool = True) -> dict:
    q, k, v, dout = row_inputs(row)
    ours, sdpa = _ours(row, q, k, v, dout, tiles), _sdpa(row, q, k, v, dout)
    if warm_only:
        ours()
        return {}
    check = check_row(row) if with_check else None
    ms_ours, ms_sdpa = median_ms(ours), median_ms(sdpa)
    flops = row.flops()
    return {
        "row": dataclasses.asdict(row), "label": row.label(),
        "ms_triton": ms_ours, "ms_sdpa": ms_sdpa,
        "tflops_triton": flops / ms_ours * 1e-9, "tflops_sdpa": flops / ms_sdpa * 1e-9,
        "ratio": ms_sdpa / ms_ours,
        "peak_mib_triton": peak_mib(ours), "peak_mib_sdpa": peak_mib(sdpa),
        "check": check,
    }  # fmt: skip


def ulp_distance(actual: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``|actual - reference|`` in units in the last place of ``reference`` in its dtype (:func:`verify.metrics.ulp`)."""
    reference64 = reference.detach().to("cpu", torch.float64)
    return (actual.detach().to("cpu", torch.float64) - reference64).abs() / ulp(reference64, reference.dtype)


def dq_spread(dtype: str, *, repeats: int = 20, seqlen: int = 4096, head_dim: int = 128, warm_only: bool = False) -> dict:
    kernel = load_target("triton")
    batch, heads = TOKENS // seqlen, HIDDEN // head_dim
    q, k, v, dout = timing_inputs(batch, seqlen, heads, head_dim, dtype, seed=3)
    scale = 1.0 / math.sqrt(head_dim)
    out, lse = kernel.forward(q, k, v, softmax_scale=scale, causal=True)
    result = {"dtype": dtype, "seqlen": seqlen, "batch": batch, "heads": heads, "head_dim": head_dim,
              "causal": True, "repeats": repeats}  # fmt: skip
    for deterministic in (False, True):
        runs = [
            kernel.backward(dout, q, k, v, out, lse, softmax_scale=scale, causal=True, deterministic=deterministic)
            for _ in range(1 if warm_only else repeats)
        ]
        if warm_only:
            continue
        first = runs[0]
        distance = torch.stack([ulp_distance(run[0], first[0]).max() for run in runs[1:]])
        differing = torch.stack([(run[0] != first[0]).float().mean() for run in runs[1:]])
        key = "deterministic" if deterministic else "atomic"
        result[key] = {
            "dq_max_ulp": float(distance.max()),
            "dq_fraction_differing_max": float(differing.max()),
            "dq_bitwise_identical": all(torch.equal(run[0], first[0]) for run in runs[1:]),
            "dk_dv_bitwise_identical": all(
                torch.equal(run[1], first[1]) and torch.equal(run[2], first[2]) for run in runs[1:]
            ),
        }
    return result
