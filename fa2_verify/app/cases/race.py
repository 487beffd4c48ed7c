"""The race-prone case set of ``fa2-verify race``: shapes where a backward's accumulation order shows.

A race that shows once in many runs needs many calls on the shapes where the
schedule has choices to make.  flash-attn's determinism tests (issue 29; its
PR #1766 dropped FA3's deterministic flag silently in 2025) run 1,000 to
10,000 backward calls at seqlen 4,224 (4,096 + 128: one key tile past a
power of two, so the last tile of each row is the odd one out) and at
``(seqlen_q, seqlen_k) = (2000, 4000)`` (neither a multiple of the usual
tiles, twice as many keys as queries).  :data:`CUDA_CASES` are those, with
GQA (several query heads adding into one kv head's dK, dV), causal and not,
each in the default backward (dQ by atomic adds, spread within the bound of
docs/error-model.md) and with ``deterministic=True`` (every output bitwise),
plus short lengths just past a tile (65, 129) with many (batch, head) pairs,
where many programs race for the same accumulator rows.
:data:`CPU_CASES` is the same set scaled to the plain-PyTorch ``reference``
kernel (key tile 16): lengths just past a tile, tiny, so that hundreds of
repeats take seconds.
"""

from __future__ import annotations

from typing import Mapping

from fa2_verify.core.case import CaseSpec


def _case(name: str, dtype: str, batch: int, seqlen_q: int, seqlen_k: int, heads_q: int, heads_kv: int,
          head_dim: int, *, seed: int, causal: bool = False, deterministic: bool = False) -> CaseSpec:
    return CaseSpec(
        batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
        head_dim=head_dim, dtype=dtype, causal=causal, seed=seed, backward=True, deterministic=deterministic,
        name=name,
    )


CUDA_CASES: tuple[CaseSpec, ...] = (
    # flash-attn's seqlen 4,224 = 4,096 + 128, GQA 4:1, causal and not, both backward modes
    _case("race-s4224-causal-gqa-bf16", "bfloat16", 1, 4224, 4224, 8, 2, 128, seed=301, causal=True),
    _case("race-s4224-causal-gqa-bf16-det", "bfloat16", 1, 4224, 4224, 8, 2, 128, seed=301, causal=True,
          deterministic=True),
    _case("race-s4224-none-fp16", "float16", 1, 4224, 4224, 8, 8, 64, seed=302),
    _case("race-s4224-none-fp16-det", "float16", 1, 4224, 4224, 8, 8, 64, seed=302, deterministic=True),
    # flash-attn's (seqlen_q, seqlen_k) = (2000, 4000)
    _case("race-sq2000-sk4000-causal-fp16", "float16", 2, 2000, 4000, 8, 2, 128, seed=303, causal=True),
    _case("race-sq2000-sk4000-none-bf16-det", "bfloat16", 2, 2000, 4000, 8, 8, 64, seed=304, deterministic=True),
    # one row just past a tile, many (batch, head) pairs racing
    _case("race-s129-gqa-fp16", "float16", 16, 129, 129, 16, 4, 64, seed=305),
    _case("race-sq65-sk129-causal-bf16-det", "bfloat16", 16, 65, 129, 16, 4, 64, seed=306, causal=True,
          deterministic=True),
)

CPU_CASES: tuple[CaseSpec, ...] = (
    # 65 = 4 x 16 + 1: one key past the reference's tiles of 16, GQA, causal, both backward modes; float32,
    # whose dq shows a changed order of five block sums where a 16-bit rounding may hide it
    _case("race-cpu-s65-causal-gqa-fp32", "float32", 1, 65, 65, 2, 1, 8, seed=401, causal=True),
    _case("race-cpu-s65-causal-gqa-fp32-det", "float32", 1, 65, 65, 2, 1, 8, seed=401, causal=True,
          deterministic=True),
    # (2000, 4000) scaled down: about twice as many keys as queries, no mask, float16
    _case("race-cpu-sq33-sk65-fp16", "float16", 1, 33, 65, 1, 1, 8, seed=402),
)

#: The race-prone set per device type.
RACE_CASES: Mapping[str, tuple[CaseSpec, ...]] = {"cuda": CUDA_CASES, "cpu": CPU_CASES}
