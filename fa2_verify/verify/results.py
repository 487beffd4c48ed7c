"""Results of a verification run: per case, per output, and the JSON they are stored as.

A case ends in one of four statuses, kept apart as in ``torch.testing``:
``passed``; ``failed`` (some output mismatches the golden, see
:mod:`verify.metrics`); ``error`` (the kernel raised, or broke the contract,
e.g. an output of the wrong shape: a failure of the kernel); ``unsupported``
(outside the kernel's declared capabilities, or the kernel cannot run here:
listed, never counted as passed).  An error in fa2-verify itself is raised,
never recorded as a status.
"""

from __future__ import annotations

import dataclasses
import platform
import sys
from typing import Any

import torch

from fa2_verify import __version__
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.varlen import spec_from_dict
from fa2_verify.verify.metrics import OutputComparison, decode_float, encode_float

STATUSES = ("passed", "failed", "unsupported", "error")


@dataclasses.dataclass
class CaseResult:
    """One case run against one kernel on one device.

    ``golden`` records how the golden was computed: its ``method`` and its
    ``certified_bound`` per output (see ``golden.GoldenResult``).
    ``seconds`` is the wall time of each phase that ran (``kernel``,
    ``golden``, ``comparison``; :func:`verify.check.check_case`; a packed
    batch's one kernel call is on its first sequence only), printed by
    ``fa2-verify run`` and kept out of the reports, whose content depends on
    the case and the kernel only.
    ``skipped_outputs`` names each output of the contract the kernel does not
    provide (e.g. ``{"lse": "kernel provides no LSE"}``): listed as
    unsupported in the reports, never compared nor counted as passed.
    ``packed`` is the packed batch (:class:`core.varlen.VarlenSpec`) a sequence
    was checked in, through the varlen entry points: what reproduces it
    (:meth:`reproduction`), since the sequence alone would take the padded path.
    """

    spec: CaseSpec
    kernel: str
    device: str
    status: str
    comparisons: dict[str, OutputComparison] = dataclasses.field(default_factory=dict)
    reason: str | None = None
    golden: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    skipped_outputs: dict[str, str] = dataclasses.field(default_factory=dict)
    packed: CaseSpec | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {STATUSES}")

    def reproduction(self) -> str:
        """The one line that re-runs this case: its packed batch's when it was checked in one."""
        return (self.packed or self.spec).reproduction(self.kernel, self.device)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def counts_as_failure(self) -> bool:
        """A mismatch or a kernel error; ``unsupported`` is neither a pass nor a failure."""
        return self.status in ("failed", "error")

    def failed_outputs(self) -> list[str]:
        return [name for name, comparison in self.comparisons.items() if not comparison.passed]

    def to_dict(self) -> dict[str, Any]:
        packed = {} if self.packed is None else {"packed": self.packed.to_dict()}
        return {
            "spec": self.spec.to_dict(),
            **packed,
            "kernel": self.kernel,
            "device": self.device,
            "status": self.status,
            "reason": self.reason,
            "comparisons": {name: comparison.to_dict() for name, comparison in self.comparisons.items()},
            "skipped_outputs": dict(self.skipped_outputs),
            "golden": {
                "method": self.golden.get("method"),
                "certified_bound": {
                    name: encode_float(value) for name, value in self.golden.get("certified_bound", {}).items()
                },
            }
            if self.golden
            else {},
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "CaseResult":
        return cls(
            spec=spec_from_dict(record["spec"]),
            kernel=record["kernel"],
            device=record["device"],
            status=record["status"],
            comparisons={name: OutputComparison.from_dict(c) for name, c in record["comparisons"].items()},
            reason=record.get("reason"),
            golden=_decode_golden(record.get("golden", {})),
            skipped_outputs=dict(record.get("skipped_outputs", {})),
            packed=spec_from_dict(record["packed"]) if "packed" in record else None,
        )


def _decode_golden(record: dict[str, Any]) -> dict[str, Any]:
    if not record:
        return {}
    bounds = {name: decode_float(value) for name, value in record.get("certified_bound", {}).items()}
    return {"method": record.get("method"), "certified_bound": bounds}


@dataclasses.dataclass
class RunResult:
    """All cases of one run, with what is needed to reproduce and compare it."""

    kernel: str
    device: str
    cases: list[CaseResult]
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    thresholds: dict[str, float] = dataclasses.field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Number of cases per status."""
        return {status: sum(case.status == status for case in self.cases) for status in STATUSES}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record of the run (``tolerance.json`` wraps it, see :mod:`records.report_json`)."""
        return {
            "kernel": self.kernel,
            "device": self.device,
            "config": self.config,
            "environment": self.environment,
            "thresholds": self.thresholds,
            "summary": self.counts(),
            "cases": [case.to_dict() for case in self.cases],
        }


def device_name(device: str) -> str:
    """The device identity a baseline is tied to: ``cpu``, or the CUDA device's name (e.g. an H100)."""
    torch_device = torch.device(device)
    if torch_device.type == "cuda":
        return torch.cuda.get_device_name(torch_device)
    return torch_device.type


def environment(device: str) -> dict[str, Any]:
    """Versions and hardware a run depends on: python, torch, CUDA, the device's name (the CPU's model on a CPU)."""
    identity = device_name(device)
    if identity == "cpu":
        identity = platform.processor() or platform.machine()
    return {
        "fa2_verify": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "device_name": identity,
    }
