"""``fa2-verify warmup``: compile, before the suite runs, the ``triton`` kernel variants a profile will need.

The property suite on a GPU is compile-bound on a cold Triton cache: its
first examples wait on Triton's compiler one variant at a time.  This
command draws the cases the profile draws (:func:`properties.draws.profile_cases`:
each property run as the suite runs it, with the profile's GPU limits,
derandomized, ``--examples`` draws each), reduces their kernel launches to the
distinct compile keys (:func:`kernels.triton_fa2.variants.variants_of`: the
keys Triton itself derives) and compiles those in ``--processes`` processes into the cache
(``TRITON_CACHE_DIR``), where the suite's workers find them.  It is
optional: the suite compiles whatever is missing on first use.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import DeviceUnavailable, UsageError
from fa2_verify.core.triton_passes import interpret_requested
from fa2_verify.kernels.triton_fa2 import environment
from fa2_verify.properties import profiles


def _compile(job: tuple[CaseSpec, str, int]) -> None:
    """Compile one variant (in a worker process) on the current CUDA device."""
    import torch

    from fa2_verify.kernels.triton_fa2 import variants

    spec, layout, index = job
    device = torch.device("cuda", torch.cuda.current_device())
    variants.compile_launch(variants.launches(spec, layout=layout, target=variants.target_of(device))[index], device)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "warmup",
        help="compile the triton kernel variants a property profile needs into the Triton cache (GPU)",
        description="Compile ahead of the suite, in parallel, the triton kernel variants a profile draws.",
    )
    parser.add_argument("--profile", default="ci", choices=list(profiles.PROFILES), help="Hypothesis profile (default: ci)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="compiler processes (default: the CPU count)")
    parser.add_argument("--kernel", default="triton", choices=["triton"], help="the kernel to warm up (only triton)")
    parser.add_argument("--examples", type=int, metavar="K",
                        help="draws of each case strategy (default: the profile's examples per property)")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    import torch

    if args.processes < 1 or (args.examples is not None and args.examples < 1):
        raise UsageError(f"--processes={args.processes}, --examples={args.examples}: pass integers >= 1")
    if not torch.cuda.is_available():
        raise DeviceUnavailable("warmup compiles for the GPU and no CUDA device is visible: run it on the GPU runner")
    if interpret_requested():
        raise UsageError("TRITON_INTERPRET is set: the interpreter compiles nothing; unset it to warm up")
    reason = environment.current().unavailable_reason()
    if reason is not None:
        raise DeviceUnavailable(f"triton kernel: {reason}")
    examples = args.examples or profiles.get(args.profile).max_examples
    from fa2_verify.kernels.triton_fa2 import variants
    from fa2_verify.properties.draws import profile_cases

    target = variants.target_of(torch.device("cuda", torch.cuda.current_device()))
    jobs = list(variants.variants_of(profile_cases(args.profile, examples), target).values())
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.processes, mp_context=context) as pool:
        list(pool.map(_compile, jobs))
    elapsed = time.perf_counter() - start
    cache = os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache")
    print(f"compiled {len(jobs)} triton variants for profile {args.profile} in {elapsed:.1f} s "
          f"with {args.processes} processes into {cache}")
    return 0
