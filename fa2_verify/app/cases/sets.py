"""The case sets ``fa2-verify run`` chooses from by name (``--cases``), and a case's name (``--case``).

``fixed`` is :data:`app.cases.fixed.FIXED_CASES`; ``scale`` is
:data:`app.cases.scale.SCALE_CASES` of the device type.  A case goes by its
own name, else its feature label (:func:`case_label`): the name the tables
print and ``--case NAME`` picks.
"""

from __future__ import annotations

import torch

from fa2_verify.app.cases import fixed, scale
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import UsageError

#: The case sets ``--cases`` chooses from.
CASE_SETS = ("fixed", "scale")


def case_set(name: str, device: str) -> tuple[CaseSpec, ...]:
    """The specs of ``--cases name`` on ``device``: the fixed set, or the scale set of its device type."""
    if name == "fixed":
        return fixed.FIXED_CASES
    return scale.SCALE_CASES[torch.device(device).type]


def case_label(spec: CaseSpec) -> str:
    """The name a case goes by in the tables and in ``--case``: its own, else its feature label."""
    return spec.name or spec.feature()


def select_cases(specs: tuple[CaseSpec, ...], names: list[str] | None, set_name: str) -> tuple[CaseSpec, ...]:
    """The cases of ``specs`` named in ``names`` (``--case``), in the set's order; all of them without names."""
    if not names:
        return specs
    labels = [case_label(spec) for spec in specs]
    unknown = next((name for name in names if name not in labels), None)
    if unknown is not None:
        raise UsageError(f"--case={unknown} is not a case of the {set_name} set: use one of {', '.join(labels)}")
    return tuple(spec for spec, label in zip(specs, labels) if label in names)
