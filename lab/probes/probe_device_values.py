"""Where a case's inputs differ between the CPU and a GPU, per generator and dtype.

    python3 lab/probes/probe_device_values.py [--steps]

For each value generator of core.values and each dtype: the float64 values drawn on each device
(values.generate) and the rounded inputs (make_case), the count of elements whose bits differ and
the largest difference in float64 ulps; then, for the first generator that differs, the draws of
core.counter_rng alone (uniform, normal, integers) on both devices.
"""

from __future__ import annotations

import math
import sys

import torch

from fa2_verify.core import values
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core import counter_rng
from fa2_verify.core.counter_rng import CounterRNG


def differing(host: torch.Tensor, device: torch.Tensor) -> tuple[int, float]:
    device = device.cpu()
    if host.dtype == torch.float64:
        bits_host, bits_device = host.view(torch.int64), device.view(torch.int64)
    else:
        bits_host, bits_device = host.view(torch.int16 if host.element_size() == 2 else torch.int32), device.view(
            torch.int16 if host.element_size() == 2 else torch.int32)
    count = int((bits_host != bits_device).sum())
    ulps = float(((host.double() - device.double()).abs() / torch.finfo(torch.float64).eps
                  / host.double().abs().clamp_min(1e-300)).max()) if count else 0.0
    return count, ulps


def steps() -> None:
    """Each operation of the normal draw on the CPU and CUDA from the same 53-bit fractions."""
    words = counter_rng.philox(torch.stack([torch.arange(1 << 20), torch.zeros(1 << 20, dtype=torch.int64),
                                            torch.full((1 << 20,), 3), torch.zeros(1 << 20, dtype=torch.int64)], -1), (7, 9))
    fraction = counter_rng.CounterRNG._fraction

    def trace(device: str) -> dict[str, torch.Tensor]:
        w0, w1, w2, w3 = words.to(device).unbind(-1)
        t: dict[str, torch.Tensor] = {"u1": fraction(w0, w1) + 2.0**-53, "u2": fraction(w2, w3)}
        bits = t["u1"].view(torch.int64)
        exponent = ((bits >> 52) & 0x7FF) - 1023
        mantissa = ((bits & ((1 << 52) - 1)) | (1023 << 52)).view(torch.float64)
        high = mantissa > math.sqrt(2.0)
        t["mantissa"] = torch.where(high, mantissa * 0.5, mantissa)
        exponent = exponent + high.to(torch.int64)
        t["numerator"] = t["mantissa"] - 1.0
        t["denominator"] = t["mantissa"] + 1.0
        t["s"] = t["numerator"] / t["denominator"]
        t["s2"] = t["s"] * t["s"]
        t["series"] = counter_rng._horner(counter_rng._ATANH_COEFFICIENTS, t["s2"])
        t["e_ln2"] = exponent.to(torch.float64) * math.log(2.0)
        t["two_s"] = 2.0 * t["s"]
        t["two_s_series"] = t["two_s"] * t["series"]
        t["log"] = t["e_ln2"] + t["two_s_series"]
        t["log_function"] = counter_rng._log(t["u1"])
        t["minus_2_log"] = t["log"] * -2.0
        t["torch_sqrt"] = torch.sqrt(t["minus_2_log"])
        t["radius"] = counter_rng._sqrt(t["minus_2_log"])
        t["cos"], t["sin"] = counter_rng._cos_sin(t["u2"])
        t["z0"] = t["radius"] * t["cos"]
        return t

    host, device = trace("cpu"), trace("cuda")
    for name in host:
        print(f"{name:14s} differing elements {differing(host[name], device[name])}")


def main() -> None:
    if "--steps" in sys.argv:
        steps()
        return
    for name in sorted(values.GENERATORS):
        for dtype in ("float16", "bfloat16", "float32", "float64"):
            spec = CaseSpec(batch=2, seqlen_q=300, seqlen_k=1100, heads_q=6, heads_kv=2, head_dim=72, dtype=dtype,
                            generator=name, seed=11, causal=True)
            raw = [differing(h, d) for h, d in zip(values.generate(spec, "cpu"), values.generate(spec, "cuda"))]
            host, device = make_case(spec, "cpu"), make_case(spec, "cuda")
            rounded = [differing(getattr(host, t), getattr(device, t)) for t in ("q", "k", "v", "dout")]
            if any(count for count, _ in raw + rounded):
                print(f"{name:18s} {dtype:9s} float64 (count, rel ulps) {raw}  rounded {rounded}")
    for draw in ("uniform", "normal"):
        a = getattr(CounterRNG(3, "cpu"), draw)((1_000_003,))
        b = getattr(CounterRNG(3, "cuda"), draw)((1_000_003,))
        print(draw, differing(a, b))
    a, b = CounterRNG(3, "cpu").integers(1000, (100_001,)), CounterRNG(3, "cuda").integers(1000, (100_001,))
    print("integers", int((a != b.cpu()).sum()))


if __name__ == "__main__":
    main()
