"""The fast golden's float64 pass with :mod:`golden.passes` beside the torch evaluation, on one device.

    python lab/probes/probe_golden_passes.py --device cuda --cases s131072-causal-bf16 s16384-none-fp16 --profile
    python lab/probes/probe_golden_passes.py --device cuda --shapes 1x1x131072x128c 1x32/4x16384x256c

``--cases`` takes named cases of the scale set of ``--device`` (``app.cases.scale``, their own inputs);
``--shapes`` normal inputs of ``BxHxSxD`` (``H`` may be ``Hq/Hkv``, a trailing ``c`` causal), bfloat16 unless
``--dtype``.  Per problem, :func:`golden.fast.attention` with ``fused=False`` and ``fused=True``, each timed
(synchronised, the faster of two after a first call), their largest difference per output (relative to the
output's largest magnitude), and the certified bounds of the fused result; ``--profile`` prints the fused pass's
top CUDA operators.  One JSON line per problem.
"""

from __future__ import annotations

import argparse
import json

import torch
from synced import timed

from fa2_verify.app.cases.scale import SCALE_CASES
from fa2_verify.core.case import make_case
from fa2_verify.golden import certify, fast, inputs


def _shape_problem(shape: str, dtype: torch.dtype, device: str):
    causal = shape.endswith("c")
    b, h, s, d = shape.rstrip("c").split("x")
    heads_q, _, heads_kv = h.partition("/")
    generator = torch.Generator().manual_seed(1)
    q, dout = (torch.randn(int(b), int(s), int(heads_q), int(d), generator=generator).to(dtype).to(device)
               for _ in range(2))
    k, v = (torch.randn(int(b), int(s), int(heads_kv or heads_q), int(d), generator=generator).to(dtype).to(device)
            for _ in range(2))
    return inputs.prepare(q, k, v, dout, softmax_scale=int(d) ** -0.5, causal=causal, window_size=(-1, -1))


def _case_problem(name: str, device: str):
    spec = next(spec for spec in SCALE_CASES[torch.device(device).type] if spec.name == name)
    case = make_case(spec, device)
    return inputs.prepare(case.q, case.k, case.v, case.dout if spec.backward else None, softmax_scale=spec.scale,
                          causal=spec.causal, window_size=spec.window_size, alignment=spec.causal_alignment)


def _differences(fused, plain) -> dict[str, float]:
    differences = {}
    for name in ("out", "lse", "delta", "dq", "dk", "dv"):
        a, b = getattr(fused, name), getattr(plain, name)
        if b is None:
            continue
        finite = torch.isfinite(b)
        assert torch.equal(finite, torch.isfinite(a)), name
        scale = float(b[finite].abs().max()) or 1.0
        differences[name] = float((a[finite] - b[finite]).abs().max()) / scale
    return differences


def probe(name: str, problem, device: str, profile: bool) -> dict:
    results, seconds = {}, {}
    for fused in (False, True):
        results[fused] = fast.attention(problem, fused=fused)
        seconds["fused" if fused else "torch"] = round(
            min(timed(device, fast.attention, problem, fused=fused)[1] for _ in range(2)), 3)
    if profile and device == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fast.attention(problem, fused=True)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=50),
              flush=True)
    return {"problem": name, "float64 pass s": seconds, "pivots equal": bool(torch.equal(results[True].pivot,
                                                                                          results[False].pivot)),
            "relative differences": _differences(results[True], results[False]),
            "certified": certify.certify(problem, results[True], rows=16, precision_bits=113,
                                         seed=inputs.fingerprint(problem))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", nargs="*", default=[])
    parser.add_argument("--shapes", nargs="*", default=[])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    problems = [(name, lambda name=name: _case_problem(name, args.device)) for name in args.cases]
    problems += [(shape, lambda shape=shape: _shape_problem(shape, getattr(torch, args.dtype), args.device))
                 for shape in args.shapes]
    for name, make in problems:
        print(json.dumps(probe(name, make(), args.device, args.profile)), flush=True)


if __name__ == "__main__":
    main()
