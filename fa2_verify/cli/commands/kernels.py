"""``fa2-verify kernels``: list the targets, their capabilities (shape constraints and missing outputs
included), and whether they run here or why not.

Every target is loaded before anything is printed: one that cannot be loaded,
or whose hooks raise, is a one-line :class:`~core.errors.KernelLoadError`
(exit 2), never a row of a listing that exits 0.
"""

from __future__ import annotations

import torch

from fa2_verify.app.targets import load_target
from fa2_verify.verify.registry import BUNDLED


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("kernels", help="list kernel targets and their capabilities")
    parser.add_argument("names", nargs="*", help="targets to describe (default: all bundled)")
    parser.set_defaults(handler=handle)


def _features(caps) -> str:
    """The capability flags that are on; ``gqa-dkv-unordered``: GQA dK, dV summed in any order (not bitwise reproducible)."""
    flags = [
        ("causal", caps.causal),
        ("window", caps.window),
        ("gqa", caps.gqa),
        ("backward", caps.backward),
        ("deterministic", caps.deterministic_backward),
        ("varlen", caps.varlen),
        ("gqa-dkv-unordered", caps.gqa and caps.backward and not caps.gqa_dkv_reproducible),
    ]
    return ",".join(name for name, on in flags if on) or "-"


def handle(args) -> int:
    names = args.names or list(BUNDLED)
    here = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    kernels = [load_target(name) for name in names]
    columns = []  # (name, devices/dtypes, head dims, features, runs here) per kernel
    for kernel in kernels:
        caps = kernel.capabilities
        devices = "; ".join(f"{dev}: {','.join(dts)}" for dev, dts in caps.dtypes.items())
        dims = caps.head_dims
        head_dims = f"{min(dims)}..{max(dims)}" if len(dims) > 6 else ",".join(map(str, dims))
        status = []
        for device in here:
            reason = kernel.unavailable_reason(device)
            status.append(f"{device}: yes" if reason is None else f"{device}: no ({reason})")
        columns.append((kernel.name, devices, head_dims, _features(caps), "; ".join(status)))
    header = ("kernel", "devices/dtypes", "head dims", "features", "runs here")
    widths = [max(len(row[i]) for row in [header, *columns]) for i in range(4)]
    print(" ".join(f"{cell:<{width}}" for cell, width in zip(header, widths)) + f" {header[4]}")
    for kernel, row in zip(kernels, columns):
        print(" ".join(f"{cell:<{width}}" for cell, width in zip(row, widths)) + f" {row[4]}")
        for line in [*(f"constraint: {c}" for c in kernel.capabilities.constraints()),
                     *(f"note: {n}" for n in kernel.capabilities.notes)]:
            print(f"{'':<{widths[0]}} {line}")
    return 0
