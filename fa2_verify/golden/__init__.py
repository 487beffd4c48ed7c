"""mpmath high-precision golden attention (forward and backward), its certified fast path and cache.

The fast path (:mod:`golden.fast`, on :mod:`golden.eft`) is certified on sampled rows
(:mod:`golden.certify`) against double-double reference rows (:mod:`golden.dd_rows`, on
:mod:`golden.dd` and :mod:`golden.fixed`), which are checked against mpmath rows (:mod:`golden.rows`).

Public API: :class:`GoldenOptions`, :func:`compute`, :class:`GoldenResult`
(:mod:`golden.api`, :mod:`golden.options`).  Importing the package is cheap:
they load on first use, so e.g. :mod:`golden.cache` can be used without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fa2_verify.golden.api import GoldenResult, compute
    from fa2_verify.golden.options import GoldenOptions

__all__ = ["GoldenOptions", "GoldenResult", "compute"]

_HOMES = {"GoldenOptions": "fa2_verify.golden.options", "GoldenResult": "fa2_verify.golden.api", "compute": "fa2_verify.golden.api"}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'golden' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
