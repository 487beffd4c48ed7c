"""A CUDA fault ends the example as it is (properties/verdicts.py, :class:`DeviceLost`).

After an illegal address the CUDA context is lost: every later call raises,
whatever the case.  The example that faulted is reported with its one-line
reproduction, neither replayed nor shrunk (each replay would fail for the lost
context, and shrinking would end on a meaningless minimal case), and the
examples after it end at once without being blamed.  The fault is simulated
here: ``torch.cuda.synchronize`` raises as it does on a faulted GPU.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fa2_verify.core.case import CaseSpec
from fa2_verify.properties import profiles, verdicts
from fa2_verify.properties.declaration import DeviceLost
from fa2_verify.properties.session import Suite
from fa2_verify.verify.registry import load_kernel

SPEC = CaseSpec(1, 3, 5, 2, 1, 32, "float16", seed=4)
FAULT = "CUDA error: an illegal memory access was encountered"


@pytest.fixture
def faulted(monkeypatch) -> Suite:
    def synchronize(device=None) -> None:
        raise RuntimeError(f"{FAULT}\nCUDA kernel errors might be asynchronously reported")

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    return Suite(load_kernel("reference"), "cuda", profiles.get("ci"))


def test_the_faulting_example_is_reported_once_unshrunk(faulted: Suite) -> None:
    examples = []

    @settings(database=None, max_examples=20)
    @given(st.integers(0, 1000))
    def search(value: int) -> None:
        examples.append(value)
        verdicts.failed_run(faulted, SPEC, "out", "reference.forward raised AcceleratorError")

    with pytest.raises(DeviceLost) as raised:
        search()
    assert len(examples) == 1
    message = str(raised.value)
    assert FAULT in message and "\n" not in message
    assert message.endswith(SPEC.reproduction("reference", "cuda"))


def test_examples_after_the_fault_end_without_blame(faulted: Suite) -> None:
    with pytest.raises(DeviceLost, match="had faulted before this example.*not this one"):
        verdicts.introduce(faulted, SPEC)


def test_a_working_or_cpu_device_is_not_faulted() -> None:
    assert verdicts.device_fault("cpu") is None
