"""Count the compiled variants of the ``triton`` kernel that a property profile needs, per kernel, without a GPU.

Draws the cases the profile draws on a GPU (``fa2-verify warmup``'s
enumeration, :func:`properties.draws.profile_cases`: every property's case
strategy with the profile's GPU limits, derandomized, ``--examples`` draws
each) and reduces their launches on an H100/H200 (tile table ``sm90``) to
Triton's compile keys (:mod:`kernels.triton_fa2.variants`).  Runs on the
CPU with Triton installed and ``TRITON_INTERPRET`` unset::

    python -m lab.probes.count_variants --profile ci --examples 400
"""

from __future__ import annotations

import argparse

from fa2_verify.kernels.triton_fa2 import variants
from fa2_verify.properties import profiles
from fa2_verify.properties.draws import profile_cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="append", choices=list(profiles.PROFILES),
                        help="profile to count (repeatable; default: ci and dev)")
    parser.add_argument("--examples", type=int, default=400, help="draws of each case strategy (default: 400)")
    parser.add_argument("--target", default=variants.DEFAULT_TARGET, help="tile table (default: sm90)")
    args = parser.parse_args(argv)
    print(f"| profile | cases | {' | '.join(variants.KERNELS)} | total |")
    print(f"|---|---:|{'---:|' * (len(variants.KERNELS) + 1)}")
    for name in args.profile or ["ci", "dev"]:
        cases = profile_cases(name, args.examples)
        keys = variants.variants_of(cases, args.target)
        counts = variants.per_kernel(keys)
        cells = " | ".join(str(counts[kernel]) for kernel in variants.KERNELS)
        print(f"| {name} | {len(cases)} | {cells} | {len(keys)} |")


if __name__ == "__main__":
    main()
