"""benchmarks/launch_overhead.py: its refusal without a GPU (the measurement itself needs one)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import launch_overhead


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_fails_with_one_line(capsys):
    assert launch_overhead.main(["--seqlens", "1024"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "launch_overhead.py: error: no CUDA device: it times the kernels' launch on a GPU\n"
