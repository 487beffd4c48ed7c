"""A verification case: a JSON-serialisable spec and the tensors built from it.

The spec is everything needed to rebuild the inputs bit for bit (shape, dtype,
mask, scale, value generator and seed); reports, the gate corpus and failure
reproductions store specs, never tensors.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from typing import Any, TypeVar

import torch

from fa2_verify.core.contract import (
    ALIGNMENTS,
    BOTTOM_RIGHT,
    DTYPES,
    UNBOUNDED,
    Capabilities,
    effective_window,
    visible_ranges,
)
from fa2_verify.core import values
from fa2_verify.core.errors import UsageError

#: A :class:`CaseSpec` or a subclass of it (:class:`core.varlen.VarlenSpec`), kept by the methods that copy it.
_Spec = TypeVar("_Spec", bound="CaseSpec")


@dataclasses.dataclass(frozen=True)
class CaseSpec:
    """One case (module docstring).  ``causal_alignment`` places the mask's diagonal when
    ``seqlen_q != seqlen_k``: ``"bottom_right"``, the contract's, or ``"top_left"`` for a kernel that
    declares it (:func:`core.contract.visible_ranges`); a record without the field is bottom-right, and
    :meth:`to_dict` writes it only when top-left, so older records and reproductions read unchanged."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    causal: bool = False
    window_size: tuple[int, int] = (UNBOUNDED, UNBOUNDED)
    softmax_scale: float | None = None
    generator: str = "normal"
    seed: int = 0
    backward: bool = True
    deterministic: bool = False
    name: str = ""
    causal_alignment: str = BOTTOM_RIGHT

    def __post_init__(self) -> None:
        for field in _FIELD_CHECKS:
            check_field(field, getattr(self, field))
        for field in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "seed"):
            object.__setattr__(self, field, int(getattr(self, field)))
        object.__setattr__(self, "window_size", tuple(int(side) for side in self.window_size))
        if self.softmax_scale is not None:
            object.__setattr__(self, "softmax_scale", float(self.softmax_scale))
        if self.heads_q % self.heads_kv:
            raise UsageError(
                f"heads_q={self.heads_q}: not a multiple of heads_kv={self.heads_kv} "
                "(GQA/MQA needs heads_q = n * heads_kv)"
            )

    @property
    def scale(self) -> float:
        """The softmax scale in effect: ``1/sqrt(head_dim)`` unless given."""
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def masked(self) -> bool:
        """Whether the case has a causal mask or a window (a mask whose diagonal has an alignment)."""
        return self.causal or tuple(self.window_size) != (UNBOUNDED, UNBOUNDED)

    @property
    def alignment_matters(self) -> bool:
        """Whether the two alignments give this case different masks: it is masked, and its lengths
        differ and are non-empty (equal lengths put both diagonals on ``j = i``)."""
        return self.masked and self.seqlen_q != self.seqlen_k and min(self.seqlen_q, self.seqlen_k) > 0

    def visible_ranges(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`core.contract.visible_ranges` of this case's lengths, mask and alignment."""
        return visible_ranges(self.seqlen_q, self.seqlen_k, causal=self.causal, window_size=self.window_size,
                              alignment=self.causal_alignment, device=device)

    def aligned(self: _Spec, alignment: str) -> _Spec:
        """This case under a kernel whose masks are ``alignment`` aligned: that alignment where it
        changes the mask (:attr:`alignment_matters`), else the case itself."""
        if self.alignment_matters and self.causal_alignment != alignment:
            return dataclasses.replace(self, causal_alignment=alignment)
        return self

    def feature(self) -> str:
        """The mask/head feature label reports group by: none, causal, window, plus gqa/mqa."""
        left, right = effective_window(self.causal, self.window_size)
        if self.causal and left == UNBOUNDED:
            mask = "causal"
        elif (left, right) != (UNBOUNDED, UNBOUNDED):
            mask = "window"
        else:
            mask = "none"
        if self.heads_kv == 1 and self.heads_q > 1:
            return f"{mask}+mqa"
        if self.heads_kv != self.heads_q:
            return f"{mask}+gqa"
        return mask

    def unsupported_reason(self, capabilities: Capabilities, device: str) -> str | None:
        """Why a kernel with ``capabilities`` cannot run this case on ``device``, or ``None``."""
        return capabilities.unsupported_reason(
            device=device,
            dtype=self.dtype,
            head_dim=self.head_dim,
            causal=self.causal,
            window_size=self.window_size,
            alignment=self.causal_alignment if self.alignment_matters else None,
            custom_scale=self.softmax_scale is not None,
            heads_q=self.heads_q,
            heads_kv=self.heads_kv,
            backward=self.backward,
            deterministic=self.deterministic,
            seqlens=(self.seqlen_q, self.seqlen_k),
        )

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["window_size"] = list(self.window_size)
        if self.causal_alignment == BOTTOM_RIGHT:
            del record["causal_alignment"]
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "CaseSpec":
        """The spec in a parsed JSON object; every problem is a one-line :class:`UsageError`."""
        if not isinstance(record, dict):
            raise UsageError(f"case spec is a {type(record).__name__}, expected a JSON object of CaseSpec fields")
        fields = {field.name: field for field in dataclasses.fields(cls)}
        unknown = sorted(set(record) - set(fields))
        if unknown:
            raise UsageError(f"case spec has unknown fields {unknown}: use only {sorted(fields)}")
        required = [name for name, field in fields.items() if field.default is dataclasses.MISSING]
        missing = [name for name in required if name not in record]
        if missing:
            raise UsageError(f"case spec lacks the required fields {missing}")
        return cls(**record)

    def reproduction(self, kernel: str = "KERNEL", device: str | None = None) -> str:
        """One line that re-runs exactly this case, on ``device``'s type (``cuda:1`` -> ``--device cuda``) if given."""
        where = f" --device {device.split(':')[0]}" if device is not None else ""
        return f"fa2-verify repro --kernel {kernel}{where} --case '{json.dumps(self.to_dict(), sort_keys=True)}'"


#: Largest seed + 1: :class:`core.counter_rng.CounterRNG` keys on a 64-bit unsigned seed.
SEED_LIMIT = 2**64

#: Largest size + 1: a tensor dimension is a signed 64-bit integer in PyTorch.
SIZE_LIMIT = 2**63

#: The range of ``softmax_scale``, both ends included: [2^-16, 2^4].
#:
#: The logits are ``scale * q.k``.  The value generators keep ``|q.k|`` below
#: 2^16 before scaling (``dtype-overflow``, the largest, stops at 0.9 x 65504;
#: the generators that aim at given logits divide q or k by the scale).  Far
#: from overflow is not enough: the error model is first order in the
#: rounding of the logits, which a kernel forms in float32 with an error of
#: about ``u_32 |scale q.k| = 2^-24 * scale * 2^16``.  Up to 2^4 that stays
#: below 2^-4 and the bounds hold (the ``reference`` kernel passes every
#: generator there); at 2^6 ``dtype-overflow`` in float16 already fails the
#: correct ``reference`` kernel, and at 1e300 the logits overflow float64 and
#: the bounds are infinite.  Below 2^-16 the logits of the generators that do
#: not divide by the scale stay below 2^-2, every row is nearly uniform and
#: nothing more is tested.  Models use ``1/sqrt(head_dim)`` (2^-6 to 1),
#: ``1/head_dim`` (down to 2^-10) or these times ``log2(e)``, all inside.
SOFTMAX_SCALE_RANGE: tuple[float, float] = (2.0**-16, 2.0**4)


def _is_int(value: Any) -> bool:
    """An integer (Python's or numpy's), not a bool: ``True`` is an int in Python but never a size.

    A plain ``int`` is decided by its type alone (``type(True)`` is ``bool``): the ABC check costs most
    of a case's validation, which every kernel call of the ``triton`` target makes."""
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def check_field(field: str, value: Any, check: Any = None) -> None:
    """Raise ``UsageError("field=value: reason")`` unless ``value`` is valid for that field: by ``check``
    (``value -> None`` if valid, else the reason) if given, else by the :class:`CaseSpec` field's own check."""
    reason = (check or _FIELD_CHECKS[field])(value)
    if reason is not None:
        raise UsageError(f"{field}={value!r}: {reason}")


def _size(minimum: int):
    def check(value: Any) -> str | None:
        if not _is_int(value) or not minimum <= value < SIZE_LIMIT:
            return f"must be an integer >= {minimum} and < 2**63"
        return None

    return check


def is_length(value: Any) -> bool:
    """A sequence length: an integer (not a bool) in [0, 2**63)."""
    return _size(0)(value) is None


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _dtype(value: Any) -> str | None:
    return None if isinstance(value, str) and value in DTYPES else f"must be one of {', '.join(DTYPES)}"


def _window(value: Any) -> str | None:
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(_is_int(side) and UNBOUNDED <= side < SIZE_LIMIT for side in value)
    ):
        return None
    return "must be a (left, right) pair of integers >= -1, with -1 for an unbounded side"


def _softmax_scale(value: Any) -> str | None:
    """A finite number in :data:`SOFTMAX_SCALE_RANGE`, or ``None`` for ``1/sqrt(head_dim)``.

    Attention itself is defined for any real scale (a negative one is attention
    on ``-K``), but the error model's magnitudes (docs/error-model.md, eq. 1:
    ``scale * |Q| |K|^T``) and the adversarial generators (``sqrt(top / scale)``)
    assume ``scale > 0``, so a non-positive scale is refused here, not half-checked;
    outside :data:`SOFTMAX_SCALE_RANGE` the error model's bounds no longer hold (its comment).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return "must be a number > 0, or null for 1/sqrt(head_dim)"
    low, high = SOFTMAX_SCALE_RANGE
    try:
        scale = float(value)
    except OverflowError:
        scale = math.inf
    if not (math.isfinite(scale) and scale > 0):
        return (
            "must be finite and > 0, or null for 1/sqrt(head_dim) (the error model and the value generators "
            "assume a positive scale; for a negative one, negate k instead)"
        )
    if not low <= scale <= high:
        return (
            "must be in [2**-16, 16], or null for 1/sqrt(head_dim): beyond 16 the float32 rounding of the "
            "logits scale * q.k leaves the error model's first-order bounds"
        )
    return None


def _generator(value: Any) -> str | None:
    if isinstance(value, str) and value in values.GENERATORS:
        return None
    return f"is not a value generator: use one of {', '.join(sorted(values.GENERATORS))}"


def _seed(value: Any) -> str | None:
    return None if _is_int(value) and 0 <= value < SEED_LIMIT else "must be an integer in [0, 2**64)"


def _alignment(value: Any) -> str | None:
    return None if value in ALIGNMENTS else f"must be one of {', '.join(ALIGNMENTS)}"


def _name(value: Any) -> str | None:
    return None if isinstance(value, str) else "must be a string"


#: One check per :class:`CaseSpec` field: ``value -> None`` if valid, else the reason and the fix.
_FIELD_CHECKS = {
    "batch": _size(1),
    "seqlen_q": _size(0),
    "seqlen_k": _size(0),
    "heads_q": _size(1),
    "heads_kv": _size(1),
    "head_dim": _size(1),
    "dtype": _dtype,
    "causal": _flag,
    "window_size": _window,
    "softmax_scale": _softmax_scale,
    "generator": _generator,
    "seed": _seed,
    "backward": _flag,
    "deterministic": _flag,
    "name": _name,
    "causal_alignment": _alignment,
}


@dataclasses.dataclass(frozen=True)
class Case:
    """A spec with its inputs, rounded to the spec's dtype, on one device.

    ``out_layout``: the memory layout (:data:`core.layouts.LAYOUTS`) in which ``backward`` is handed its
    copy of the forward's ``out``; ``None`` hands a plain copy."""

    spec: CaseSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    out_layout: str | None = None


def make_case(spec: CaseSpec, device: str | torch.device = "cpu") -> Case:
    """Build the inputs of ``spec`` on ``device``: drawn in float64 there (on the host when too large,
    :func:`core.values.draw_device`), the same values on every device, rounded once to the dtype."""
    drawn = values.generate(spec, values.draw_device(spec, device))
    q, k, v, dout = (t.to(spec.torch_dtype).to(device) for t in drawn)
    return Case(spec=spec, q=q, k=k, v=v, dout=dout)
