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
from fa2_verify.core.varlen import VarlenSpec
from fa2_verify.properties import golden_checks, profiles, verdicts
from fa2_verify.properties.declaration import DeviceLost
from fa2_verify.properties.session import Suite
from fa2_verify.verify.registry import load_kernel

SPEC = CaseSpec(1, 3, 5, 2, 1, 32, "float16", seed=4)
PACKED = VarlenSpec.packing(((3, 5), (0, 2)), heads_q=2, heads_kv=1, head_dim=32, dtype="float16")
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


def test_a_packed_batch_is_named_as_a_batch_not_as_its_first_sequence(faulted: Suite) -> None:
    """A varlen batch has no one-line reproduction: the fault names the batch the check ran."""
    batch = "varlen case {...}, strided-seqlen inputs"
    with pytest.raises(DeviceLost) as raised:
        verdicts.failed_run(faulted, SPEC, "out", "reference.forward_varlen raised AcceleratorError", case=batch)
    assert str(raised.value).endswith(f"run it again in a new process: {batch}")


def test_examples_after_the_fault_end_without_blame(faulted: Suite) -> None:
    with pytest.raises(DeviceLost, match="had faulted before this example.*not this one"):
        verdicts.introduce(faulted, SPEC)
    with pytest.raises(DeviceLost, match="had faulted before this example"):
        golden_checks.varlen_within_error_model(faulted, PACKED)


def test_a_working_or_cpu_device_is_not_faulted() -> None:
    assert verdicts.device_fault("cpu") is None
