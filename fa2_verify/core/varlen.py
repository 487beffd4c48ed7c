"""Varlen cases: several sequences of different lengths packed along one token axis.

flash-attn style (the optional ``forward_varlen``/``backward_varlen`` entry
points of :mod:`core.contract`): q is (total_q, heads_q, head_dim), k and v
(total_k, heads_kv, head_dim), ``cu_seqlens_*`` the int32 cumulative lengths
starting at 0, and each sequence's mask is aligned to its own bottom-right
corner.  Sequences may be empty (length 0 on either side), which is where
packing bugs (an off-by-one in ``cu_seqlens``, a program that assumes at
least one row) hide.  Sequence ``i`` holds exactly the tensors of
:meth:`VarlenSpec.sequence` ``(i)``, a batch-1 :class:`~core.case.CaseSpec`,
so it can be checked against its own golden and reproduced alone.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch

from fa2_verify.core.case import Case, CaseSpec, check_field, is_length, make_case
from fa2_verify.core.contract import Capabilities
from fa2_verify.core.errors import UsageError
from fa2_verify.core.layouts import LAYOUTS, VALUE_KEEPING_JOINT_LAYOUTS, arrange


@dataclasses.dataclass(frozen=True)
class VarlenSpec(CaseSpec):
    """A packed batch: a :class:`~core.case.CaseSpec` whose ``batch`` sequences each have their own lengths.

    The extension of the case record for varlen: ``seqlens[b]`` is
    ``(seqlen_q, seqlen_k)`` of sequence ``b``; ``batch`` counts the sequences
    and ``seqlen_q``, ``seqlen_k`` are the longest lengths (:meth:`packing`
    fills them in).  Every other field is shared by all sequences.
    """

    seqlens: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        check_field("seqlens", self.seqlens, _seqlens)
        object.__setattr__(self, "seqlens", tuple((int(seqlen_q), int(seqlen_k)) for seqlen_q, seqlen_k in self.seqlens))
        super().__post_init__()
        longest = (max(q for q, _ in self.seqlens), max(k for _, k in self.seqlens)) if self.seqlens else None
        if len(self.seqlens) != self.batch or longest != (self.seqlen_q, self.seqlen_k):
            raise UsageError(
                f"seqlens={[list(pair) for pair in self.seqlens]} does not match batch={self.batch}, "
                f"seqlen_q={self.seqlen_q}, seqlen_k={self.seqlen_k}: build it with VarlenSpec.packing(seqlens, ...)"
            )

    @classmethod
    def packing(cls, seqlens: tuple[tuple[int, int], ...], **shared: Any) -> "VarlenSpec":
        """The packed batch of ``seqlens``, with ``batch`` and the longest lengths derived from them."""
        return cls(
            batch=len(seqlens),
            seqlen_q=max((seqlen_q for seqlen_q, _ in seqlens), default=0),
            seqlen_k=max((seqlen_k for _, seqlen_k in seqlens), default=0),
            seqlens=tuple(seqlens),
            **shared,
        )

    def _case_fields(self) -> dict[str, Any]:
        """The fields of :class:`~core.case.CaseSpec`, as this batch holds them."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(CaseSpec)}

    def sequence(self, index: int) -> CaseSpec:
        """Sequence ``index`` as a batch-1 case (seed ``seed + index``)."""
        seqlen_q, seqlen_k = self.seqlens[index]
        return CaseSpec(**{**self._case_fields(), "batch": 1, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k,
                           "seed": (self.seed + index) % 2**32})

    def repacked(self, seqlens: tuple[tuple[int, int], ...]) -> "VarlenSpec":
        """This batch with other sequence lengths, every other field kept."""
        shared = {name: value for name, value in self._case_fields().items()
                  if name not in ("batch", "seqlen_q", "seqlen_k")}
        return VarlenSpec.packing(seqlens, **shared)

    @property
    def alignment_matters(self) -> bool:
        """Whether a sequence of the batch has a different mask under the two alignments."""
        return any(self.sequence(index).alignment_matters for index in range(self.batch))

    def unsupported_reason(self, capabilities: Capabilities, device: str) -> str | None:
        """:meth:`CaseSpec.unsupported_reason`, and the varlen entry points themselves."""
        return super().unsupported_reason(capabilities, device) or capabilities.unsupported_reason(
            device=device, dtype=self.dtype, head_dim=self.head_dim, causal=self.causal, varlen=True
        )

    def to_dict(self) -> dict[str, Any]:
        record = super().to_dict()
        record["seqlens"] = [list(pair) for pair in self.seqlens]
        return record

    def describe(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _seqlens(value: Any) -> str | None:
    """A list of ``[seqlen_q, seqlen_k]`` pairs of lengths, one per sequence (the field check of ``seqlens``)."""
    if isinstance(value, (list, tuple)) and all(
        isinstance(pair, (list, tuple)) and len(pair) == 2 and all(is_length(side) for side in pair) for pair in value
    ):
        return None
    return "must be a list of [seqlen_q, seqlen_k] pairs of integers >= 0, one per sequence"


def spec_from_dict(record: Any) -> CaseSpec:
    """The case in a parsed JSON object: a :class:`VarlenSpec` when it has ``seqlens``, else a
    :class:`~core.case.CaseSpec`; every problem is a one-line :class:`UsageError`."""
    if isinstance(record, dict) and "seqlens" in record:
        return VarlenSpec.from_dict(record)
    return CaseSpec.from_dict(record)


@dataclasses.dataclass(frozen=True)
class Packed:
    """The packed tensors of a :class:`VarlenSpec` and the per-sequence cases they came from."""

    spec: VarlenSpec
    cases: tuple[Case, ...]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    def rows(self, index: int) -> tuple[slice, slice]:
        """The token slices of sequence ``index`` in the packed q and k axes."""
        q0, q1 = (int(x) for x in self.cu_seqlens_q[index : index + 2])
        k0, k1 = (int(x) for x in self.cu_seqlens_k[index : index + 2])
        return slice(q0, q1), slice(k0, k1)


def _cumulative(lengths: list[int], device: str) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32, device=device)


def pack(spec: VarlenSpec, device: str, layout: str = "contiguous") -> Packed:
    """Build every sequence's inputs and pack them (flash-attn varlen layout), q, k, v and dout in the
    memory ``layout`` of :data:`core.layouts.LAYOUTS` or :data:`core.layouts.VALUE_KEEPING_JOINT_LAYOUTS`
    (a packed tensor is one batch of ``total`` rows), each in NaN-guarded storage: varlen inputs are often
    views, e.g. q, k, v sliced from one packed qkv tensor, and the rows past the last sequence are padding."""
    if layout not in LAYOUTS + VALUE_KEEPING_JOINT_LAYOUTS:
        raise ValueError(f"layout={layout!r} would change a packed batch's values: use one of "
                         f"{LAYOUTS + VALUE_KEEPING_JOINT_LAYOUTS}")
    cases = tuple(make_case(spec.sequence(index), device) for index in range(len(spec.seqlens)))
    q, k, v, dout = (torch.cat([getattr(case, name)[0] for case in cases])[None] for name in ("q", "k", "v", "dout"))
    q, k, v, dout = (tensor[0] for tensor in arrange(q, k, v, dout, layout))
    lengths_q = [seqlen_q for seqlen_q, _ in spec.seqlens]
    lengths_k = [seqlen_k for _, seqlen_k in spec.seqlens]
    return Packed(
        spec=spec,
        cases=cases,
        q=q,
        k=k,
        v=v,
        dout=dout,
        cu_seqlens_q=_cumulative(lengths_q, device),
        cu_seqlens_k=_cumulative(lengths_k, device),
        max_seqlen_q=max(lengths_q),
        max_seqlen_k=max(lengths_k),
    )
