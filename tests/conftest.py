"""Shared fixtures and hooks for the project's tests.

Tests marked ``gpu`` need a CUDA device and are skipped, with the reason, when
none is visible; collection itself never needs one.

Each xdist worker, and every process it starts (pytester runs, the CLI, the
Triton interpreter checks), takes an equal share of the cores
(:func:`fa2_verify.properties.device_pinning.worker_share`): with PyTorch's default of
every core per process, two workers on the 2-core CI runner spent about five
times the CPU time, their threads waiting on each other.
"""

from __future__ import annotations

import os

import pytest
import torch

from fa2_verify.properties import device_pinning


def pytest_configure(config: pytest.Config) -> None:
    threads = device_pinning.worker_share(getattr(config, "workerinput", None))
    if threads is not None:
        os.environ[device_pinning.THREADS_ENV] = str(threads)
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
