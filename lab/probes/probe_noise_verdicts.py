"""Largest scores of the statistical and local verdicts for kernels over a few CPU cases (a development probe).

python -m lab.probes.probe_noise_verdicts KERNEL[,KERNEL...] [SEQLEN ...]

A kernel is a registry name or ``module:attribute`` (e.g. ``tests.variants:P_FP32``).  For each kernel it
prints, per case, the status and for each output ``worst-case max / statistical score / local score``.
"""
import sys

from fa2_verify.core.case import CaseSpec
from fa2_verify.verify.check import check_spec
from fa2_verify.verify.registry import load_kernel

lengths = [int(n) for n in sys.argv[2:]] or [200]
for name in sys.argv[1].split(","):
    kernel = load_kernel(name)
    for dtype in ("float16", "bfloat16"):
        for n in lengths:
            for causal in (False, True):
                for generator in ("normal", "score-plateau", "far-below-zero"):
                    spec = CaseSpec(batch=2, seqlen_q=n, seqlen_k=n + 7, heads_q=4, heads_kv=2, head_dim=64,
                                    dtype=dtype, causal=causal, generator=generator, seed=n)
                    for result in check_spec(kernel, spec, "cpu"):
                        row = [result.status]
                        for output, c in result.comparisons.items():
                            s = c.statistical["score"] if c.statistical else float("nan")
                            l = c.local["score"] if c.local else float("nan")
                            row.append(f"{output}:{c.normalized.quantiles['max']:.3g}/{s:.3g}/{l:.3g}")
                        print(name, dtype, n, causal, generator, *row, flush=True)
