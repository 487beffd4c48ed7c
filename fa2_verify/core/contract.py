"""The kernel contract (docs/design.md, "The kernel contract").

A target is any object with

``forward(q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1)) -> (out, lse)``
``backward(dout, q, k, v, out, lse, *, softmax_scale, causal=False,
window_size=(-1, -1), deterministic=False) -> (dq, dk, dv)``
``capabilities``: a :class:`Capabilities`

and optionally ``forward_varlen``/``backward_varlen`` (flash-attn style,
packed with ``cu_seqlens``), ``unavailable_reason() -> str | None`` (why it
cannot run on this machine, e.g. a package is missing) and ``config() -> dict``
(the settings a run must record to be reproduced).

Layouts: ``q`` is (batch, seqlen_q, heads_q, head_dim); ``k`` and ``v`` are
(batch, seqlen_k, heads_kv, head_dim); query head ``h`` reads kv head
``h // (heads_q // heads_kv)``.  ``out`` has q's shape and dtype; ``lse`` is
float32 (batch, heads_q, seqlen_q), natural log.  Masks are bottom-right
aligned (:func:`visible_mask`).  A row that sees no key has ``out = 0``,
``dq = 0`` and ``lse = ±inf``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

UNBOUNDED = -1

DTYPES: Mapping[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16 -> "float16"``: the name used in capabilities and reports."""
    return str(dtype).removeprefix("torch.")


def heads_first(tensor: torch.Tensor) -> torch.Tensor:
    """The contract layout (batch, seqlen, heads, head_dim) viewed as (batch, heads, seqlen, head_dim), and back."""
    return tensor.transpose(1, 2)


def effective_window(causal: bool, window_size: tuple[int, int]) -> tuple[int, int]:
    """The (left, right) window a call means: ``causal=True`` is ``(left, 0)``."""
    left, right = window_size
    if causal:
        right = 0
    return int(left), int(right)


def visible_ranges(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (UNBOUNDED, UNBOUNDED),
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, last)``, int64 (seqlen_q,): query ``i`` sees keys ``first[i] <= j <= last[i]``.

    Bottom-right alignment (flash-attn >= 2.1): with ``shift = seqlen_k - seqlen_q``
    query ``i`` sees key ``j`` iff ``i + shift - left <= j <= i + shift + right``
    and ``0 <= j < seqlen_k``, where ``-1`` means unbounded on that side.  A row
    with ``first > last`` sees no key.
    """
    left, right = effective_window(causal, window_size)
    diagonal = torch.arange(seqlen_q, device=device) + (seqlen_k - seqlen_q)
    first = (diagonal - left).clamp(min=0) if left >= 0 else torch.zeros_like(diagonal)
    last = (diagonal + right).clamp(max=seqlen_k - 1) if right >= 0 else torch.full_like(diagonal, seqlen_k - 1)
    return first, last


def visible_mask(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (UNBOUNDED, UNBOUNDED),
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Bool (seqlen_q, seqlen_k): True where query ``i`` sees key ``j`` (:func:`visible_ranges`)."""
    first, last = visible_ranges(seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=device)
    j = torch.arange(seqlen_k, device=device)
    return (j >= first[:, None]) & (j <= last[:, None])


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a kernel target supports.

    ``dtypes`` maps a device type (``"cpu"``, ``"cuda"``) to the dtype names that
    run there; a device absent from it is unsupported.  ``head_dims`` lists
    every supported head dimension; ``device_head_dims`` narrows it on a device
    whose path supports fewer (read both through :meth:`head_dims_on`).
    ``notes`` are human-readable restrictions shown by ``fa2-verify kernels``.
    """

    dtypes: Mapping[str, tuple[str, ...]]
    head_dims: tuple[int, ...]
    causal: bool = True
    window: bool = True
    gqa: bool = True
    backward: bool = True
    deterministic_backward: bool = False
    varlen: bool = False
    notes: tuple[str, ...] = ()
    device_head_dims: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def head_dims_on(self, device: str) -> tuple[int, ...]:
        """The head dimensions supported on ``device`` (a device or device type)."""
        return self.device_head_dims.get(torch.device(device).type, self.head_dims)

    def unsupported_reason(
        self,
        *,
        device: str,
        dtype: str,
        head_dim: int,
        causal: bool = False,
        window_size: tuple[int, int] = (UNBOUNDED, UNBOUNDED),
        heads_q: int = 1,
        heads_kv: int = 1,
        backward: bool = False,
        deterministic: bool = False,
        varlen: bool = False,
    ) -> str | None:
        """``None`` if a case with these features is supported, else why not."""
        device_type = torch.device(device).type
        if device_type not in self.dtypes:
            return f"device={device_type} is not supported (supported: {sorted(self.dtypes)})"
        if dtype not in self.dtypes[device_type]:
            return f"dtype={dtype} is not supported on {device_type} (supported: {list(self.dtypes[device_type])})"
        if head_dim not in self.head_dims_on(device_type):
            return f"head_dim={head_dim} is not supported on {device_type}"
        if causal and not self.causal:
            return "causal masks are not supported"
        if tuple(window_size) != (UNBOUNDED, UNBOUNDED) and not self.window:
            return "sliding windows are not supported"
        if heads_q != heads_kv and not self.gqa:
            return "GQA/MQA (heads_q != heads_kv) is not supported"
        if backward and not self.backward:
            return "the backward pass is not implemented"
        if deterministic and not self.deterministic_backward:
            return "a deterministic backward is not available"
        if varlen and not self.varlen:
            return "varlen (packed cu_seqlens) entry points are not implemented"
        return None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for reports and baselines."""
        return {
            "dtypes": {device: list(names) for device, names in self.dtypes.items()},
            "head_dims": list(self.head_dims),
            "causal": self.causal,
            "window": self.window,
            "gqa": self.gqa,
            "backward": self.backward,
            "deterministic_backward": self.deterministic_backward,
            "varlen": self.varlen,
            "notes": list(self.notes),
            "device_head_dims": {device: list(dims) for device, dims in self.device_head_dims.items()},
        }
