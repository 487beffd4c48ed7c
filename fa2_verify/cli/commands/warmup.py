"""``fa2-verify warmup``: compile, before the suite runs, the ``triton`` kernel variants a profile will need.

The property suite on a GPU is compile-bound on a cold Triton cache: its
first examples wait on Triton's compiler one variant at a time.  This
command draws the cases the profile draws (:func:`profile_cases`: each
property's case strategy with the profile's GPU limits, derandomized,
``--examples`` draws each), reduces their kernel launches to the distinct
compile keys (:mod:`kernels.triton_fa2.variants`: the keys Triton itself
derives) and compiles those in ``--processes`` processes into the cache
(``TRITON_CACHE_DIR``), where the suite's workers find them.  It is
optional: the suite compiles whatever is missing on first use.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import time

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import DeviceUnavailable, UsageError
from fa2_verify.core.layouts import LAYOUTS
from fa2_verify.kernels.triton_fa2 import environment
from fa2_verify.properties import profiles

#: The case strategies of the properties (properties/test_*.py), as ``case_specs`` options, and whether the
#: property also runs the case as MHA with repeated K, V (the GQA relations), causal (the mask relations) or
#: in a drawn non-contiguous layout (the layout relation).
DRAWS: tuple[tuple[dict, str], ...] = (
    ({}, ""),
    ({"masked": False}, "causal"),
    ({"min_batch": 2}, ""),
    ({"min_heads_q": 2}, ""),
    ({"min_group": 2}, "mha"),
    ({"backward": True}, "layouts"),
    ({"backward": True, "min_group": 2}, "mha"),
    ({"backward": True, "deterministic": True}, ""),
)


def _draw(strategy, examples: int, seed: int | None = None) -> list:
    """``examples`` values of ``strategy`` as Hypothesis draws them for a property: derandomized (the same
    cases, so the same variants, on every run), or, with ``seed``, as a run with that seed draws them."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    drawn: list = []

    @settings(max_examples=examples, derandomize=seed is None, database=None, deadline=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value) -> None:
        drawn.append(value)

    (collect if seed is None else hypothesis_seed(seed)(collect))()
    return drawn


def _related(spec: CaseSpec, relation: str, layout: str) -> list[tuple[CaseSpec, str]]:
    """``spec`` and the cases a property runs beside it, each with its memory layout."""
    cases = [(spec, "contiguous")]
    if relation == "mha":
        cases.append((dataclasses.replace(spec, heads_kv=spec.heads_q), "contiguous"))
    elif relation == "causal":
        cases.append((dataclasses.replace(spec, causal=True), "contiguous"))
    elif relation == "layouts":
        cases.append((spec, layout))
    return cases


def profile_cases(profile_name: str, examples: int, seed: int | None = None) -> list[tuple[CaseSpec, str]]:
    """(case, layout) pairs that the ``triton`` kernel runs on a GPU under ``profile_name``: ``examples``
    draws of each property's case strategy (:data:`DRAWS`, and the varlen cases, each in a layout as the
    varlen property draws it) with the related cases; derandomized, or drawn with ``seed`` (:func:`_draw`)."""
    from hypothesis import strategies as st

    from fa2_verify.properties.cases import case_specs
    from fa2_verify.properties.varlen import varlen_specs

    capabilities = environment.Environment(triton_installed=True, interpret=False, cuda_available=True).capabilities
    limits = profiles.get(profile_name).limits("cuda")
    layouts = st.sampled_from(LAYOUTS[1:])
    cases: list[tuple[CaseSpec, str]] = []
    for options, relation in DRAWS:
        strategy = st.tuples(case_specs(capabilities=capabilities, device="cuda", limits=limits, **options), layouts)
        for spec, layout in _draw(strategy, examples, seed):
            cases += _related(spec, relation, layout)
    varlen = varlen_specs(capabilities=capabilities, device="cuda", limits=limits, backward=True)
    cases += _draw(st.tuples(varlen, st.sampled_from(LAYOUTS)), examples, seed)
    return cases


def variants_of(cases: list[tuple[CaseSpec, str]], target: str) -> dict[tuple, tuple[CaseSpec, str, int]]:
    """Each distinct compile key of ``cases``' launches on a GPU of ``target`` (a tile table of
    :mod:`kernels.triton_fa2.configs`), with the first (case, layout, launch index) needing it."""
    from fa2_verify.kernels.triton_fa2 import variants

    found: dict[tuple, tuple[CaseSpec, str, int]] = {}
    for spec, layout in cases:
        for index, plan in enumerate(variants.launches(spec, layout=layout, target=target)):
            found.setdefault(variants.key(plan), (spec, layout, index))
    return found


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
    if environment.interpret_requested():
        raise UsageError("TRITON_INTERPRET is set: the interpreter compiles nothing; unset it to warm up")
    reason = environment.current().unavailable_reason()
    if reason is not None:
        raise DeviceUnavailable(f"triton kernel: {reason}")
    examples = args.examples or profiles.get(args.profile).max_examples
    from fa2_verify.kernels.triton_fa2 import variants

    target = variants.target_of(torch.device("cuda", torch.cuda.current_device()))
    jobs = list(variants_of(profile_cases(args.profile, examples), target).values())
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.processes, mp_context=context) as pool:
        list(pool.map(_compile, jobs))
    elapsed = time.perf_counter() - start
    cache = os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache")
    print(f"compiled {len(jobs)} triton variants for profile {args.profile} in {elapsed:.1f} s "
          f"with {args.processes} processes into {cache}")
    return 0
