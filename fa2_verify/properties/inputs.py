"""What fills a case's tensors: dtype, value generator, seed and softmax scale.

Values are never drawn element by element: a case names a generator from
:data:`core.values.GENERATORS` and a seed, so every counterexample is a
:class:`~core.case.CaseSpec` that rebuilds its inputs bit for bit.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from hypothesis import strategies as st

from fa2_verify.core.contract import Capabilities
from fa2_verify.properties.validation import check_choices
from fa2_verify.core import values
from fa2_verify.core.errors import UsageError

#: The benign generators; the rest of the catalog is adversarial or rescaled.
BENIGN: tuple[str, ...] = ("normal", "uniform")

#: Softmax scales besides the default ``1/sqrt(head_dim)``: powers of two, and
#: non-powers rounded to float32 so a float32 kernel holds the exact scale the
#: golden uses (a scale off by a rounding error is not what is being tested).
SCALES: tuple[float, ...] = (1.0, 0.5, 2.0**-6, 4.0) + tuple(
    float(torch.tensor(s, dtype=torch.float32)) for s in (0.3, 1.0 / math.e)
)


def is_rescaled(name: str) -> bool:
    """Whether ``name`` is a rescaled benign generator such as ``normal-x2^-8``."""
    return any(name.startswith(f"{base}-x2^") for base in BENIGN)


def generator_names(*, include: Iterable[str] | None = None) -> st.SearchStrategy[str]:
    """A value generator name: benign, rescaled or adversarial, each family a third of the time.

    Benign comes first so that a failure shrinks toward ``normal``.
    """
    names = check_choices("include", include, values.GENERATORS) if include is not None else tuple(values.GENERATORS)
    families = (
        [name for name in BENIGN if name in names],
        [name for name in names if is_rescaled(name)],
        [name for name in names if name not in BENIGN and not is_rescaled(name)],
    )
    return st.one_of([st.sampled_from(family) for family in families if family])


def seeds() -> st.SearchStrategy[int]:
    """A generator seed (shrinks toward 0)."""
    return st.integers(0, 2**32 - 1)


def softmax_scales(*, custom: bool = True) -> st.SearchStrategy[float | None]:
    """``None`` (the default ``1/sqrt(head_dim)``) or one of :data:`SCALES`; ``None`` only when not ``custom``
    (a kernel declaring ``custom_softmax_scale=False``)."""
    return st.one_of(st.none(), st.sampled_from(SCALES)) if custom else st.none()


def drawn_dtypes(*, capabilities: Capabilities, device: str, include: Iterable[str] | None = None) -> tuple[str, ...]:
    """The dtype names the kernel supports on ``device`` (and in ``include`` if given), in its order."""
    device_type = torch.device(device).type
    supported = tuple(capabilities.dtypes.get(device_type, ()))
    if not supported:
        raise UsageError(f"device={device!r}: the kernel supports no dtype there (it runs on {sorted(capabilities.dtypes)})")
    return supported if include is None else check_choices("dtypes", include, supported)


def dtypes(*, capabilities: Capabilities, device: str, include: Iterable[str] | None = None) -> st.SearchStrategy[str]:
    """A dtype name of :func:`drawn_dtypes`."""
    return st.sampled_from(drawn_dtypes(capabilities=capabilities, device=device, include=include))
