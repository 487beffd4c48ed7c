"""``fa2-verify bench``: time the ``triton`` kernels against PyTorch's built-in FA2 on a GPU.

A thin wrapper over :mod:`bench.run` (its docstring describes the sections,
the rows and the checks); it needs a CUDA device.
"""

from __future__ import annotations

from fa2_verify.bench import run
from fa2_verify.verify.registry import require_device


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmark the triton kernels against PyTorch's FA2 (GPU)")
    parser.set_defaults(handler=handle)
    run.add_arguments(parser)


def handle(args) -> int:
    require_device("cuda")
    return run.run(args)
