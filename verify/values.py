"""Catalog of value generators: how the entries of q, k, v and dout are drawn.

Each generator is a plain, seeded function so that a case is reproducible from
its spec alone (the gate corpus stores only specs).  Hypothesis strategies in
:mod:`properties` choose a generator name and a seed; they never draw tensor
entries one by one.  Adversarial generators document the bug class they target.

A generator takes the case spec and a ``torch.Generator`` (CPU) and returns
float64 tensors ``(q, k, v, dout)`` in contract layout; the caller rounds them
to the case dtype, so the golden sees exactly what the kernel sees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from verify.case import CaseSpec

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
Generator = Callable[["CaseSpec", torch.Generator], Tensors]

GENERATORS: dict[str, Generator] = {}


def register(name: str) -> Callable[[Generator], Generator]:
    """Decorator adding a generator to :data:`GENERATORS` under ``name``."""

    def add(function: Generator) -> Generator:
        if name in GENERATORS:
            raise ValueError(f"value generator {name!r} is registered twice")
        GENERATORS[name] = function
        return function

    return add


def shapes(spec: "CaseSpec") -> tuple[tuple[int, ...], ...]:
    """Shapes of (q, k, v, dout) in contract layout."""
    q = (spec.batch, spec.seqlen_q, spec.heads_q, spec.head_dim)
    kv = (spec.batch, spec.seqlen_k, spec.heads_kv, spec.head_dim)
    return q, kv, kv, q


def _draw(spec: "CaseSpec", rng: torch.Generator, sample: Callable[[tuple[int, ...]], torch.Tensor]) -> Tensors:
    return tuple(sample(shape) for shape in shapes(spec))  # type: ignore[return-value]


@register("normal")
def normal(spec: "CaseSpec", rng: torch.Generator) -> Tensors:
    """Standard normal entries: the usual benign case."""
    return _draw(spec, rng, lambda shape: torch.randn(shape, generator=rng, dtype=torch.float64))


@register("uniform")
def uniform(spec: "CaseSpec", rng: torch.Generator) -> Tensors:
    """Uniform on [-1, 1): bounded logits, no outliers."""
    return _draw(spec, rng, lambda shape: 2 * torch.rand(shape, generator=rng, dtype=torch.float64) - 1)


def generate(spec: "CaseSpec") -> Tensors:
    """Draw the float64 inputs of ``spec`` from its generator and seed."""
    try:
        generator = GENERATORS[spec.generator]
    except KeyError:
        from verify.errors import UsageError

        raise UsageError(
            f"generator={spec.generator!r} is not a value generator: use one of {', '.join(sorted(GENERATORS))}"
        ) from None
    rng = torch.Generator().manual_seed(spec.seed)
    return generator(spec, rng)
