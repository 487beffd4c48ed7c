"""A CUDA fault or a full GPU ends the example as it is (properties/verdicts.py,
:class:`DeviceLost`, :class:`DeviceOutOfMemory`).

After an illegal address the CUDA context is lost: every later call raises,
whatever the case.  The example that faulted is reported with its one-line
reproduction, neither replayed nor shrunk (each replay would fail for the lost
context, and shrinking would end on a meaningless minimal case), and the
examples after it end at once without being blamed.  The fault is simulated
here: ``torch.cuda.synchronize`` raises as it does on a faulted GPU.

A kernel call that finds the GPU full fails its example the same way, with the
memory free: on a GPU shared by several workers a replay would fail or pass by
chance.  The full GPU is simulated by the error text each layer raises and by
``torch.cuda.mem_get_info``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.varlen import VarlenSpec
from fa2_verify.properties import golden_checks, harness, profiles, verdicts
from fa2_verify.properties.declaration import DeviceLost, DeviceOutOfMemory, Property, PropertyFailure
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


def _search_failing(suite: Suite, reason: str, expected: type[BaseException]) -> str:
    """The message of ``expected``, raised by a Hypothesis search whose every example fails its kernel run
    with ``reason``, once the search has run exactly one example (no replay, no shrinking)."""
    examples = []

    @settings(database=None, max_examples=20)
    @given(st.integers(0, 1000))
    def search(value: int) -> None:
        examples.append(value)
        verdicts.failed_run(suite, SPEC, "out", reason)

    with pytest.raises(expected) as raised:
        search()
    assert len(examples) == 1
    return str(raised.value)


def test_the_faulting_example_is_reported_once_unshrunk(faulted: Suite) -> None:
    message = _search_failing(faulted, "reference.forward raised AcceleratorError", DeviceLost)
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


OUT_OF_MEMORY = "status error: flex-attention.forward raised RuntimeError: CUDA driver error: out of memory"


@pytest.fixture
def full_gpu(monkeypatch) -> Suite:
    """A working CUDA device with 1 GiB of 80 free, this process's allocator holding 0.5 GiB."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 2**29)
    return Suite(load_kernel("reference"), "cuda", profiles.get("ci"))


def test_a_full_gpu_fails_the_example_once_unshrunk_naming_the_memory_free(full_gpu: Suite) -> None:
    message = _search_failing(full_gpu, OUT_OF_MEMORY, DeviceOutOfMemory)
    assert "CUDA driver error: out of memory" in message and "\n" not in message
    assert "now 1.0 of 80.0 GiB free, 0.5 GiB held by this process's allocator" in message
    assert message.endswith(SPEC.reproduction("reference", "cuda"))


@pytest.mark.parametrize(
    "error",
    [
        "reference.forward raised OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "reference.backward raised AcceleratorError: CUDA error: out of memory",
    ],
)
def test_every_layers_out_of_memory_error_is_recognized(full_gpu: Suite, error: str) -> None:
    with pytest.raises(DeviceOutOfMemory):
        verdicts.failed_run(full_gpu, SPEC, "dq", error)


def test_other_kernel_errors_and_the_cpu_still_fail_as_the_kernels(full_gpu: Suite) -> None:
    with pytest.raises(PropertyFailure, match="illegal instruction"):
        verdicts.failed_run(full_gpu, SPEC, "out", "reference.forward raised RuntimeError: illegal instruction")
    on_cpu = Suite(load_kernel("reference"), "cpu", profiles.get("ci"))
    with pytest.raises(PropertyFailure, match="out of memory"):
        verdicts.failed_run(on_cpu, SPEC, "out", "reference.forward raised RuntimeError: out of memory")


def test_the_harness_running_out_of_memory_ends_the_example_naming_its_case(full_gpu: Suite) -> None:
    """An allocation of the harness's own (the golden, the poisoned outputs) that finds the GPU full."""
    examples = []

    def check(suite: Suite, data) -> None:
        examples.append(data)
        suite.running(SPEC)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    prop = Property(name="test_needs_memory", invariant="x", check=check, breaker="reference")
    test = harness.build_test(prop, settings(database=None, max_examples=5), harness.Shard(None, 5, None))
    with pytest.raises(DeviceOutOfMemory) as raised:
        test(fa2_suite=full_gpu)
    assert len(examples) == 1 and full_gpu.running_case == ""
    message = str(raised.value)
    assert "OutOfMemoryError outside the kernel's calls: CUDA out of memory" in message
    assert message.endswith(SPEC.reproduction("reference", "cuda"))


def test_other_harness_errors_are_left_to_hypothesis(full_gpu: Suite) -> None:
    def check(suite: Suite, data) -> None:
        raise RuntimeError("a bug of the harness")

    prop = Property(name="test_harness_bug", invariant="x", check=check, breaker="reference")
    test = harness.build_test(prop, settings(database=None, max_examples=5), harness.Shard(None, 5, None))
    with pytest.raises(RuntimeError, match="a bug of the harness"):
        test(fa2_suite=full_gpu)


def test_a_fault_the_kernel_call_raised_ends_the_example_and_those_after_it(monkeypatch) -> None:
    """Off CUDA too (a fault simulated on the CPU, tests/faulting.py): the fault the kernel call raised marks
    the process (verify.device_fault), the example ends with DeviceLost naming it, and every later example
    ends at once, the kernel not called again."""
    from fa2_verify.core.case import make_case
    from fa2_verify.verify import device_fault
    from tests import faulting

    monkeypatch.setattr(faulting, "_lost", [])
    monkeypatch.setattr(device_fault, "_recorded", [])
    suite = Suite(load_kernel("tests.faulting:FAULTS_ON_HEAD_DIM_40"), "cpu", profiles.get("ci"))
    spec = CaseSpec(1, 3, 5, 2, 1, faulting.FATAL_HEAD_DIM, "float32", seed=4)
    with pytest.raises(DeviceLost) as raised:
        verdicts.call_kernel(suite, spec, "out", make_case(spec, "cpu"))
    assert "faulted in this case (tests.faulting:FAULTS_ON_HEAD_DIM_40.forward faulted the device: " in str(raised.value)
    assert str(raised.value).endswith(spec.reproduction(suite.kernel.name, "cpu"))
    with pytest.raises(DeviceLost, match="had faulted before this example"):
        verdicts.introduce(suite, SPEC)
