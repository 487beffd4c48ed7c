"""The fixed case set of ``fa2-verify run``: small, deterministic, forward and backward.

Every dtype (float16, bfloat16, float32) meets each mask kind (none, causal,
sliding window) at least once; causal appears with ``seqlen_q < seqlen_k`` and
with ``seqlen_q > seqlen_k`` (bottom-right alignment then leaves the first
rows without a visible key), and one window leaves rows without a visible key
too.  Head layouts cover MHA, GQA and MQA; head dims 32, 40 and 64; sequence
lengths are odd (1, 17, 33) or not a multiple of the usual block sizes (40),
so tail blocks are exercised.  Two cases carry what production kernels serve
with paths of their own: a decoding query (``seqlen_q = 1``, GQA) and a short
query block, each against 257 keys (rows spanning three tiles of 128: the
split-KV combine, the running max and rescaling across tiles) under a window
bounded on the left only, with an explicit ``softmax_scale`` and the
deterministic backward.  Two windows have a right bound past ``seqlen_k``
with ``seqlen_q > seqlen_k + 1``, which still hides keys from the first rows
under bottom-right alignment: flash-attn reads such a bound as unbounded, or
as ``seqlen_k`` when the left side is bounded, and so shows those rows keys
the mask hides (docs/targets.md).  One case is a packed batch (:class:`core.varlen.VarlenSpec`)
through the varlen entry points: five causal GQA sequences of different lengths,
one with no query, one with no key, one whose first rows see no key, so
``cu_seqlens`` offsets, per-sequence bottom-right alignment and empty
sequences are exercised; a kernel without varlen entry points reports it
unsupported.  Inputs come from the ``normal`` and ``uniform`` generators with
fixed seeds, so every run sees the same numbers.

Each case is fitted to the kernel under test before it runs (:mod:`app.cases.fitting`).
"""

from __future__ import annotations

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.varlen import VarlenSpec


def _case(name: str, dtype: str, batch: int, seqlen_q: int, seqlen_k: int, heads_q: int, heads_kv: int,
          head_dim: int, *, seed: int, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
          generator: str = "normal", softmax_scale: float | None = None, deterministic: bool = False) -> CaseSpec:
    return CaseSpec(
        batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
        head_dim=head_dim, dtype=dtype, causal=causal, window_size=window_size, generator=generator,
        seed=seed, backward=True, name=name, softmax_scale=softmax_scale, deterministic=deterministic,
    )


FIXED_CASES: tuple[CaseSpec, ...] = (
    _case("fp16-none-gqa", "float16", 2, 17, 33, 4, 2, 32, seed=1),
    _case("fp16-causal", "float16", 1, 33, 33, 2, 2, 64, seed=2, causal=True),
    _case("fp16-window-mqa", "float16", 1, 33, 40, 4, 1, 40, seed=3, window_size=(7, 3), generator="uniform"),
    _case("fp16-none-sk1", "float16", 1, 17, 1, 2, 2, 32, seed=4),
    _case("bf16-none-sq1", "bfloat16", 1, 1, 33, 2, 2, 64, seed=5),
    _case("bf16-causal-mqa-empty-rows", "bfloat16", 2, 33, 17, 2, 1, 32, seed=6, causal=True),
    _case("bf16-window-empty-rows", "bfloat16", 1, 40, 17, 3, 3, 40, seed=7, window_size=(3, 1), generator="uniform"),
    _case("fp32-none-gqa", "float32", 1, 33, 17, 4, 2, 40, seed=8, generator="uniform"),
    _case("fp32-causal", "float32", 2, 17, 33, 2, 2, 64, seed=9, causal=True),
    _case("fp32-window-mqa", "float32", 1, 33, 33, 2, 1, 32, seed=10, window_size=(5, 5)),
    _case("fp16-left-window-decode-gqa", "float16", 1, 1, 257, 4, 2, 64, seed=11, window_size=(200, -1),
          softmax_scale=0.3, deterministic=True),
    _case("fp16-left-window-sk257", "float16", 1, 20, 257, 2, 2, 32, seed=12, window_size=(200, -1),
          softmax_scale=0.3, deterministic=True),
    _case("fp16-right-window-past-keys", "float16", 1, 40, 17, 2, 2, 64, seed=14, window_size=(-1, 20)),
    _case("bf16-window-past-keys-gqa", "bfloat16", 1, 33, 9, 4, 2, 32, seed=15, window_size=(4, 12)),
    VarlenSpec.packing(((17, 40), (0, 9), (33, 17), (6, 0), (1, 33)), heads_q=4, heads_kv=2, head_dim=40,
                       dtype="float16", causal=True, seed=13, backward=True, name="fp16-varlen-causal-gqa"),
)
