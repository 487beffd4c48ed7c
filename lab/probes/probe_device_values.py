"""Where a case's inputs differ between the CPU and a GPU, per generator and dtype.

    python3 lab/probes/probe_device_values.py

For each value generator of core.values and each dtype: the float64 values drawn on each device
(values.generate) and the rounded inputs (make_case), the count of elements whose bits differ and
the largest difference in float64 ulps; then, for the first generator that differs, the draws of
core.counter_rng alone (uniform, normal, integers) on both devices.
"""

from __future__ import annotations

import torch

from fa2_verify.core import values
from fa2_verify.core.case import CaseSpec, make_case
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


def main() -> None:
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
