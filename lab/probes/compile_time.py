"""Time compiling the Triton FA2 kernels' sm90 variants on the CPU, per pass, dtype and head-dim block.

For each (dtype, head dim) it builds the launches of one small case on an
H100/H200 (:func:`kernels.triton_fa2.variants.launches`, tile table
``sm90``), takes the variant of each pass (forward; dK/dV with the atomic dQ
of the non-deterministic backward and without it, and the separate dQ
kernel of the deterministic one), and compiles it with Triton's own pipeline
for ``GPUTarget("cuda", 90, 32)`` (``triton.compile`` on the launch's compile
key, :func:`kernels.triton_fa2.variants.key`) into an empty
``TRITON_CACHE_DIR`` of its own, so nothing is cached.  It prints, per
variant, the tile, the seconds of each compiler stage (``ttir``, ``ttgir``,
``llir``, ``ptx``; ``cubin`` is ptxas) and the cubin's registers and
local-memory stack bytes per thread (``cuobjdump -res-usage``).  Needs
Triton with its bundled ptxas and ``TRITON_INTERPRET`` unset; no GPU.
``--row`` replaces a row of the sm90 table for this run, to time a candidate
tile (the package's table is not changed)::

    python -m lab.probes.compile_time --dtype float32 --head-dim 32 64 128 256
    python -m lab.probes.compile_time --dtype float32 --head-dim 128 --row backward_kv:128=32,32,8,1

Not part of the test suite (it takes minutes: an old float32 variant compiled for up to 32 s on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time

from fa2_verify.core.case import DTYPES, CaseSpec
from fa2_verify.core.errors import UsageError
from fa2_verify.kernels.triton_fa2 import configs, plans, variants

#: The variants timed: (label, kernel, ATOMIC_DQ or None, deterministic backward).
PASSES: tuple[tuple[str, str, bool | None, bool], ...] = (
    ("forward", "forward_kernel", None, False),
    ("dK/dV +atomic dQ", "backward_kv_kernel", True, False),
    ("dK/dV", "backward_kv_kernel", False, True),
    ("dQ", "backward_dq_kernel", None, True),
)


def parse_row(text: str) -> tuple[tuple[str, int], configs.TileConfig]:
    """``pass:block_d=block_m,block_n,num_warps,num_stages`` -> ((pass, block_d), tile)."""
    try:
        head, values = text.split("=")
        pass_name, block_d = head.split(":")
        numbers = [int(value) for value in values.split(",")]
        if pass_name not in configs.PASSES or len(numbers) != 4:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected pass:block_d=block_m,block_n,num_warps,num_stages "
                                         f"with pass one of {', '.join(configs.PASSES)}") from None
    return (pass_name, int(block_d)), configs.TileConfig(*numbers)


def head_dim_arg(text: str) -> int:
    """A head dim the kernels take: 1 to 256."""
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a head dim from 1 to 256")
    return int(text)


def launch_of(dtype: str, head_dim: int, kernel: str, atomic_dq: bool | None, deterministic: bool) -> plans.Launch:
    """The launch of ``kernel`` in a small non-causal case of ``dtype`` and ``head_dim`` on sm90."""
    spec = CaseSpec(batch=1, seqlen_q=256, seqlen_k=256, heads_q=2, heads_kv=2, head_dim=head_dim, dtype=dtype,
                    backward=True, deterministic=deterministic)
    for plan in variants.launches(spec):
        if plan.kernel == kernel and (atomic_dq is None or plan.constexprs["ATOMIC_DQ"] == atomic_dq):
            return plan
    raise LookupError(f"no {kernel} launch for {spec}")


def _timed_stages(times: dict[str, float]):
    """Wrap the CUDA backend's compiler stages so each one adds its wall time to ``times``."""
    from triton.backends.nvidia.compiler import CUDABackend

    original = CUDABackend.add_stages

    def add_stages(self, stages, options, language):
        original(self, stages, options, language)
        for name, stage in list(stages.items()):
            def timed(src, metadata, _stage=stage, _name=name):
                start = time.perf_counter()
                try:
                    return _stage(src, metadata)
                finally:
                    times[_name] = times.get(_name, 0.0) + time.perf_counter() - start
            stages[name] = timed

    CUDABackend.add_stages = add_stages
    return lambda: setattr(CUDABackend, "add_stages", original)


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers, stack bytes) per thread of ``cubin``'s kernel, from ``cuobjdump -res-usage``."""
    from triton.knobs import nvidia

    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        cuobjdump = os.path.join(os.path.dirname(nvidia.ptxas.path), "cuobjdump")
        text = subprocess.run([cuobjdump, "-res-usage", file.name], capture_output=True, text=True, check=True).stdout
    registers = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    return int(registers.group(1)), int(stack.group(1))


def compile_plan(plan: plans.Launch) -> tuple[dict[str, float], int, int]:
    """Compile ``plan`` for sm90 in a fresh cache: (seconds per stage, registers, stack bytes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    name, specialization, options = variants.key(plan)
    from fa2_verify.kernels.triton_fa2 import kernels

    function = getattr(kernels, name)
    signature = {param.name: spec[0] for param, spec in zip(function.params, specialization)}
    constexprs = {(index,): spec[1] for index, spec in enumerate(specialization) if spec[0] == "constexpr"}
    attrs = {(index,): backend.parse_attr(spec[1]) for index, spec in enumerate(specialization)
             if spec[0] != "constexpr" and isinstance(spec[1], str)}
    times: dict[str, float] = {}
    restore = _timed_stages(times)
    try:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TRITON_CACHE_DIR"] = cache
            triton.knobs.cache.dir = cache
            compiled = triton.compile(ASTSource(function, signature, constexprs, attrs), target=target,
                                      options=dict(options))
    finally:
        restore()
    return times, *resources(compiled.asm["cubin"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="+", choices=("float16", "bfloat16", "float32"),
                        default=["float32"], help="dtypes (default: float32)")
    parser.add_argument("--head-dim", nargs="+", type=head_dim_arg, default=[32, 64, 128, 256],
                        help="head dims, each its own block (default: 32 64 128 256)")
    parser.add_argument("--pass", dest="passes", nargs="+", choices=[label for label, *_ in PASSES],
                        help="variants to compile (default: all four)")
    parser.add_argument("--row", type=parse_row, action="append", default=[],
                        help="pass:block_d=block_m,block_n,num_warps,num_stages: use this tile for the dtypes "
                             "given (repeatable)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("TRITON_INTERPRET=1: unset it, the interpreter compiles nothing")
    print("| dtype | pass | block_d | tile (m, n, warps, stages) | ttir+ttgir+llir | ptx | ptxas | total s "
          "| registers | stack bytes |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for dtype in args.dtype:
        precision = configs.precision_of(DTYPES[dtype])
        for (pass_name, block_d), tile in args.row:
            configs.TABLES[variants.DEFAULT_TARGET][(pass_name, precision, block_d)] = tile
        for size in args.head_dim:
            for label, kernel, atomic_dq, deterministic in PASSES:
                if args.passes and label not in args.passes:
                    continue
                try:
                    plan = launch_of(dtype, size, kernel, atomic_dq, deterministic)
                except UsageError as error:
                    parser.error(str(error))
                times, registers, stack = compile_plan(plan)
                front = sum(times.get(stage, 0.0) for stage in ("ttir", "ttgir", "llir"))
                tile = (plan.constexprs["BLOCK_M"], plan.constexprs["BLOCK_N"], plan.options["num_warps"],
                        plan.options["num_stages"])
                print(f"| {dtype} | {label} | {plan.constexprs.get('BLOCK_D', size)} | {tile} | {front:.1f} "
                      f"| {times.get('ptx', 0.0):.1f} | {times.get('cubin', 0.0):.1f} | {sum(times.values()):.1f} "
                      f"| {registers} | {stack} |", flush=True)


if __name__ == "__main__":
    main()
