"""Where the golden's seconds go, phase by phase, on one device (issue 30's profile).

    python lab/probes/probe_golden_phases.py --device cuda --shapes 1x16x16384x128 1x1x131072x128c 1x32/4x16384x256c

A shape is ``BxHxSxD`` (``H`` may be ``Hq/Hkv``; a trailing ``c`` is causal).
Per shape, forward and backward, float16 (bfloat16 with ``--dtype``):
``prepare`` (validation, float64 head-major copies), ``key`` (the inputs'
fingerprint that seeds the certification's rows), the float64 pass
(:func:`golden.fast.attention`), the certification
(:func:`golden.certify.certify`), each synchronised; with ``--profile`` the
float64 pass's top CUDA operators by time; with ``--cache`` the golden
cache's costs for the shape's entry (:mod:`golden.cache`: the key, which
hashes the inputs on the host, a store and a load, in a temporary
directory) and the entry's megabytes.  ``--block-overhead N ...`` times
the float64 pass again with each ``core.row_blocks.OVERHEAD_ELEMENTS`` of
the device (its block planner's tuning).  ``--cases NAME ...`` takes named
cases of the scale set of ``--device`` (``app.cases.scale``, their own
inputs) instead of shapes, and splits the certification into its steps
(the finiteness check, the double-double query and key rows, the check
against mpmath; ``--profile`` then prints the certification's CUDA
operators).  Prints one JSON line per shape or case.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import pathlib
import tempfile

import torch
from synced import timed

from fa2_verify import golden
from fa2_verify.app.cases.scale import SCALE_CASES
from fa2_verify.core import row_blocks
from fa2_verify.core.case import make_case
from fa2_verify.golden import api, cache, certify, fast, inputs

#: The certification's steps timed by ``--cases`` (functions of :mod:`golden.certify`).
CERTIFY_STEPS = ("_require_finite", "_query_batch", "_key_batch", "_check_reference")


def _parse(shape: str) -> dict:
    causal = shape.endswith("c")
    b, h, s, d = shape.rstrip("c").split("x")
    hq, _, hkv = h.partition("/")
    return {"batch": int(b), "heads_q": int(hq), "heads_kv": int(hkv or hq), "seqlen": int(s), "head_dim": int(d),
            "causal": causal}


def _cache_seconds(device: str, problem, served, bounds, options) -> dict[str, float]:
    """Seconds of the golden cache's key, store and load for this golden's entry."""
    shapes = api._shapes(problem)
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory:
        key, seconds["cache key"] = timed(device, api._key, problem, options, "fast")

        def store() -> None:
            arrays = {name: getattr(served, name).cpu().numpy() for name in shapes}
            cache.store(pathlib.Path(directory), key, arrays, {"method": "fast", "certified_bound": bounds})

        _, seconds["cache store"] = timed(device, store)
        _, seconds["cache load"] = timed(device, cache.load, pathlib.Path(directory), key, shapes)
    return seconds


@contextlib.contextmanager
def _steps_timed(device: str, seconds: collections.Counter):
    """Charge each call of :data:`CERTIFY_STEPS` (synchronised) to ``seconds[step]``, for the duration."""
    originals = {name: getattr(certify, name) for name in CERTIFY_STEPS}

    def wrapper(name, function):
        def call(*args, **kwargs):
            result, spent = timed(device, function, *args, **kwargs)
            seconds[f"certify {name.strip('_')}"] += spent
            return result
        return call

    for name, function in originals.items():
        setattr(certify, name, wrapper(name, function))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(certify, name, function)


def _case_phases(device: str, name: str, profile: bool) -> None:
    """The golden's phases on scale case ``name`` of ``device``, the certification split into its steps."""
    spec = next(spec for spec in SCALE_CASES[torch.device(device).type] if spec.name == name)
    case = make_case(spec, device)
    timings: dict[str, float] = {}
    problem, timings["prepare"] = timed(
        device, inputs.prepare, case.q, case.k, case.v, case.dout if spec.backward else None,
        softmax_scale=spec.scale, causal=spec.causal, window_size=spec.window_size, alignment=spec.causal_alignment,
    )
    options = golden.GoldenOptions(method="fast")
    seed, timings["fingerprint"] = timed(device, inputs.fingerprint, problem)
    if cache.fits(api._shapes(problem), problem.device.type):
        _, timings["cache key"] = timed(device, api._key, problem, options, "fast")
    served, timings["float64 pass"] = timed(device, fast.attention, problem)
    steps: collections.Counter = collections.Counter()
    with _steps_timed(device, steps):
        bounds, timings["certification"] = timed(device, certify.certify, problem, served,
                                                 rows=options.certify_rows, precision_bits=113, seed=seed)
    timings.update(steps)
    timings["certify sampling and rest"] = timings["certification"] - sum(steps.values())
    print(json.dumps({"case": name, "seconds": {n: round(t, 3) for n, t in timings.items()},
                      "certified_bound": bounds}), flush=True)
    if profile and device == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            certify.certify(problem, served, rows=options.certify_rows, precision_bits=113, seed=seed)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", nargs="+", default=["1x1x2048x128"])
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--cache", action="store_true")
    parser.add_argument("--block-overhead", nargs="*", type=int, default=[])
    parser.add_argument("--cases", nargs="*", default=[])
    args = parser.parse_args()
    for name in args.cases:
        _case_phases(args.device, name, args.profile)
    if args.cases:
        return
    for shape in args.shapes:
        spec = _parse(shape)
        generator = torch.Generator().manual_seed(0)
        dtype = getattr(torch, args.dtype)
        q_shape = (spec["batch"], spec["seqlen"], spec["heads_q"], spec["head_dim"])
        kv_shape = (spec["batch"], spec["seqlen"], spec["heads_kv"], spec["head_dim"])
        q, dout = (torch.randn(*q_shape, generator=generator).to(dtype).to(args.device) for _ in range(2))
        k, v = (torch.randn(*kv_shape, generator=generator).to(dtype).to(args.device) for _ in range(2))
        scale = spec["head_dim"] ** -0.5
        timings: dict[str, float] = {}
        problem, timings["prepare"] = timed(
            args.device, inputs.prepare, q, k, v, dout, softmax_scale=scale, causal=spec["causal"], window_size=(-1, -1)
        )
        options = golden.GoldenOptions(method="fast")
        if hasattr(inputs, "fingerprint"):
            seed, timings["key"] = timed(args.device, inputs.fingerprint, problem)
        else:  # a golden from before the fingerprint (--before sides): its seed was the cache key's sha256
            key, timings["key"] = timed(args.device, api._key, problem, options, "fast")
            seed = int(key[:16], 16)
        served, timings["float64 pass"] = timed(args.device, fast.attention, problem)
        bounds, timings["certification"] = timed(
            args.device, certify.certify, problem, served, rows=options.certify_rows, precision_bits=113,
            seed=seed,
        )
        _, timings["end to end"] = timed(
            args.device, golden.compute, q, k, v, dout, softmax_scale=scale, causal=spec["causal"], options=options
        )
        if args.cache:
            timings.update(_cache_seconds(args.device, problem, served, bounds, options))
        for overhead in args.block_overhead:
            row_blocks.OVERHEAD_ELEMENTS[torch.device(args.device).type] = overhead
            _, timings[f"float64 pass, overhead {overhead}"] = timed(args.device, fast.attention, problem)
        line = {"shape": shape, "dtype": args.dtype, "seconds": {n: round(t, 3) for n, t in timings.items()},
                "certified_bound": bounds}
        if args.cache:
            line["entry MiB"] = sum(8 * torch.Size(s).numel() for s in api._shapes(problem).values()) / 2**20
        if args.profile and args.device == "cuda":
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                fast.attention(problem)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60)
            print(table, flush=True)
        print(json.dumps(line), flush=True)
        del problem, served


if __name__ == "__main__":
    main()
