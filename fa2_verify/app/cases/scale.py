"""The ``scale`` case set of ``fa2-verify run --cases scale``: production lengths, on a GPU and scaled to a CPU.

The bugs that hurt kernels in production live where the fixed set
(:mod:`app.cases.fixed`) never goes: 32-bit offsets that wrap past 2^31
elements, grid limits at 65,536 programs, key indices past 65,536,
statistics combined over hundreds of key blocks, split-KV paths that only
engage for long keys, head_dim > 128 code paths, and padded workspaces (a
dQ accumulator of 128-row tiles) past 2^31 elements for many short sequences.  :data:`CUDA_CASES`
reaches each of them (the comment of each case says which), sized so that
the size guard's estimate of its device memory, ``verify.memory.estimate(spec,
"cuda").device``, stays under :data:`DEVICE_BYTES`, an 80 GB H100.
:data:`CPU_CASES` is the same set scaled to what a 2-core CPU runs through the
plain-PyTorch ``reference`` kernel in a few minutes: at least 4096 keys and
head_dim 256 still appear, the >2^31-element and 65,536-program cases become
many (batch, head) pairs.  Every case draws ``boundary-keys`` values
(:mod:`core.values`): normal entries, except that the rows and keys where
index and offset bugs live (keys 2^16 - 1 to 2^17, the last key and the
last key tile, the first and last query tile, the tile edges, the row whose
offset passes 2^31) carry one dominant score each, so a key a kernel never
visits or a row it leaves stale errs by a whole value, not by
``1/seqlen_k`` of one.  docs/benchmarks.md ("Scale") lists every case with
its estimate and measured times.
"""

from __future__ import annotations

from typing import Mapping

from fa2_verify.core.case import CaseSpec

#: Device memory the GPU set must fit in, by ``verify.memory.estimate``: an
#: H100's 80 GB, less 2 GiB for the CUDA context and the caching allocator's slack.
DEVICE_BYTES = 80 * 10**9 - 2 * 2**30


def _case(name: str, dtype: str, batch: int, seqlen_q: int, seqlen_k: int, heads_q: int, heads_kv: int,
          head_dim: int, *, seed: int, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
          backward: bool = True) -> CaseSpec:
    """A scale case; its values are ``boundary-keys`` (:func:`core.values.boundary_pairs` names the
    rows and keys it targets: the key past 2^16, the last key, the last query tile, tile edges, the
    row whose offset passes 2^31)."""
    return CaseSpec(
        batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
        head_dim=head_dim, dtype=dtype, causal=causal, window_size=window_size, generator="boundary-keys",
        seed=seed, backward=backward, name=name,
    )


CUDA_CASES: tuple[CaseSpec, ...] = (
    # 4096: 32+ key blocks per row, combined statistics; causal
    _case("s4096-causal-bf16", "bfloat16", 2, 4096, 4096, 16, 16, 128, seed=101, causal=True),
    # 16384 x 16 heads, no mask: split-KV / persistent schedules for long keys
    _case("s16384-none-fp16", "float16", 1, 16384, 16384, 16, 16, 128, seed=102),
    # head_dim 256 with 32 query heads, GQA 8:1, causal
    _case("s16384-hd256-gqa8-causal-bf16", "bfloat16", 1, 16384, 16384, 32, 4, 256, seed=103, causal=True),
    # 65,537 keys: one key index past 65,536; seqlen_q != seqlen_k
    _case("sk65537-none-fp16", "float16", 1, 4097, 65537, 4, 4, 128, seed=104),
    # 65,537 tokens under a sliding window (Mistral-style, left 4096)
    _case("s65537-window-bf16", "bfloat16", 1, 65537, 65537, 4, 4, 128, seed=105, window_size=(4096, 0)),
    # 131,072 tokens, causal: 2,048 key blocks of 64 for the last rows
    _case("s131072-causal-bf16", "bfloat16", 1, 131072, 131072, 1, 1, 128, seed=106, causal=True),
    # 131,072 keys, no mask, seqlen_q != seqlen_k
    _case("sk131072-none-fp16", "float16", 1, 2048, 131072, 2, 2, 128, seed=107),
    # more than 2^31 elements in q (32 x 8457 x 32 x 256 = 2,216,951,808) and a batch offset
    # (31 x 8457 x 32 x 256 = 2,147,672,064) past 2^31: int32 offsets wrap; forward only.  32 batches
    # of 8457, not 16 of 17477: the smallest q with the last batch's offset past 2^31 shrinks
    # with the batch count, and 16 x 17477 needs 73.2 GiB, over DEVICE_BYTES
    _case("q-over-2^31-gqa8-causal-fp16", "float16", 32, 8457, 8457, 32, 4, 256, seed=108, causal=True,
          backward=False),
    # 8,388,609 queries: 65,537 query blocks of 128 (or more of smaller tiles) along one grid axis; forward only
    _case("grid-65537-blocks-fp16", "float16", 1, 8388609, 64, 1, 1, 32, seed=109, backward=False),
    # flash-attn's FA2 backward overflowed a 32-bit offset at batch 8,300, seqlen 1, 16 heads, head_dim 128
    # (issue 29, PR #2260): its dQ accumulator rounds seqlen_q up to 128, so 8300 x 16 x 128 x 128 =
    # 2,175,795,200 padded elements pass 2^31 while q holds 17 million; 3 keys so that one dominates
    _case("b8300-s1-h16-fp16", "float16", 8300, 1, 3, 16, 16, 128, seed=110),
)

CPU_CASES: tuple[CaseSpec, ...] = (
    # 4096 keys and more: many key blocks per row; seqlen_q != seqlen_k
    _case("cpu-sk4097-none-fp16", "float16", 1, 48, 4097, 2, 2, 64, seed=201),
    _case("cpu-sk4096-causal-bf16", "bfloat16", 1, 160, 4096, 2, 1, 32, seed=202, causal=True),
    _case("cpu-sk4096-window-fp32", "float32", 1, 96, 4096, 2, 2, 32, seed=203, window_size=(1024, 0)),
    # 65,537 keys: key 65,536 dominates the last row, keys 65,535 and the first dominate others
    _case("cpu-sk65537-none-fp16", "float16", 1, 16, 65537, 1, 1, 32, seed=206),
    # head_dim 256 with GQA 8:1
    _case("cpu-hd256-gqa8-causal-bf16", "bfloat16", 1, 129, 257, 8, 1, 256, seed=204, causal=True),
    # many (batch, head) pairs: 64 x 16 = 1,024 programs along the head axes
    _case("cpu-bh1024-gqa8-fp16", "float16", 64, 17, 33, 16, 2, 32, seed=205),
)

#: The scale set per device type.
SCALE_CASES: Mapping[str, tuple[CaseSpec, ...]] = {"cuda": CUDA_CASES, "cpu": CPU_CASES}

