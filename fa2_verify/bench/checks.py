"""The benchmark's ``check`` section: the bundled ``triton`` kernel on odd feature cases, through :mod:`verify.check`.

Every feature on odd shapes (masks, GQA/MQA, seqlens 1 and primes, head dims
32..256, fp16/bf16/fp32, varlen with an empty sequence, strided inputs).  Each
case is a :class:`~core.case.CaseSpec` (a :class:`~core.varlen.VarlenSpec` for
packed batches) checked by the product's one path: outputs poisoned, the
contract checked, every output compared with the golden under the error
model (:func:`verify.check.check_case`, :func:`verify.check.check_varlen`).
Both backward modes are checked, and the deterministic one is run twice and
must repeat dq, dk and dv bit for bit.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import torch

from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.layouts import in_layout
from fa2_verify.core.varlen import VarlenSpec, pack
from fa2_verify.golden.options import GoldenOptions, shared_cache_dir
from fa2_verify.verify.check import check_case, check_varlen
from fa2_verify.verify.kernel_call import run_case, run_varlen
from fa2_verify.verify.registry import LoadedKernel, load_kernel
from fa2_verify.verify.results import CaseResult

#: Where the cases run (the checks also run on the CPU under the Triton interpreter).
DEVICE = "cuda"


@dataclasses.dataclass(frozen=True)
class CheckCase:
    """A case of the check section: its spec, and the memory layout its inputs are passed in."""

    spec: CaseSpec
    layout: str = "contiguous"

    @property
    def name(self) -> str:
        return self.spec.name


def _spec(name: str, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, **features) -> CaseSpec:
    return CaseSpec(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, seed=1, name=name, **features)


def _varlen(name: str, seqlens, heads_q, heads_kv, head_dim, dtype, **features) -> VarlenSpec:
    return VarlenSpec.packing(
        seqlens, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, dtype=dtype, seed=1, name=name, **features
    )


CHECK_CASES: tuple[CheckCase, ...] = (
    CheckCase(_spec("causal-odd", 2, 1000, 1000, 4, 4, 64, "float16", causal=True)),
    CheckCase(_spec("sk>sq-prime", 1, 513, 1031, 4, 4, 128, "bfloat16")),
    CheckCase(_spec("window-d40", 2, 777, 777, 2, 2, 40, "float16", window_size=(64, 32))),
    CheckCase(_spec("causal-sq>sk-d80", 1, 1031, 513, 2, 2, 80, "bfloat16", causal=True)),
    CheckCase(_spec("gqa-causal-d96", 1, 600, 600, 8, 2, 96, "float16", causal=True)),
    CheckCase(_spec("mqa-window-d112", 1, 333, 999, 6, 1, 112, "bfloat16", causal=True, window_size=(100, -1))),
    CheckCase(_spec("sq1-d160", 2, 1, 1000, 4, 2, 160, "float16")),
    CheckCase(_spec("sk1-causal-d192", 1, 997, 1, 2, 2, 192, "bfloat16", causal=True)),
    CheckCase(_spec("causal-d256", 1, 1024, 1024, 2, 2, 256, "float16", causal=True)),
    CheckCase(_spec("d256-bf16", 1, 300, 700, 2, 1, 256, "bfloat16")),
    CheckCase(_spec("fp32-causal", 1, 257, 257, 2, 2, 64, "float32", causal=True)),
    CheckCase(_spec("fp32-window-d128", 1, 200, 300, 2, 2, 128, "float32", window_size=(32, 32))),
    CheckCase(_spec("fp32-d256", 1, 100, 130, 2, 2, 256, "float32")),
    CheckCase(_spec("diagonal-d32", 1, 500, 500, 2, 2, 32, "float16", window_size=(0, 0))),
    CheckCase(_spec("large-logits", 1, 512, 512, 2, 2, 64, "float16", causal=True, generator="normal-x2^3")),
    CheckCase(_spec("strided", 2, 300, 301, 4, 2, 64, "float16", causal=True), layout="heads-major"),
    CheckCase(_spec("strided-head-dim", 2, 300, 301, 4, 2, 64, "float16", causal=True), layout="padded-head-dim"),
    CheckCase(_varlen("varlen-empty-seq", ((100, 0), (0, 50), (1000, 1300), (237, 240)), 4, 4, 128, "float16", causal=True)),
    CheckCase(_varlen("varlen-gqa-window", ((700, 650), (1, 17), (333, 333)), 4, 2, 64, "bfloat16", window_size=(128, 16))),
)


def kernel() -> LoadedKernel:
    return load_kernel("triton")


def golden_options() -> GoldenOptions:
    """The golden cache the CLI uses (``$FA2_VERIFY_GOLDEN_CACHE`` or ``./.fa2-golden-cache``): both backward
    modes of a case, and later runs, share one golden."""
    return GoldenOptions(cache_dir=shared_cache_dir(pathlib.Path()))


def _summary(results: list[CaseResult]) -> dict[str, Any]:
    """Passed or not, with each output's largest normalized error (over sequences, for varlen)."""
    worst: dict[str, float] = {}
    for result in results:
        for name, comparison in result.comparisons.items():
            worst[name] = max(worst.get(name, 0.0), comparison.normalized.quantiles["max"])
    reasons = sorted({result.reason for result in results if result.reason})
    return {"passed": all(result.passed for result in results), "normalized_max": worst, "reasons": reasons}


def _checked(target: LoadedKernel, case: CheckCase, spec: CaseSpec, device: str) -> list[CaseResult]:
    if isinstance(spec, VarlenSpec):
        return check_varlen(target, pack(spec, device), golden_options=golden_options())
    built = make_case(spec, device)
    return [check_case(target, in_layout(built, case.layout), golden_options=golden_options())]


def _outputs(target: LoadedKernel, case: CheckCase, spec: CaseSpec, device: str) -> dict[str, torch.Tensor]:
    if isinstance(spec, VarlenSpec):
        return run_varlen(target, pack(spec, device))
    return run_case(target, in_layout(make_case(spec, device), case.layout))


def warm(case: CheckCase, *, device: str = DEVICE) -> None:
    """Run the kernel on ``case`` in both backward modes, unchecked: compiles the variants :func:`check` needs."""
    for deterministic in (False, True):
        _outputs(kernel(), case, dataclasses.replace(case.spec, deterministic=deterministic), device)


def check(case: CheckCase, *, device: str = DEVICE) -> dict[str, Any]:
    """Both backward modes of ``case`` through the product's check; the deterministic one repeated bit for bit."""
    target = kernel()
    deterministic = dataclasses.replace(case.spec, deterministic=True)
    record: dict[str, Any] = {
        "name": case.name,
        "case": case.spec.to_dict(),
        "layout": case.layout,
        "atomic": _summary(_checked(target, case, case.spec, device)),
        "deterministic": _summary(_checked(target, case, deterministic, device)),
    }
    first, again = (_outputs(target, case, deterministic, device) for _ in range(2))
    record["bitwise_repeat"] = all(torch.equal(first[name], again[name]) for name in ("dq", "dk", "dv"))
    record["passed"] = record["atomic"]["passed"] and record["deterministic"]["passed"] and record["bitwise_repeat"]
    return record


class _CausalAlways:
    """The triton kernel run with ``causal=True`` whatever it is asked: the check's negative control."""

    def __init__(self, target: LoadedKernel):
        self.target = target.target
        self.capabilities = target.capabilities

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1)):
        return self.target.forward(q, k, v, softmax_scale=softmax_scale, causal=True, window_size=window_size)

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(-1, -1), deterministic=False):
        return self.target.backward(
            dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=True, window_size=window_size,
            deterministic=deterministic,
        )  # fmt: skip


def negative_control(*, device: str = DEVICE, spec: CaseSpec | None = None) -> dict[str, Any]:
    """The check must fail a wrong answer: a causal output checked as the non-causal ``spec`` (default: the first case)."""
    spec = dataclasses.replace(spec or CHECK_CASES[0].spec, causal=False, window_size=(-1, -1), name="negative-control")
    broken = LoadedKernel("negative-control:causal-always", _CausalAlways(kernel()))
    summary = _summary([check_case(broken, make_case(spec, device))])
    return {"name": "negative-control (causal kernel checked as non-causal)", **summary, "failed_as_it_must": not summary["passed"]}
