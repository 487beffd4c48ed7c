"""How many pytest-xdist workers share a GPU, and how they share its memory under a per-example budget.

A profile with a per-example device-memory budget (:attr:`properties.profiles.Limits.max_bytes`, the
``scale`` profile's 20 GB) draws cases sized to fill it.  Workers that share a GPU
(:func:`properties.device_pinning.worker_device`) would otherwise find its memory held by one another's
caching allocators, and decline a case or run out of memory in it as the others' timing decides: four
uncapped workers on one H100 declined 106 of the ``scale`` profile's 319 cases as larger than the 9 to
13 GiB the others left free (docs/benchmarks.md, "The `scale` property profile").  So under such a budget each
of the ``k`` workers of a GPU keeps to an equal share of it (:func:`verify.memory.keep_to_share`), a case
is declined only when it outgrows that share (the same case every run), and a run whose share is below the
budget is refused before any test.  Profiles without a budget draw cases far below a GPU's memory, and
their targets may hold memory beyond the case (FlexAttention's compiled kernels, 12 to 15 GB per worker,
docs/targets.md): their workers' allocators stay uncapped.

:func:`workers_per_gpu` is the count of workers one GPU takes: the CPU cores per GPU, no more than the
budget lets share it.  The plugin answers ``-n auto`` with it, and ``ci/properties.sh`` asks for it with
``python -m fa2_verify.properties.gpu_shares PROFILE`` (the number of workers per GPU of this host).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from fa2_verify.core.errors import UsageError
from fa2_verify.properties import profiles


def workers_on_device(worker_index: int, worker_count: int, device: str, device_count: int) -> int:
    """The workers of ``worker_count`` that run on worker ``worker_index``'s GPU: every one when ``device``
    names an index or the host has one GPU, else those with its index modulo ``device_count``."""
    if device != "cuda" or device_count < 2:
        return worker_count
    return len(range(worker_index % device_count, worker_count, device_count))


def most_sharing(budget: int, device_bytes: int) -> int:
    """The most processes whose shares of a device of ``device_bytes`` (:func:`verify.memory.process_share`)
    each hold ``budget`` bytes (> 0); at least 1."""
    from fa2_verify.verify.memory import process_share

    sharing = 1
    while process_share(device_bytes, sharing + 1) >= budget:
        sharing += 1
    return sharing


def workers_per_gpu(profile_name: str, cores: int, gpus: int, device_bytes: int) -> int:
    """Workers for each of ``gpus`` GPUs of ``device_bytes`` (the smallest) on ``cores`` CPU cores: the cores
    per GPU, and under a per-example budget no more than :func:`most_sharing` of it; at least 1."""
    per_gpu = max(1, cores // max(1, gpus))
    budget = profiles.get(profile_name).limits("cuda").max_bytes
    return per_gpu if budget is None else min(per_gpu, most_sharing(budget, device_bytes))


def share_memory(profile_name: str, device: str, worker_count: int, worker_index: int | None,
                 worker_device: str) -> str | None:
    """Under the profile's per-example budget, refuse ``worker_count`` workers on ``device`` (as asked:
    ``cuda`` spreads them over the GPUs) whose GPU shares fall below it, and make worker ``worker_index``'s
    process keep to its share of ``worker_device`` (None: the controller, which only checks and returns the
    line its report header shows); nothing without a budget, off CUDA, or when one worker has the GPU."""
    import torch

    from fa2_verify.verify import memory

    budget = profiles.get(profile_name).limits("cuda").max_bytes
    if budget is None or not device.startswith("cuda") or worker_count < 2:
        return None
    gpus, smallest = _host_gpus()
    if worker_index is None:
        sharing = worker_count if device != "cuda" or gpus < 2 else math.ceil(worker_count / gpus)
        if sharing < 2:
            return None
        total = smallest if device == "cuda" else torch.cuda.get_device_properties(torch.device(device)).total_memory
        share = memory.process_share(total, sharing)
        if share < budget:
            raise UsageError(
                f"-n {worker_count}: {sharing} workers share a GPU of {total / 2**30:.1f} GiB, each "
                f"{share / 2**30:.1f} GiB, below the {profile_name} profile's {budget / 2**30:.1f} GiB per "
                f"example: run at most {most_sharing(budget, total)} per GPU (-n auto picks it)"
            )
        return (f"gpu memory: {sharing} workers share each GPU of {total / 2**30:.1f} GiB, each keeping to "
                f"{share / 2**30:.1f} GiB ({profile_name} profile: {budget / 2**30:.1f} GiB per example)")
    sharing = workers_on_device(worker_index, worker_count, device, gpus)
    if sharing > 1:
        memory.keep_to_share(worker_device, sharing)
    return None


def _host_workers_per_gpu(profile_name: str) -> tuple[int, int]:
    """``(GPUs, workers_per_gpu)`` of this host for the profile; ``(0, 0)`` without a CUDA GPU."""
    gpus, total = _host_gpus()
    if gpus == 0:
        return 0, 0
    return gpus, workers_per_gpu(profile_name, len(os.sched_getaffinity(0)), gpus, total)


def _host_gpus() -> tuple[int, int]:
    """``(GPUs, bytes of the smallest)`` of this host; ``(0, 0)`` without a CUDA GPU."""
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        return 0, 0
    return gpus, min(torch.cuda.get_device_properties(index).total_memory for index in range(gpus))


def auto_workers(config: Any) -> int | None:
    """``-n auto`` of a property run on CUDA: the GPUs times :func:`workers_per_gpu`; None otherwise
    (pytest-xdist's own count)."""
    kernel, device = config.getoption("fa2_kernel", None), config.getoption("fa2_device", None) or ""
    profile_name = config.getoption("fa2_profile", None) or "dev"
    if kernel is None or not device.startswith("cuda") or profile_name not in profiles.PROFILES:
        return None
    gpus, per_gpu = _host_workers_per_gpu(profile_name)
    return gpus * per_gpu if gpus else None


def main(argv: list[str]) -> int:
    """``python -m fa2_verify.properties.gpu_shares PROFILE``: print :func:`workers_per_gpu` for this host."""
    if len(argv) != 1 or argv[0] not in profiles.PROFILES:
        print(f"usage: python -m fa2_verify.properties.gpu_shares PROFILE ({', '.join(profiles.PROFILES)})",
              file=sys.stderr)
        return 2
    gpus, per_gpu = _host_workers_per_gpu(argv[0])
    if gpus == 0:
        print("python -m fa2_verify.properties.gpu_shares: no CUDA GPU is visible", file=sys.stderr)
        return 2
    print(per_gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
