"""Probe: the signed lean of out's error (noise units x sign of the golden) per head, for planted (1+eps)
head scalings and the correct kernel, with the model's per-row P-rounding scale errors (CPU)."""
import sys
import torch
from benchmarks import sensitivity
from fa2_verify.verify import noise_verdicts
from fa2_verify.app.targets import load_target

length, dtype, generator = int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "normal"
config = sensitivity.Config(length, dtype, False)
import dataclasses
spec = dataclasses.replace(config.spec(512), generator=generator)
s = sensitivity.Setting(load_target("reference"), spec, "cpu")
judge = s.judge
def lean(actual):
    r, r_model, unit = noise_verdicts.noise_units(spec, "out", actual, s.golden.out, judge.model["out"], judge.bounds["out"])
    e = noise_verdicts._canonical("out", s.golden.out)
    a = noise_verdicts._canonical("out", actual.double())
    m = noise_verdicts._canonical("out", judge.model["out"].double())
    lk = torch.where(torch.isfinite(r), (a - e) / unit * torch.sign(e), 0.0)
    lm = (m - e) / unit * torch.sign(e)
    out = []
    for l in (lk, lm):
        rows = l.sum(-1)  # (b, h, t)
        mean = rows.sum(-1) / (l.shape[-1] * l.shape[-2])
        z = rows.sum(-1) / rows.square().sum(-1).sqrt()
        out.append((mean.flatten().tolist(), z.flatten().tolist()))
    return out
print("correct", lean(s.correct["out"]))
for size, changed in s.scaled_head():
    print(f"eps 2^{size and __import__('math').log2(size):.0f}", lean(changed["out"])[0])
