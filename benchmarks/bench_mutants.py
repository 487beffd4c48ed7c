"""How fast the property suite catches each mutant kernel of ``tests/mutants.py``.

For every mutant, the property tests run in suite order under the ``ci``
profile (derandomized, so the table is the same on every run) without
shrinking, each stopping at its first failing example; the first property
that fails catches the mutant.  The table gives that property, the examples
its search took, and the seconds spent on the mutant in all (including the
properties that ran to their budget without failing).  Each mutant starts
with an empty golden cache, so its seconds include computing every golden it
needed; imports and first-call warm-up happen once, before the table.  Usage,
from the repository root::

    python -m benchmarks.bench_mutants [--profile ci] [--mutants NAME,...]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

from fa2_verify.golden.options import GoldenOptions
from fa2_verify.properties import harness, profiles
from fa2_verify.properties.session import Suite
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.verify.check import check_case
from fa2_verify.app.targets import load_target
from fa2_verify.verify.registry import LoadedKernel

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]

#: A small case run once before timing, so imports and first calls are not charged to a mutant.
WARM_UP = CaseSpec(batch=1, seqlen_q=17, seqlen_k=17, heads_q=2, heads_kv=1, head_dim=16, dtype="float16")


def catch(name: str, target: object, profile: profiles.Profile) -> tuple[str, int, float]:
    """``(catching property or "", examples it took, seconds for the mutant)``, from an empty golden cache."""
    settings = harness.catch_settings(profile)
    with tempfile.TemporaryDirectory() as cache:
        options = GoldenOptions(cache_dir=pathlib.Path(cache))
        suite = Suite(LoadedKernel(f"tests.mutants:{name}", target), "cpu", profile, options)
        start = time.perf_counter()
        for prop in harness.declared_properties():
            result = harness.search(prop, suite, settings)
            if result.caught:
                return result.test, result.examples, time.perf_counter() - start
        return "", 0, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", choices=list(profiles.PROFILES))
    parser.add_argument("--mutants", default="", help="comma-separated names (default: all)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPOSITORY))
    from tests.mutants import MUTANTS

    names = [name for name in args.mutants.split(",") if name] or list(MUTANTS)
    profile = profiles.get(args.profile)
    check_case(load_target("reference"), make_case(WARM_UP))
    print("| mutant | caught by | examples | seconds |")
    print("| --- | --- | ---: | ---: |")
    missed = 0
    for name in names:
        test, examples, seconds = catch(name, MUTANTS[name], profile)
        missed += not test
        print(f"| {name} | {test or 'NOT CAUGHT'} | {examples} | {seconds:.1f} |", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
