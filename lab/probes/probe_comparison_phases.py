"""Where the comparison phase's seconds go, sub-step by sub-step, on one device (the comparison's profile).

    python lab/probes/probe_comparison_phases.py --device cuda --shapes 1x16x16384x128 1x1x131072x128c \
        1x32/4x16384x256c 1x4x4097:65537x128 1x4x65537x128w4096 --dtype bfloat16
    python lab/probes/probe_comparison_phases.py --scale-set --threads 1

A shape is ``BxHxSxD`` (``H`` may be ``Hq/Hkv``, ``S`` may be ``Sq:Sk``; a
trailing ``c`` is causal, ``wN`` a left window of ``N``); ``--scale-set``
takes the scale set of ``--device`` instead (``app.cases.scale``).  Per case,
forward and backward, the kernel (``--kernel``, default ``reference``) runs
and the golden is computed untimed; then the sub-steps of
:class:`verify.check.OutputJudge` are timed, each synchronised: the error
model's bounds with a bfloat16 case's flush shares (``flush_shares``, a second
pass of the error model, in a tree from before they shared its pass), the
naive low-precision attention, the model kernel, and per
output :func:`verify.metrics.compare` and :func:`verify.noise_verdicts.judge`
(summed over outputs), and the whole comparison end to end
(:func:`verify.check.compare_outputs`).  ``--profile`` prints cProfile's top
functions of one end-to-end comparison, ``--cuda-profile`` its top CUDA
operators by device time (launch-bound or compute-bound).  ``--cases`` keeps
only the named cases of ``--scale-set``.  One JSON line per case.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats

import torch
from synced import timed

from fa2_verify.app.cases.scale import SCALE_CASES
from fa2_verify.app.targets import load_target
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.verify import check, error_model, lowprec, metrics, model_kernel, noise_verdicts
from fa2_verify.verify.kernel_call import run_case


def _spec(shape: str, dtype: str) -> CaseSpec:
    causal, window = shape.endswith("c"), (-1, -1)
    shape = shape.rstrip("c")
    if "w" in shape:
        shape, _, left = shape.partition("w")
        window = (int(left), 0)
    b, h, s, d = shape.split("x")
    hq, _, hkv = h.partition("/")
    sq, _, sk = s.partition(":")
    return CaseSpec(batch=int(b), seqlen_q=int(sq), seqlen_k=int(sk or sq), heads_q=int(hq), heads_kv=int(hkv or hq),
                    head_dim=int(d), dtype=dtype, causal=causal, window_size=window, generator="boundary-keys",
                    seed=0, backward=True, name=shape)


def probe(kernel, spec: CaseSpec, device: str, profile: bool, cuda_profile: bool) -> dict:
    case = make_case(spec, device)
    actual = run_case(kernel, case)
    golden = check.golden_for(case)
    partials = check.partial_sums_of(kernel, case)
    timings: dict[str, float] = {}
    judged = noise_verdicts.judged_outputs(spec, partials)
    flush = bool(judged) and noise_verdicts.flush_matters(spec.torch_dtype)
    if hasattr(error_model, "bounds_and_flush_shares"):  # the shares made in the bounds' pass
        (bounds, shares), timings["bounds"] = timed(device, error_model.bounds_and_flush_shares, case, golden,
                                                    partials, flush_shares=flush)
    else:  # a tree from before: the shares are a second pass of the error model
        bounds, timings["bounds"] = timed(device, error_model.first_order_bounds, case, golden, partials)
        shares, timings["flush_shares"] = (timed(device, error_model.first_order_bounds, case, golden, partials,
                                                 flush_only=True) if flush else ({}, 0.0))
    naive, timings["naive_attention"] = timed(device, lowprec.naive_attention, case)
    model, timings["model_attention"] = timed(device, model_kernel.model_attention, case, actual)
    timings["compare"] = timings["judge"] = 0.0
    for name, tensor in actual.items():
        expected = getattr(golden, name)
        _, seconds = timed(device, metrics.compare, name, tensor, expected, bounds[name],
                            threshold=error_model.THRESHOLDS[name], lowprec=naive.get(name))
        timings["compare"] += seconds
        if name in judged:
            _, seconds = timed(device, noise_verdicts.judge, spec, name, tensor, expected, bounds[name], model,
                               shares.get(name))
            timings["judge"] += seconds
    del bounds, naive, model
    comparisons, timings["end to end"] = timed(device, check.compare_outputs, kernel, case, actual, golden)
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(check.compare_outputs, kernel, case, actual, golden)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    if cuda_profile and device == "cuda":
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            check.compare_outputs(kernel, case, actual, golden)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=50), flush=True)
    return {"case": spec.name, "dtype": spec.dtype, "seconds": {n: round(t, 3) for n, t in timings.items()},
            "passed": all(c.passed for c in comparisons.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kernel", default="reference")
    parser.add_argument("--shapes", nargs="*", default=[])
    parser.add_argument("--scale-set", action="store_true")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    parser.add_argument("--cases", nargs="*", default=[], help="with --scale-set: only these case names")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--cuda-profile", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    kernel = load_target(args.kernel)
    specs = [_spec(shape, args.dtype) for shape in args.shapes]
    if args.scale_set:
        specs += [spec for spec in SCALE_CASES[torch.device(args.device).type]
                  if not args.cases or spec.name in args.cases]
    for spec in specs:
        print(json.dumps(probe(kernel, spec, args.device, args.profile, args.cuda_profile)), flush=True)


if __name__ == "__main__":
    main()
