"""core.triton_passes: where the float64 Triton passes serve by default, and the trial that keeps torch where
they cannot build (golden.passes, verify.bound_weights)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from fa2_verify.core import triton_passes

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def test_the_passes_serve_cuda_with_triton_and_no_interpreter_by_default(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_passes.importlib.util, "find_spec", lambda name: object())
    assert triton_passes.serve_by_default(CUDA)
    assert not triton_passes.serve_by_default(CPU)
    for interpreted in ("1", "true", "ON", " yes "):
        monkeypatch.setenv("TRITON_INTERPRET", interpreted)
        assert not triton_passes.serve_by_default(CUDA), interpreted
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert triton_passes.serve_by_default(CUDA)
    monkeypatch.setattr(triton_passes.importlib.util, "find_spec", lambda name: None)
    assert not triton_passes.serve_by_default(CUDA)


def test_a_trial_that_raises_keeps_torch():
    def fails(device):
        raise RuntimeError("no C compiler")

    def runs(device):
        block, ends, row = triton_passes.trial_block(device)
        assert block.shape == (1, 1, 4, 8) and ends.shape == (4,) and row.shape == (1, 1, 4)

    assert not triton_passes.trial_runs(fails, CPU)
    assert triton_passes.trial_runs(runs, CPU)


def test_scalars_are_float64_and_made_once():
    first = triton_passes.float64_scalars(CPU, 0.1, 2.0**-60)
    assert first.dtype == torch.float64 and first.tolist() == [0.1, 2.0**-60]  # not rounded to float32
    assert triton_passes.float64_scalars(CPU, 0.1, 2.0**-60) is first


def test_host_tensors_need_no_device_guard():
    assert isinstance(triton_passes.on_device_of(torch.zeros(1)), contextlib.nullcontext)


def test_the_golden_takes_the_passes_where_they_serve_and_build(monkeypatch):
    pytest.importorskip("triton")
    from fa2_verify.golden import fast, passes

    monkeypatch.setattr(triton_passes, "serve_by_default", lambda device: device.type == "cuda")
    monkeypatch.setattr(passes, "compiles", lambda device: device == CUDA)
    assert fast.uses_passes(CUDA)
    assert not fast.uses_passes(torch.device("cuda", 1))  # Triton fails to build there
    assert not fast.uses_passes(CPU)


def test_the_golden_passes_that_fail_to_build_or_launch_leave_torch():
    """golden.passes.compiles is False where its trial cannot run (a CPU tensor outside the interpreter), asked
    once per device."""
    pytest.importorskip("triton")
    from fa2_verify.golden import passes

    triton_passes.trial_runs.cache_clear()
    assert not passes.compiles(CPU)
    assert not passes.compiles(CPU)
    assert triton_passes.trial_runs.cache_info().misses == 1
