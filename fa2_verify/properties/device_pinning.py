"""Which device and how many CPU threads each pytest-xdist worker of the property suite takes.

* With pytest-xdist on CUDA, worker ``gwI`` runs on ``cuda:(I mod GPUs)``
  (:func:`worker_device`): ``-n <number of GPUs>`` gives each worker its own
  GPU, and a multiple of it several workers per GPU.  The plugin makes that
  device current in each process that runs tests.
* Each xdist worker takes an equal share of the CPU threads
  (:func:`worker_threads`) unless ``OMP_NUM_THREADS`` is set.

Importing this module is cheap (the standard library only).
"""

from __future__ import annotations

import os
from typing import Any

THREADS_ENV = "OMP_NUM_THREADS"


def worker_device(device: str, worker_id: str | None, device_count: int) -> str:
    """The device a pytest-xdist worker uses: ``cuda`` on worker ``gwI`` of a multi-GPU host is ``cuda:I``.

    An explicit index (``cuda:1``), the CPU, the controller (``worker_id`` None)
    and single-GPU hosts keep ``device`` as given.
    """
    if device != "cuda" or worker_id is None or device_count < 2:
        return device
    return f"cuda:{int(worker_id.removeprefix('gw')) % device_count}"


def worker_threads(cpu_count: int, worker_count: int) -> int:
    """CPU threads for one of ``worker_count`` xdist workers: an equal share of the cores, at least 1.

    Each worker runs the golden on the CPU; with PyTorch's default (every core
    per process) the workers would oversubscribe the machine.  Setting
    ``OMP_NUM_THREADS`` overrides this.
    """
    return max(1, cpu_count // max(1, worker_count))


def worker_share(workerinput: dict[str, Any] | None) -> int | None:
    """:func:`worker_threads` for this xdist worker; ``None`` outside a worker or when ``OMP_NUM_THREADS`` is set."""
    if workerinput is None or THREADS_ENV in os.environ:
        return None
    return worker_threads(os.cpu_count() or 1, int(workerinput.get("workercount", 1)))
