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
aligned (:func:`visible_mask`), or top-left for a kernel declaring
``causal_alignment="top_left"``.  A row that sees no key has ``out = 0``,
``dq = 0`` and ``lse = ±inf``.

The same contract as types: :class:`KernelTarget` (what every target has),
:class:`VarlenKernelTarget` (with the varlen entry points) and
:class:`KernelHooks` (the optional hooks); annotate a target with them and a
type checker or an IDE shows what is missing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Protocol, cast

import torch

from fa2_verify.core.errors import UsageError

UNBOUNDED = -1

#: Where the diagonal of a causal or window mask lies when ``seqlen_q != seqlen_k``: the contract's
#: bottom-right alignment (flash-attn >= 2.1: the last query sees the last key), or top-left (PyTorch
#: SDPA's ``is_causal`` and many Triton kernels: query ``i`` sees key ``i``).
BOTTOM_RIGHT = "bottom_right"
TOP_LEFT = "top_left"
ALIGNMENTS: tuple[str, ...] = (BOTTOM_RIGHT, TOP_LEFT)

#: Why an LSE property or output is not checked for a kernel declaring ``lse=False``.
NO_LSE_REASON = "kernel provides no LSE"

#: Why dq, dk and dv are not checked for a kernel declaring ``backward=False`` (a forward-only kernel).
NO_BACKWARD_REASON = "kernel has no backward pass"

#: The outputs of the contract's backward.
GRADIENTS: tuple[str, ...] = ("dq", "dk", "dv")

#: The device types fa2-verify drives; the keys of ``Capabilities.dtypes`` and ``device_head_dims``.
DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")

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


def diagonal_shift(seqlen_q: int, seqlen_k: int, alignment: str = BOTTOM_RIGHT) -> int:
    """The key on query 0's diagonal: ``seqlen_k - seqlen_q`` bottom-right aligned, 0 top-left."""
    if alignment not in ALIGNMENTS:
        raise UsageError(f"causal_alignment={alignment!r} is not an alignment: use {' or '.join(ALIGNMENTS)}")
    return seqlen_k - seqlen_q if alignment == BOTTOM_RIGHT else 0


def causal_prefix_keys(rows: int, seqlen_q: int, seqlen_k: int, alignment: str = BOTTOM_RIGHT) -> int:
    """How many leading keys the first ``rows`` queries of a causal mask see between them, ``rows`` counted
    from the top: ``min(rows + shift, seqlen_k)`` with ``shift`` the :func:`diagonal_shift`."""
    return min(rows + diagonal_shift(seqlen_q, seqlen_k, alignment), seqlen_k)


def visible_ranges(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (UNBOUNDED, UNBOUNDED),
    alignment: str = BOTTOM_RIGHT,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, last)``, int64 (seqlen_q,): query ``i`` sees keys ``first[i] <= j <= last[i]``.

    The one definition of the masks.  With ``shift`` the :func:`diagonal_shift`
    of ``alignment`` (bottom-right, flash-attn >= 2.1: ``seqlen_k - seqlen_q``;
    top-left: 0) query ``i`` sees key ``j`` iff
    ``i + shift - left <= j <= i + shift + right`` and ``0 <= j < seqlen_k``,
    where ``-1`` means unbounded on that side.  A row with ``first > last``
    sees no key.  The two alignments agree when ``seqlen_q == seqlen_k``.
    """
    left, right = effective_window(causal, window_size)
    diagonal = torch.arange(seqlen_q, device=device) + diagonal_shift(seqlen_q, seqlen_k, alignment)
    first = (diagonal - left).clamp(min=0) if left >= 0 else torch.zeros_like(diagonal)
    last = (diagonal + right).clamp(max=seqlen_k - 1) if right >= 0 else torch.full_like(diagonal, seqlen_k - 1)
    return first, last


def visible_mask(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (UNBOUNDED, UNBOUNDED),
    alignment: str = BOTTOM_RIGHT,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Bool (seqlen_q, seqlen_k): True where query ``i`` sees key ``j`` (:func:`visible_ranges`)."""
    first, last = visible_ranges(
        seqlen_q, seqlen_k, causal=causal, window_size=window_size, alignment=alignment, device=device
    )
    j = torch.arange(seqlen_k, device=device)
    return (j >= first[:, None]) & (j <= last[:, None])


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is ``>= value``."""
    return -(-value // multiple) * multiple


def _fail(name: str, value: object, fix: str) -> UsageError:
    return UsageError(f"capabilities {name}={value!r} is not valid: {fix}")


def _int_tuple(name: str, value: object, *, minimum: int) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise _fail(name, value, f"use a list of integers >= {minimum}")
    items = tuple(value)
    if not all(isinstance(item, int) and not isinstance(item, bool) and item >= minimum for item in items):
        raise _fail(name, value, f"use a list of integers >= {minimum}")
    return items


def _check_device_type(name: str, device: object) -> str:
    """``device`` if it is a device type fa2-verify drives (a key of ``dtypes``, ``device_head_dims``).

    A key like ``"gpu"`` or ``"cuda:0"`` would never match the device a case
    runs on (looked up by its type), and would declare nothing in silence.
    """
    if device not in DEVICE_TYPES:
        raise UsageError(
            f"capabilities {name} has the key {device!r}, not a device type: use {' or '.join(DEVICE_TYPES)}"
        )
    return device


def _sides(value: object) -> tuple[int, int]:
    """``seqlen_multiple_of`` as (q, k): an int for both sides, or per side as ``{"q": m, "k": n}`` or ``(m, n)``."""
    fix = 'use an integer >= 1 for both sides, or {"q": m, "k": n}'
    if isinstance(value, Mapping):
        if set(value) != {"q", "k"}:
            raise _fail("seqlen_multiple_of", dict(value), fix)
        value = (value["q"], value["k"])
    sides = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(sides, tuple) or len(sides) != 2:
        raise _fail("seqlen_multiple_of", value, fix)
    if not all(isinstance(side, int) and not isinstance(side, bool) and side >= 1 for side in sides):
        raise _fail("seqlen_multiple_of", value, fix)
    return sides


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a kernel target supports.

    ``dtypes`` maps a device type (``"cpu"``, ``"cuda"``) to the dtype names that
    run there; a device absent from it is unsupported.  ``head_dims`` lists
    every supported head dimension; ``device_head_dims`` narrows it on a device
    whose path supports fewer (read both through :meth:`head_dims_on`).
    ``lse=False`` declares a kernel that returns no LSE (its forward returns
    ``(out, None)`` and its backward receives ``lse=None``); the LSE is then
    reported as unsupported with :data:`NO_LSE_REASON`, never as passed.
    Shape constraints: ``seqlen_multiple_of`` (an int for both sides, or
    ``{"q": m, "k": n}``, stored as ``(m, n)``), ``equal_seqlens``
    (``seqlen_q == seqlen_k`` only), ``min_seqlen`` and ``max_seqlen`` (``None``:
    unbounded) on both sides.
    ``gqa_dkv_reproducible=False`` declares a backward that sums dK and dV of
    a GQA/MQA group over its query heads in an unspecified order (float32
    atomics into one accumulator, as FlashAttention-3 and -4 do), so in the
    default mode they are bitwise reproducible for MHA only; the
    reproducibility property then draws MHA cases (docs/properties.md).
    Conventions of real kernels: ``causal_only`` declares a kernel with no
    non-causal path (every case it runs is causal; a window, if declared, is
    then a causal sliding window); ``causal_alignment="top_left"`` a kernel
    whose causal and window masks put query ``i``'s diagonal at key ``i`` when
    ``seqlen_q != seqlen_k`` (:func:`visible_ranges`), which is checked against
    a golden with that mask, not refused; ``custom_softmax_scale=False`` a
    kernel that always scales by ``1/sqrt(head_dim)``.
    ``unaligned_inputs=True`` declares a kernel that takes inputs whose data
    pointers are not 16-byte aligned; the contract otherwise hands every
    input 16-byte aligned, as flash-attn, PyTorch's SDPA kernels and cuDNN
    require (its memory-efficient kernel refuses "p.query_ptr is not
    correctly aligned"), so the layout property draws ``unaligned-offset``
    only for such a kernel (:func:`core.layouts.layouts_for`).
    ``notes`` are human-readable restrictions shown by ``fa2-verify kernels``.

    A user may write the same fields as a plain mapping
    (:meth:`from_mapping`); every field is validated on construction, so a
    declaration that leaves no shape to run fails with a one-line
    :class:`~core.errors.UsageError`.
    """

    dtypes: Mapping[str, tuple[str, ...]]
    head_dims: tuple[int, ...]
    causal: bool = True
    causal_only: bool = False
    causal_alignment: str = BOTTOM_RIGHT
    custom_softmax_scale: bool = True
    window: bool = True
    gqa: bool = True
    backward: bool = True
    deterministic_backward: bool = False
    gqa_dkv_reproducible: bool = True
    varlen: bool = False
    lse: bool = True
    unaligned_inputs: bool = False
    seqlen_multiple_of: int | tuple[int, int] | Mapping[str, int] = 1
    equal_seqlens: bool = False
    min_seqlen: int = 0
    max_seqlen: int | None = None
    notes: tuple[str, ...] = ()
    device_head_dims: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.dtypes, Mapping):
            raise _fail("dtypes", self.dtypes, 'map a device type to dtype names, e.g. {"cuda": ["float16"]}')
        dtypes = {}
        for device, names in self.dtypes.items():
            _check_device_type("dtypes", device)
            if not isinstance(names, (list, tuple)) or not all(
                isinstance(name, str) and name in DTYPES for name in names
            ):
                raise _fail(f"dtypes[{device!r}]", names, f"use a list of names from {', '.join(DTYPES)}")
            dtypes[device] = tuple(names)
        object.__setattr__(self, "dtypes", dtypes)
        object.__setattr__(self, "head_dims", _int_tuple("head_dims", self.head_dims, minimum=1))
        if not self.head_dims:
            raise _fail("head_dims", self.head_dims, "list at least one head dimension")
        if not isinstance(self.device_head_dims, Mapping):
            raise _fail("device_head_dims", self.device_head_dims, 'map a device type to head dims, e.g. {"cuda": [64]}')
        device_head_dims = {
            _check_device_type("device_head_dims", device): _int_tuple(f"device_head_dims[{device!r}]", dims, minimum=1)
            for device, dims in self.device_head_dims.items()
        }
        object.__setattr__(self, "device_head_dims", device_head_dims)
        flags = ("causal", "causal_only", "custom_softmax_scale", "window", "gqa", "backward", "deterministic_backward",
                 "gqa_dkv_reproducible", "varlen", "lse", "unaligned_inputs", "equal_seqlens")
        for flag in flags:
            if not isinstance(getattr(self, flag), bool):
                raise _fail(flag, getattr(self, flag), "use true or false")
        if self.causal_only and not self.causal:
            raise _fail("causal_only", True, "a causal-only kernel runs causal masks: drop causal=False")
        if self.causal_alignment not in ALIGNMENTS:
            raise _fail("causal_alignment", self.causal_alignment, f"use {' or '.join(repr(a) for a in ALIGNMENTS)}")
        if not isinstance(self.notes, (list, tuple)) or not all(isinstance(note, str) for note in self.notes):
            raise _fail("notes", self.notes, "use a list of strings")
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "seqlen_multiple_of", _sides(self.seqlen_multiple_of))
        if isinstance(self.min_seqlen, bool) or not isinstance(self.min_seqlen, int) or self.min_seqlen < 0:
            raise _fail("min_seqlen", self.min_seqlen, "use an integer >= 0")
        if self.max_seqlen is not None and (
            isinstance(self.max_seqlen, bool) or not isinstance(self.max_seqlen, int) or self.max_seqlen < 1
        ):
            raise _fail("max_seqlen", self.max_seqlen, "use an integer >= 1, or null for unbounded")
        if any(self.smallest_seqlen(side) is None for side in (("q", "k", None) if self.equal_seqlens else ("q", "k"))):
            raise UsageError(
                f"capabilities leave no sequence length to run: no length in [max(1, min_seqlen={self.min_seqlen}), "
                f"max_seqlen={self.max_seqlen}] is a multiple of seqlen_multiple_of "
                f"{list(self._multiples)} (equal_seqlens={self.equal_seqlens}): widen the range"
            )

    @classmethod
    def from_mapping(cls, mapping: "Capabilities | Mapping[str, Any]") -> "Capabilities":
        """Capabilities from a plain mapping with the same fields (lists for tuples)."""
        if isinstance(mapping, Capabilities):
            return mapping
        if not isinstance(mapping, Mapping):
            raise UsageError(
                f"capabilities={type(mapping).__name__} is not valid: use a mapping (dict) or fa2_verify.Capabilities"
            )
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise UsageError(f"capabilities has unknown field(s) {unknown}: use fields from {', '.join(sorted(known))}")
        missing = [name for name in ("dtypes", "head_dims") if name not in mapping]
        if missing:
            raise UsageError(f"capabilities lacks the required field(s) {missing}")
        return cls(**mapping)

    @property
    def non_causal(self) -> bool:
        """Whether the kernel runs cases without a causal mask (it is not ``causal_only``)."""
        return not self.causal_only

    @property
    def _multiples(self) -> tuple[int, int]:
        """``seqlen_multiple_of`` as :meth:`__post_init__` stores it, ``(q, k)``, whatever form was declared."""
        return cast("tuple[int, int]", self.seqlen_multiple_of)

    def head_dims_on(self, device: str) -> tuple[int, ...]:
        """The head dimensions supported on ``device`` (a device or device type)."""
        return self.device_head_dims.get(torch.device(device).type, self.head_dims)

    def seqlen_step(self, side: str | None = None) -> int:
        """The multiple a length must be of on ``side`` (``"q"``, ``"k"``), or on both when ``None`` (their lcm)."""
        multiple_q, multiple_k = self._multiples
        if side is None:
            return math.lcm(multiple_q, multiple_k)
        return multiple_q if side == "q" else multiple_k

    def fit_seqlen(self, seqlen: int, side: str | None = None) -> int | None:
        """``seqlen`` rounded up to a supported length of ``side`` (both sides when ``None``).

        Lowered to the longest supported length when that passes ``max_seqlen``;
        a non-empty ``seqlen`` stays non-empty.  ``None`` if no length fits.
        """
        step = self.seqlen_step(side)
        fitted = round_up(max(seqlen, self.min_seqlen), step)
        if self.max_seqlen is not None and fitted > self.max_seqlen:
            fitted = self.max_seqlen // step * step
            if fitted < max(self.min_seqlen, min(seqlen, 1)):
                return None
        return fitted

    def smallest_seqlen(self, side: str | None = None) -> int | None:
        """The shortest non-empty length ``side`` supports (both sides when ``None``); None if there is none."""
        return self.fit_seqlen(1, side)

    def seqlen_unsupported_reason(self, seqlen_q: int, seqlen_k: int) -> str | None:
        """``None`` if the kernel runs these sequence lengths, else why not."""
        for side, seqlen in (("q", seqlen_q), ("k", seqlen_k)):
            step = self.seqlen_step(side)
            if seqlen % step:
                return f"seqlen_{side}={seqlen} is not a multiple of {step}"
            if seqlen < self.min_seqlen:
                return f"seqlen_{side}={seqlen} is below min_seqlen={self.min_seqlen}"
            if self.max_seqlen is not None and seqlen > self.max_seqlen:
                return f"seqlen_{side}={seqlen} is above max_seqlen={self.max_seqlen}"
        if self.equal_seqlens and seqlen_q != seqlen_k:
            return f"seqlen_q={seqlen_q} != seqlen_k={seqlen_k}: the kernel needs equal sequence lengths"
        return None

    def unsupported_reason(
        self,
        *,
        device: str,
        dtype: str,
        head_dim: int,
        causal: bool = False,
        window_size: tuple[int, int] = (UNBOUNDED, UNBOUNDED),
        alignment: str | None = None,
        custom_scale: bool = False,
        heads_q: int = 1,
        heads_kv: int = 1,
        backward: bool = False,
        deterministic: bool = False,
        varlen: bool = False,
        seqlens: tuple[int, int] | None = None,
    ) -> str | None:
        """``None`` if a case with these features (and ``seqlens = (seqlen_q, seqlen_k)``, if given) is supported.

        ``alignment`` is the mask alignment the case needs (``None``: either,
        its mask being the same under both); ``custom_scale`` whether it passes
        a softmax scale other than the default ``1/sqrt(head_dim)``.
        """
        device_type = torch.device(device).type
        if device_type not in self.dtypes:
            return f"device={device_type} is not supported (supported: {sorted(self.dtypes)})"
        if dtype not in self.dtypes[device_type]:
            return f"dtype={dtype} is not supported on {device_type} (supported: {list(self.dtypes[device_type])})"
        if head_dim not in self.head_dims_on(device_type):
            return f"head_dim={head_dim} is not supported on {device_type}"
        if causal and not self.causal:
            return "causal masks are not supported"
        if not causal and self.causal_only:
            return "the kernel runs causal masks only (causal_only)"
        if alignment is not None and alignment != self.causal_alignment:
            return (f"the case's mask is {alignment.replace('_', '-')} aligned, the kernel's "
                    f"{self.causal_alignment.replace('_', '-')} (seqlen_q != seqlen_k)")
        if custom_scale and not self.custom_softmax_scale:
            return "a custom softmax_scale is not supported (the kernel scales by 1/sqrt(head_dim))"
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
        if seqlens is not None:
            return self.seqlen_unsupported_reason(*seqlens)
        return None

    def constraints(self) -> list[str]:
        """The declared shape constraints and missing outputs, in words (``fa2-verify kernels`` shows them)."""
        described = ["causal masks only"] if self.causal_only else []
        if self.causal_alignment != BOTTOM_RIGHT:
            described.append(f"masks {self.causal_alignment.replace('_', '-')} aligned")
        if not self.custom_softmax_scale:
            described.append("softmax_scale 1/sqrt(head_dim) only")
        multiple_q, multiple_k = self._multiples
        if (multiple_q, multiple_k) != (1, 1):
            described.append(f"seqlen_q a multiple of {multiple_q}, seqlen_k a multiple of {multiple_k}")
        if self.equal_seqlens:
            described.append("seqlen_q == seqlen_k only")
        if self.min_seqlen or self.max_seqlen is not None:
            described.append(f"sequence lengths from {self.min_seqlen} to {self.max_seqlen or 'unbounded'}")
        described += [f"{output}: {reason}" for output, reason in self.missing_outputs().items()]
        return described

    def missing_outputs(self) -> dict[str, str]:
        """Outputs of the contract this kernel does not provide, with the reason (reported as unsupported)."""
        missing = {} if self.lse else {"lse": NO_LSE_REASON}
        if not self.backward:
            missing.update(dict.fromkeys(GRADIENTS, NO_BACKWARD_REASON))
        return missing

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for reports and baselines (:meth:`from_mapping` reads it back)."""
        return {
            "dtypes": {device: list(names) for device, names in self.dtypes.items()},
            "head_dims": list(self.head_dims),
            "causal": self.causal,
            "causal_only": self.causal_only,
            "causal_alignment": self.causal_alignment,
            "custom_softmax_scale": self.custom_softmax_scale,
            "window": self.window,
            "gqa": self.gqa,
            "backward": self.backward,
            "deterministic_backward": self.deterministic_backward,
            "gqa_dkv_reproducible": self.gqa_dkv_reproducible,
            "varlen": self.varlen,
            "lse": self.lse,
            "unaligned_inputs": self.unaligned_inputs,
            "seqlen_multiple_of": {"q": self._multiples[0], "k": self._multiples[1]},
            "equal_seqlens": self.equal_seqlens,
            "min_seqlen": self.min_seqlen,
            "max_seqlen": self.max_seqlen,
            "notes": list(self.notes),
            "device_head_dims": {device: list(dims) for device, dims in self.device_head_dims.items()},
        }


#: ``window_size``: (left, right) keys around the diagonal, ``-1`` unbounded on that side.
Window = tuple[int, int]


class KernelTarget(Protocol):
    """What the kernel contract asks of every target (docs/design.md, "The kernel contract").

    The loader (:func:`verify.registry.load_kernel`) requires ``forward`` and
    ``capabilities``; ``backward`` is called only for a kernel whose
    capabilities declare ``backward=True`` (the default), so a forward-only
    kernel may leave it out.  The tensors are handed positionally (any
    parameter names), the options by keyword; layouts as in this module's
    docstring.
    """

    @property
    def capabilities(self) -> Capabilities | Mapping[str, Any]:
        """A :class:`Capabilities`, or a plain mapping of its fields (:meth:`Capabilities.from_mapping`)."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        /,
        *,
        softmax_scale: float,
        causal: bool = False,
        window_size: Window = (UNBOUNDED, UNBOUNDED),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(out, lse)``; ``lse`` is ``None`` exactly when the capabilities declare ``lse=False``."""
        ...

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor | None,
        /,
        *,
        softmax_scale: float,
        causal: bool = False,
        window_size: Window = (UNBOUNDED, UNBOUNDED),
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dq, dk, dv)`` from the forward's ``out`` and ``lse`` (``None`` for a kernel declaring ``lse=False``)."""
        ...


class VarlenKernelTarget(KernelTarget, Protocol):
    """A target declaring ``varlen=True``: the flash-attn style entry points on packed sequences.

    ``q`` is (total_q, heads_q, head_dim), ``k``/``v`` (total_k, heads_kv,
    head_dim); sequence ``b`` is rows ``cu_seqlens[b]:cu_seqlens[b + 1]``
    (int32); ``lse`` is (heads_q, total_q) (:mod:`core.varlen`).
    """

    def forward_varlen(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        /,
        *,
        softmax_scale: float,
        causal: bool = False,
        window_size: Window = (UNBOUNDED, UNBOUNDED),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(out, lse)`` of every packed sequence."""
        ...

    def backward_varlen(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor | None,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        /,
        *,
        softmax_scale: float,
        causal: bool = False,
        window_size: Window = (UNBOUNDED, UNBOUNDED),
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dq, dk, dv)`` of every packed sequence."""
        ...


class KernelHooks(Protocol):
    """The optional hooks of a target (docs/design.md, "The kernel contract"), each read once before any case.

    Any of them may be absent; one that raises or returns another type is a
    one-line :class:`~core.errors.KernelLoadError` naming it.
    """

    def unavailable_reason(self) -> str | None:
        """Why the kernel cannot run on this machine (e.g. a package is missing), or ``None``."""
        ...

    def config(self) -> Mapping[str, Any]:
        """What a run records to be reproduced (tiles, versions); ``block_k`` and ``partial_sums`` are read
        by the error model (:mod:`verify.kernel_config` checks it)."""
        ...

    @property
    def version(self) -> str:
        """The kernel's version for reports; else its distribution's (:func:`records.report_json.kernel_version`)."""
        ...
