"""fa2-verify: numerical-correctness verification for FlashAttention-2 attention kernels.

The public API a user's kernel module imports:

* :class:`Capabilities`: what a kernel target supports (docs/design.md, "The kernel contract");
* :class:`UnsupportedCase`: raised by a kernel to decline a case its capabilities cannot express;
* :class:`CaseSpec` and :func:`check_case`: one case through a kernel, compared with the golden;
* :func:`autograd_target`: any autograd attention function as a target, in one call.

Subpackages, in layers that only import downwards (docs/design.md, "Layers"):
``fa2_verify.core`` (errors, the contract, the case record), ``fa2_verify.kernels``
(bundled kernels), ``fa2_verify.golden`` (the high-precision golden),
``fa2_verify.verify`` (the check, reports, baselines, gate), ``fa2_verify.bench``
(the kernel benchmark), ``fa2_verify.properties`` (the Hypothesis property suite
and its pytest plugin) and ``fa2_verify.cli`` (the ``fa2-verify`` command).

Importing this package is cheap: the names below load on first use (PEP 562),
so the pytest plugin, which every pytest run of the environment imports, pulls
in neither torch nor Hypothesis.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_HOMES = {
    "Capabilities": "fa2_verify.core.contract",
    "UnsupportedCase": "fa2_verify.core.errors",
    "Fa2VerifyError": "fa2_verify.core.errors",
    "CaseSpec": "fa2_verify.core.case",
    "check_case": "fa2_verify.verify.check",
    "autograd_target": "fa2_verify.kernels.autograd",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'fa2_verify' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return __all__
