"""Validate the golden's inputs and take them exactly as float64, head-major tensors on the golden's device.

Every kernel input dtype (float16, bfloat16, float32, float64) converts to
float64 without rounding, so the golden sees exactly what the kernel saw.
Tensors are stored head-major, ``(batch, heads, seqlen, head_dim)``, so one
head's rows are contiguous, on CUDA when the inputs are on CUDA and on the
CPU otherwise (:func:`golden_device`); :func:`to_contract` turns a result back
into the contract layout ``(batch, seqlen, heads, head_dim)`` (docs/design.md,
"The kernel contract").  The mask is kept as each query row's range of
visible keys (:func:`core.contract.visible_ranges`), never as a
``seqlen_q x seqlen_k`` array.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import numbers

import numpy as np
import torch

from fa2_verify.core import row_blocks
from fa2_verify.core.contract import BOTTOM_RIGHT, UNBOUNDED, dtype_name, effective_window, visible_ranges
from fa2_verify.core.digest import digest
from fa2_verify.core.errors import UsageError


@dataclasses.dataclass(frozen=True)
class HeadMajorInputs:
    """The golden's inputs, exact in float64, head-major, on the golden's device: tensors, not a case record.

    The case record is :class:`core.case.CaseSpec`; this is what the golden
    computes on, whatever case (or direct call) the tensors came from.

    ``q``, ``dout``: (batch, heads_q, seqlen_q, head_dim); ``k``, ``v``:
    (batch, heads_kv, seqlen_k, head_dim); ``dout`` is ``None`` for a forward-only
    golden.  Query ``i`` sees keys ``first[i] <= j <= last[i]`` (host int64
    arrays of :func:`core.contract.visible_ranges`, aligned as ``alignment``
    says, bottom-right unless the kernel declares top-left; both are
    non-decreasing in ``i``).  ``dtypes`` names the dtypes the inputs
    arrived in (part of the cache key).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor | None
    scale: float
    causal: bool
    window_size: tuple[int, int]
    alignment: str
    first: np.ndarray
    last: np.ndarray
    dtypes: tuple[str, ...]

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def heads_q(self) -> int:
        return self.q.shape[1]

    @property
    def heads_kv(self) -> int:
        return self.k.shape[1]

    @property
    def seqlen_q(self) -> int:
        return self.q.shape[2]

    @property
    def seqlen_k(self) -> int:
        return self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.q.shape[3]

    @property
    def group(self) -> int:
        """Query heads per kv head: query head ``h`` reads kv head ``h // group``."""
        return self.heads_q // self.heads_kv

    @property
    def work(self) -> int:
        """``batch * heads_q * seqlen_q * seqlen_k * head_dim``: the cost unit of the golden."""
        return self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim

    def seen_queries(self) -> range:
        """The query rows that see at least one key (a contiguous range)."""
        return row_blocks.seen_rows(self.first, self.last)

    def seen_keys(self) -> range:
        """The keys that at least one query sees (a contiguous range)."""
        rows = self.seen_queries()
        return range(int(self.first[rows.start]), int(self.last[rows.stop - 1]) + 1) if rows else range(0)

    def keys_of(self, i: int) -> range:
        """The keys query ``i`` sees."""
        return range(int(self.first[i]), int(self.last[i]) + 1)

    def queries_of(self, j: int) -> range:
        """The queries that see key ``j``: ``last[i] >= j`` and ``first[i] <= j``."""
        return range(int(np.searchsorted(self.last, j, side="left")), int(np.searchsorted(self.first, j, side="right")))

    @functools.cached_property
    def device_ranges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``first`` and ``last`` as int64 tensors on the golden's device, copied once."""
        return torch.from_numpy(self.first).to(self.device), torch.from_numpy(self.last).to(self.device)

    def visible(self, rows: slice, keys: slice) -> torch.Tensor:
        """Bool block ``mask[rows, keys]`` on the golden's device: True where query ``i`` sees key ``j``."""
        first, last = (ends[rows] for ends in self.device_ranges)
        j = torch.arange(keys.start, keys.stop, device=self.device)
        return (j >= first[:, None]) & (j <= last[:, None])

    def host(self, name: str) -> np.ndarray:
        """Input ``name`` (``"q"``, ``"k"``, ``"v"``, ``"dout"``) as a float64 numpy array on the host."""
        return getattr(self, name).cpu().numpy()


def prepare(q, k, v, dout, *, softmax_scale, causal, window_size, alignment=BOTTOM_RIGHT) -> HeadMajorInputs:
    """Check the arguments of :func:`golden.compute` and build the exact :class:`HeadMajorInputs`."""
    for name, tensor in (("q", q), ("k", k), ("v", v)) + ((("dout", dout),) if dout is not None else ()):
        _check_tensor(name, tensor)
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise UsageError(
            f"q.shape={tuple(q.shape)} and k.shape={tuple(k.shape)} differ in batch or head_dim: "
            "use q (batch, seqlen_q, heads_q, head_dim) and k (batch, seqlen_k, heads_kv, head_dim)"
        )
    if v.shape != k.shape:
        raise UsageError(f"v.shape={tuple(v.shape)} differs from k.shape={tuple(k.shape)}: v must have k's shape")
    if q.shape[2] % k.shape[2]:
        raise UsageError(
            f"heads_q={q.shape[2]} is not a multiple of heads_kv={k.shape[2]}: GQA/MQA needs heads_q = n * heads_kv"
        )
    if dout is not None and dout.shape != q.shape:
        raise UsageError(
            f"dout.shape={tuple(dout.shape)} differs from q.shape={tuple(q.shape)}: dout must have q's shape"
        )
    scale = _check_scale(softmax_scale)
    if not isinstance(causal, bool):
        raise UsageError(f"causal={causal!r} is not a bool: pass True or False")
    window = _check_window(window_size)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    ranges = visible_ranges(seqlen_q, seqlen_k, causal=causal, window_size=window, alignment=alignment)
    first, last = (r.numpy() for r in ranges)
    tensors = (q, k, v) + ((dout,) if dout is not None else ())
    device = golden_device(q)
    arrays = [_head_major(name, t, device) for name, t in zip(("q", "k", "v", "dout"), tensors)]
    return HeadMajorInputs(
        q=arrays[0],
        k=arrays[1],
        v=arrays[2],
        dout=arrays[3] if dout is not None else None,
        scale=scale,
        causal=causal,
        window_size=window,
        alignment=alignment,
        first=first,
        last=last,
        dtypes=tuple(dtype_name(t.dtype) for t in tensors),
    )


def fingerprint(problem: HeadMajorInputs) -> int:
    """A 64-bit digest of the inputs' values and shapes, computed on their device (one read of each input).

    It seeds the certification's row sample (:mod:`golden.certify`), so a case is always certified on the same
    rows without copying its inputs to the host: sha256 of the names, the shapes and each input's
    :func:`core.digest.digest`.  Not a cryptographic hash of the inputs: the golden cache keys on one
    (:func:`golden.cache.key`).
    """
    hashed = hashlib.sha256()
    for name in ("q", "k", "v", "dout"):
        tensor = getattr(problem, name)
        if tensor is not None:
            hashed.update(f"{name}{tuple(tensor.shape)}".encode())
            hashed.update(digest(tensor).cpu().numpy().tobytes())
    return int.from_bytes(hashed.digest()[:8], "big")


def golden_device(tensor: torch.Tensor) -> torch.device:
    """Where the golden of a case whose ``q`` is ``tensor`` runs: that CUDA device, else the CPU."""
    return tensor.device if tensor.device.type == "cuda" else torch.device("cpu")


def to_contract(tensor: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seqlen, head_dim) float64 tensor -> contiguous contract-layout tensor on its device."""
    return tensor.transpose(1, 2).contiguous()


def _check_tensor(name: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise UsageError(f"{name} is a {type(tensor).__name__}, not a torch.Tensor: pass the kernel's input tensor")
    if tensor.dim() != 4:
        raise UsageError(
            f"{name}.shape={tuple(tensor.shape)} is not 4-D: use the contract layout (batch, seqlen, heads, head_dim)"
        )
    if not tensor.dtype.is_floating_point:
        raise UsageError(
            f"{name}.dtype={tensor.dtype} is not a real floating dtype: use float16, bfloat16, float32 or float64"
        )
    if tensor.shape[0] < 1 or tensor.shape[2] < 1 or tensor.shape[3] < 1:
        raise UsageError(f"{name}.shape={tuple(tensor.shape)} has an empty batch, heads or head_dim: each must be >= 1")


def _check_scale(softmax_scale) -> float:
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise UsageError(f"softmax_scale={softmax_scale!r} is not a real number: pass e.g. 1/sqrt(head_dim)")
    scale = float(softmax_scale)
    if not math.isfinite(scale):
        raise UsageError(f"softmax_scale={softmax_scale!r} is not finite: pass e.g. 1/sqrt(head_dim)")
    return scale


def _check_window(window_size) -> tuple[int, int]:
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(isinstance(w, int) and not isinstance(w, bool) and w >= UNBOUNDED for w in window_size)
    ):
        raise UsageError(
            f"window_size={window_size!r} is not a (left, right) pair of ints >= -1: use -1 for an unbounded side"
        )
    return effective_window(False, tuple(window_size))


def _head_major(name: str, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The exact float64 copy on ``device``, head-major; a NaN or infinity is reported by its contract-layout index."""
    exact = tensor.detach().to(device=device, dtype=torch.float64)
    finite = torch.isfinite(exact)
    if not bool(finite.all()):
        index = [int(i) for i in torch.nonzero(~finite)[0]]
        raise UsageError(f"{name}{index}={float(exact[tuple(index)])} is not finite: the golden needs finite inputs")
    return exact.transpose(1, 2).contiguous()
