"""What a kernel's ``config()`` declares about itself, checked once before any case runs.

``config()`` is free-form (tiles, versions: what a run records to be
reproduced), with two rules:

* Every number in it, at any depth, is finite: it is written into every
  report as strict JSON, and a NaN or an infinity found only then would end
  a whole run in a report that cannot be written.
* The declarations the checks read are what they claim to be: ``block_k``
  (the key tile of the dQ spread bound, :mod:`properties.determinism`) is a
  positive int, and ``partial_sums`` is the declaration
  :meth:`verify.error_model.PartialSums.validate` accepts.  A bool, a float,
  zero or an unknown field there would otherwise be read as "not declared"
  or as a size the kernel does not have.

A declaration cannot loosen the bounds beyond what the case's numerics allow:
the error model counts at most a row's visible keys as its key blocks
(``block_k``) and as its filled splits (``out_splits``), so a tile of 1 or a
million splits declared for eight keys is held to eight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from fa2_verify.core.errors import KernelLoadError
from fa2_verify.verify.error_model import PartialSums

#: The ``config()`` key of the kernel's key tile.
BLOCK_K = "block_k"


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first non-finite float in ``value`` (mappings and sequences walked), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    return next((found for key, item in items if (found := _non_finite(item, f"{path}[{key!r}]"))), None)


def declared_block_k(config: Mapping[str, Any]) -> int | None:
    """The key tile ``config`` declares as ``block_k``, None if it declares none; anything but a positive int
    (a bool, a float, zero) is a one-line :class:`KernelLoadError`."""
    block_k = config.get(BLOCK_K)
    if block_k is None:
        return None
    if isinstance(block_k, bool) or not isinstance(block_k, int) or block_k < 1:
        raise KernelLoadError(f"config()[{BLOCK_K!r}]={block_k!r}: the key tile must be a positive int")
    return block_k


def validate(config: Mapping[str, Any]) -> None:
    """Raise a one-line :class:`KernelLoadError` naming the first key path of ``config`` that breaks a rule
    of the module docstring."""
    where = _non_finite(config, "config()")
    if where is not None:
        raise KernelLoadError(f"{where} is not a finite number: config() is recorded as strict JSON")
    declared_block_k(config)
    PartialSums.validate(config)
