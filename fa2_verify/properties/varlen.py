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
from hypothesis import strategies as st

from fa2_verify.core.contract import UNBOUNDED, Capabilities
from fa2_verify.properties import inputs, masks, shapes
from fa2_verify.properties.cases import fit_budget
from fa2_verify.properties.profiles import Limits
from fa2_verify.core.case import Case, CaseSpec, make_case
from fa2_verify.core.errors import UsageError

#: Most sequences in one packed batch.
MAX_SEQUENCES = 4


@dataclasses.dataclass(frozen=True)
class VarlenSpec:
    """A packed batch: per-sequence ``(seqlen_q, seqlen_k)`` and what every sequence shares."""

    seqlens: tuple[tuple[int, int], ...]
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

    def sequence(self, index: int) -> CaseSpec:
        """Sequence ``index`` as a batch-1 case (seed ``seed + index``)."""
        seqlen_q, seqlen_k = self.seqlens[index]
        return CaseSpec(
            batch=1,
            seqlen_q=seqlen_q,
            seqlen_k=seqlen_k,
            heads_q=self.heads_q,
            heads_kv=self.heads_kv,
            head_dim=self.head_dim,
            dtype=self.dtype,
            causal=self.causal,
            window_size=self.window_size,
            softmax_scale=self.softmax_scale,
            generator=self.generator,
            seed=(self.seed + index) % 2**32,
            backward=self.backward,
        )

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["seqlens"] = [list(pair) for pair in self.seqlens]
        record["window_size"] = list(self.window_size)
        return record

    def describe(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


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


def pack(spec: VarlenSpec, device: str) -> Packed:
    """Build every sequence's inputs and pack them (flash-attn varlen layout)."""
    cases = tuple(make_case(spec.sequence(index), device) for index in range(len(spec.seqlens)))
    lengths_q = [seqlen_q for seqlen_q, _ in spec.seqlens]
    lengths_k = [seqlen_k for _, seqlen_k in spec.seqlens]
    return Packed(
        spec=spec,
        cases=cases,
        q=torch.cat([case.q[0] for case in cases]),
        k=torch.cat([case.k[0] for case in cases]),
        v=torch.cat([case.v[0] for case in cases]),
        dout=torch.cat([case.dout[0] for case in cases]),
        cu_seqlens_q=_cumulative(lengths_q, device),
        cu_seqlens_k=_cumulative(lengths_k, device),
        max_seqlen_q=max(lengths_q),
        max_seqlen_k=max(lengths_k),
    )


def varlen_specs(
    *, capabilities: Capabilities, device: str, limits: Limits, backward: bool = False, dtypes: tuple[str, ...] | None = None
) -> st.SearchStrategy[VarlenSpec]:
    """Packed batches of 1 to 4 sequences, often with an empty one, inside the kernel's capabilities."""
    if not capabilities.varlen:
        raise UsageError("the kernel has no varlen entry points (capabilities.varlen is False); draw padded cases")
    if backward and not capabilities.backward:
        raise UsageError("backward=True: the kernel has no backward pass; draw forward cases only")
    lengths = shapes.seqlens(min_value=0, max_value=limits.max_seqlen)

    @st.composite
    def build(draw: st.DrawFn) -> VarlenSpec:
        seqlens = tuple(draw(st.lists(st.tuples(lengths, lengths), min_size=1, max_size=MAX_SEQUENCES)))
        longest_q = max(seqlen_q for seqlen_q, _ in seqlens)
        longest_k = max(seqlen_k for _, seqlen_k in seqlens)
        heads_q, heads_kv = draw(
            shapes.head_counts(max_heads_kv=limits.max_heads_kv, max_group=limits.max_group, gqa=capabilities.gqa)
        )
        causal, window_size = draw(
            masks.masks(seqlen_q=longest_q, seqlen_k=longest_k, causal=capabilities.causal, window=capabilities.window)
        )
        head_dim = draw(shapes.head_dims(capabilities=capabilities, device=device, max_value=limits.max_head_dim))
        dtype = draw(inputs.dtypes(capabilities=capabilities, device=device, include=dtypes))
        # the per-example budget, on the padded batch that holds every sequence
        padded = fit_budget(
            CaseSpec(batch=len(seqlens), seqlen_q=longest_q, seqlen_k=longest_k, heads_q=heads_q, heads_kv=heads_kv,
                     head_dim=head_dim, dtype=dtype, backward=backward),
            limits,
            min_batch=len(seqlens),
        )
        return VarlenSpec(
            seqlens=tuple((min(seqlen_q, padded.seqlen_q), seqlen_k) for seqlen_q, seqlen_k in seqlens),
            heads_q=padded.heads_q,
            heads_kv=padded.heads_kv,
            head_dim=head_dim,
            dtype=dtype,
            causal=causal,
            window_size=window_size,
            softmax_scale=draw(inputs.softmax_scales()),
            generator=draw(inputs.generator_names()),
            seed=draw(inputs.seeds()),
            backward=backward,
        )

    return build()
