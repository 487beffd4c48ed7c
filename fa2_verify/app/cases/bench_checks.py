"""The case set of the benchmark's ``check`` section (:mod:`bench.checks`): every feature on odd shapes.

Masks, GQA/MQA, seqlens 1 and primes, head dims 32..256, fp16/bf16/fp32,
varlen with an empty sequence, strided inputs: each case a
:class:`~core.case.CaseSpec` (a :class:`~core.varlen.VarlenSpec` for packed
batches) and the memory layout its inputs are passed in.
"""

from __future__ import annotations

import dataclasses

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.varlen import VarlenSpec


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
