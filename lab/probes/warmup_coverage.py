"""How many of the compile keys a suite-like draw needs ``fa2-verify warmup`` compiles, without a GPU.

    python -m lab.probes.warmup_coverage --profile ci --examples 400 --suite-examples 20 --seeds 0 1

The warm-up enumerates ``--examples`` derandomized draws of each property's
case strategy (:func:`properties.draws.profile_cases`) and compiles their
keys (:mod:`kernels.triton_fa2.variants`, ``sm90`` table).  A suite run draws
its own cases, about ``--suite-examples`` per strategy per dtype shard, from
its seed; this draws that many with each seed of ``--seeds`` and prints how
many of their keys the warm-up's set lacks (those the suite would still
compile).  A sample, not the suite itself: Hypothesis in a property also
shrinks and replays.  Runs on the CPU with Triton installed and
``TRITON_INTERPRET`` unset.
"""

from __future__ import annotations

import argparse

from fa2_verify.kernels.triton_fa2 import variants
from fa2_verify.properties import profiles
from fa2_verify.properties.draws import profile_cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", choices=list(profiles.PROFILES), help="profile (default: ci)")
    parser.add_argument("--examples", type=int, default=400, help="warm-up draws per strategy (default: 400)")
    parser.add_argument("--suite-examples", type=int, default=20, help="suite-like draws per strategy (default: 20)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds of the suite-like draws")
    parser.add_argument("--target", default=variants.DEFAULT_TARGET, help="tile table (default: sm90)")
    args = parser.parse_args(argv)
    enumerated = set(variants.variants_of(profile_cases(args.profile, args.examples), args.target))
    print(f"warm-up, {args.examples} derandomized draws per strategy: {len(enumerated)} keys")
    for seed in args.seeds:
        needed = set(variants.variants_of(profile_cases(args.profile, args.suite_examples, seed), args.target))
        missing = len(needed - enumerated)
        print(f"seed {seed}, {args.suite_examples} draws per strategy: {len(needed)} keys, {missing} not warmed up "
              f"({100 * (len(needed) - missing) / max(len(needed), 1):.0f}% covered)")


if __name__ == "__main__":
    main()
