"""Tile configurations per GPU target, pass, precision and padded head dim.

A :class:`TileConfig` is what Triton needs to build one kernel variant: the
query tile ``block_m``, the key tile ``block_n``, ``num_warps`` and the
software-pipelining depth ``num_stages``.  The table below is fixed (no
autotuning at run time), so a run is reproduced by the same table; every
choice made in this process is recorded and returned by
:func:`recorded` (the kernel's ``config()``).

The ``sm90`` rows were chosen by the sweeps of ``fa2_verify/bench`` (``fa2-verify bench``)
(``--sections sweep``) on an H200 (the H100's chip); docs/benchmarks.md gives
the measurements.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any

import torch

#: Kernel passes that take a tile configuration.
PASSES: tuple[str, ...] = ("forward", "backward_kv", "backward_dq")


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """``use_tma``: load tiles through TMA tensor descriptors (Hopper, 16-bit, aligned) instead of pointers."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def _rows(entries: dict[tuple[str, str, int], tuple]) -> dict[tuple[str, str, int], TileConfig]:
    return {key: TileConfig(*value) for key, value in entries.items()}


#: (pass, precision, padded head dim) -> (block_m, block_n, num_warps, num_stages[, use_tma]).
_SM90 = _rows(
    {
        ("forward", "16bit", 32): (128, 64, 8, 3),
        ("forward", "16bit", 64): (128, 64, 8, 3),
        ("forward", "16bit", 128): (128, 128, 8, 3),
        ("forward", "16bit", 256): (64, 64, 4, 2),
        ("backward_kv", "16bit", 32): (32, 128, 4, 3, True),
        ("backward_kv", "16bit", 64): (32, 128, 4, 3, True),
        ("backward_kv", "16bit", 128): (64, 128, 8, 3),
        ("backward_kv", "16bit", 256): (32, 64, 8, 2),
        ("backward_dq", "16bit", 32): (128, 64, 8, 3),
        ("backward_dq", "16bit", 64): (128, 64, 8, 3),
        ("backward_dq", "16bit", 128): (128, 64, 8, 3),
        ("backward_dq", "16bit", 256): (64, 32, 4, 2),
        ("forward", "float32", 32): (64, 64, 16, 1),
        ("forward", "float32", 64): (64, 64, 16, 1),
        ("forward", "float32", 128): (64, 32, 16, 1),
        ("forward", "float32", 256): (32, 32, 16, 1),
        ("backward_kv", "float32", 32): (32, 64, 16, 1),
        ("backward_kv", "float32", 64): (32, 64, 16, 1),
        ("backward_kv", "float32", 128): (32, 32, 16, 1),
        ("backward_kv", "float32", 256): (16, 32, 16, 1),
        ("backward_dq", "float32", 32): (64, 32, 16, 1),
        ("backward_dq", "float32", 64): (64, 32, 16, 1),
        ("backward_dq", "float32", 128): (32, 32, 16, 1),
        ("backward_dq", "float32", 256): (32, 16, 16, 1),
    }
)

#: Rows for short sequences (max(seqlen_q, seqlen_k) <= SHORT_SEQLEN) where they differ.
_SM90_SHORT = _rows(
    {
        ("forward", "16bit", 128): (128, 64, 8, 3),
        ("backward_dq", "16bit", 64): (64, 64, 4, 3),
    }
)

#: (precision, padded head dim) whose default backward computes dQ in the deterministic pass over query
#: tiles rather than by fp32 atomic adds in the key-tile pass, because it is faster there: at head_dim 64
#: the two-pass backward took 3.53 ms against 3.74 (geometric mean over seqlen 1k/4k/16k, causal and
#: full, float16, one H100; docs/benchmarks.md, "The head_dim 64 backward").
_SM90_SEPARATE_DQ = frozenset({("16bit", 64)})

#: Other CUDA GPUs: conservative tiles that fit 100 KB of shared memory (not tuned).
_GENERIC_CUDA = _rows(
    {
        (pass_name, precision, block_d): (
            (64 if block_d <= 128 else 32) if precision == "16bit" else (32 if block_d <= 128 else 16),
            (64 if block_d <= 64 else 32) if precision == "16bit" else (32 if block_d <= 64 else 16),
            4,
            2 if block_d <= 128 else 1,
        )
        for pass_name in PASSES
        for precision in ("16bit", "float32")
        for block_d in (32, 64, 128, 256)
    }
)

#: The CPU interpreter: small tiles, so that tiny test shapes span several tiles.
_INTERPRETER = _rows(
    {
        (pass_name, precision, block_d): (16, 16, 1, 1)
        for pass_name in PASSES
        for precision in ("16bit", "float32")
        for block_d in (32, 64, 128, 256)
    }
)

TABLES: dict[str, dict[tuple[str, str, int], TileConfig]] = {
    "sm90": _SM90,
    "cuda": _GENERIC_CUDA,
    "interpreter": _INTERPRETER,
}
SHORT_TABLES: dict[str, dict[tuple[str, str, int], TileConfig]] = {"sm90": _SM90_SHORT}
SEPARATE_DQ: dict[str, frozenset[tuple[str, int]]] = {"sm90": _SM90_SEPARATE_DQ}

#: Sequences up to this length use the short-sequence rows: their few key tiles per program
#: favour smaller tiles than long sequences do.
SHORT_SEQLEN = 2048

_lock = threading.Lock()
_recorded: dict[str, dict[str, Any]] = {}


@functools.cache
def compute_capability(device: torch.device) -> tuple[int, int]:
    """``device``'s CUDA compute capability, asked once per device (every kernel call needs it)."""
    return torch.cuda.get_device_capability(device)


def target_for(device: torch.device, interpret: bool) -> str:
    """The table a device uses: ``interpreter``, ``sm90`` (Hopper) or ``cuda``."""
    if interpret or device.type != "cuda":
        return "interpreter"
    major, _minor = compute_capability(device)
    return "sm90" if major == 9 else "cuda"


def precision_of(dtype: torch.dtype) -> str:
    return "float32" if dtype == torch.float32 else "16bit"


def bucket(seqlen: int) -> str:
    """``short`` or ``long``: which rows a (maximum) sequence length uses."""
    return "short" if seqlen <= SHORT_SEQLEN else "long"


def select(target: str, pass_name: str, dtype: torch.dtype, block_d: int, seqlen: int) -> TileConfig:
    key = (pass_name, precision_of(dtype), block_d)
    if bucket(seqlen) == "short" and key in SHORT_TABLES.get(target, {}):
        return SHORT_TABLES[target][key]
    return TABLES[target][key]


def separate_dq(target: str, dtype: torch.dtype, block_d: int) -> bool:
    """Whether ``target``'s default (non-deterministic) backward computes dQ in its own pass."""
    return (precision_of(dtype), block_d) in SEPARATE_DQ.get(target, frozenset())


def record(call: str, entry: dict[str, Any]) -> None:
    """Remember the configuration a call shape used (the last one wins)."""
    with _lock:
        _recorded[call] = entry


def recorded() -> dict[str, dict[str, Any]]:
    with _lock:
        return {call: dict(entry) for call, entry in _recorded.items()}
