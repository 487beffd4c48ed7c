"""Largest scores of the statistical, local and bias verdicts for kernels over CPU cases (a development probe).

python -m lab.probes.probe_noise_verdicts KERNEL[,KERNEL...] [--generators G,G] [SEQLEN ...]

A kernel is a registry name or ``module:attribute`` (e.g. ``tests.variants:P_FP32``).  For each kernel it
prints, per case, the status and for each output ``worst-case max / statistical / local / bias score``
(``nan`` where a verdict does not apply), then the kernel's largest score of each verdict.  Default
generators: every registered one.
"""
import math
import sys

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.values import GENERATORS
from fa2_verify.verify.check import check_spec
from fa2_verify.app.targets import load_target

args = sys.argv[1:]
generators = list(GENERATORS)
if "--generators" in args:
    at = args.index("--generators")
    generators = args[at + 1].split(",")
    del args[at:at + 2]
lengths = [int(n) for n in args[1:]] or [200]
for name in args[0].split(","):
    kernel = load_target(name)
    largest = {"statistical": 0.0, "local": 0.0, "bias": 0.0}
    for dtype in ("float16", "bfloat16"):
        for n in lengths:
            for causal in (False, True):
                for generator in generators:
                    spec = CaseSpec(batch=2, seqlen_q=n, seqlen_k=n + 7, heads_q=4, heads_kv=2, head_dim=64,
                                    dtype=dtype, causal=causal, generator=generator, seed=n)
                    for result in check_spec(kernel, spec, "cpu"):
                        row = [result.status]
                        for output, c in result.comparisons.items():
                            scores = []
                            for verdict in largest:
                                record = getattr(c, verdict)
                                score = record["score"] if record else math.nan
                                scores.append(f"{score:.3g}")
                                if record:
                                    largest[verdict] = max(largest[verdict], score)
                            row.append(f"{output}:{c.normalized.quantiles['max']:.3g}/" + "/".join(scores))
                        print(name, dtype, n, causal, generator, *row, flush=True)
    print(name, "largest", largest, flush=True)
