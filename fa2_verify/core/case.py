"""A verification case: a JSON-serialisable spec and the tensors built from it.

The spec is everything needed to rebuild the inputs bit for bit (shape, dtype,
mask, scale, value generator and seed); reports, the gate corpus and failure
reproductions store specs, never tensors.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import torch

from fa2_verify.core.contract import DTYPES, UNBOUNDED, Capabilities, effective_window
from fa2_verify.core import values
from fa2_verify.core.errors import UsageError


@dataclasses.dataclass(frozen=True)
class CaseSpec:
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "window_size", tuple(int(w) for w in self.window_size))
        for field in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0 or (value == 0 and field not in ("seqlen_q", "seqlen_k")):
                raise UsageError(f"{field}={value!r} is not a valid size: use a positive integer")
        if self.heads_q % self.heads_kv:
            raise UsageError(f"heads_q={self.heads_q} is not a multiple of heads_kv={self.heads_kv}")
        if self.dtype not in DTYPES:
            raise UsageError(f"dtype={self.dtype!r} is not supported: use one of {', '.join(DTYPES)}")

    @property
    def scale(self) -> float:
        """The softmax scale in effect: ``1/sqrt(head_dim)`` unless given."""
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

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
            heads_q=self.heads_q,
            heads_kv=self.heads_kv,
            backward=self.backward,
            deterministic=self.deterministic,
        )

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["window_size"] = list(self.window_size)
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "CaseSpec":
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = set(record) - known
        if unknown:
            raise UsageError(f"case spec has unknown fields {sorted(unknown)}")
        return cls(**{**record, "window_size": tuple(record.get("window_size", (UNBOUNDED, UNBOUNDED)))})

    def reproduction(self, kernel: str = "KERNEL") -> str:
        """One line that re-runs exactly this case."""
        return f"fa2-verify repro --kernel {kernel} --case '{json.dumps(self.to_dict(), sort_keys=True)}'"


@dataclasses.dataclass(frozen=True)
class Case:
    """A spec with its inputs, rounded to the spec's dtype, on one device."""

    spec: CaseSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor


def make_case(spec: CaseSpec, device: str | torch.device = "cpu") -> Case:
    """Build the inputs of ``spec`` (generated in float64, rounded once to the dtype)."""
    q, k, v, dout = (t.to(spec.torch_dtype).to(device) for t in values.generate(spec))
    return Case(spec=spec, q=q, k=k, v=v, dout=dout)
