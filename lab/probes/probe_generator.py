"""One value generator against several kernels: does a correct kernel pass every case it draws?

``python3 lab/probes/probe_generator.py --generator score-plateau --kernels reference,torch-flash --device cpu
--cases 40`` draws ``--cases`` cases with that generator only (the ``ci`` profile's shapes and masks for
each kernel's capabilities, derandomized, forward and backward), checks each against the golden
(:func:`verify.check.check_case`, as ``fa2-verify repro`` does) and prints one Markdown row per kernel:
cases run, passed, failed, unsupported, the worst normalized error per output, and the reproduction of
each failure.  A new generator must pass every correct kernel before it joins the suite (a false alarm
is as serious as a miss); on a third-party kernel a failure is a finding, to narrow down with
lab/probes/probe_case_variants.py.  Exit status 0 when no case failed.
"""

from __future__ import annotations

import argparse
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fa2_verify.app.targets import resolve_target
from fa2_verify.core.case import make_case
from fa2_verify.core.errors import Fa2VerifyError
from fa2_verify.properties import cases, profiles
from fa2_verify.verify.check import check_case


def probe(kernel_name: str, generator: str, device: str, count: int, dtypes: tuple[str, ...] | None) -> tuple[str, int]:
    """The Markdown row of ``kernel_name`` on ``count`` cases of ``generator`` (in ``dtypes``, default every
    dtype the kernel has there), and its failures."""
    kernel = resolve_target(kernel_name, device)
    limits = profiles.get("ci").limits(device)
    tally = {"passed": 0, "failed": 0, "error": 0, "unsupported": 0}
    worst: dict[str, float] = {}
    failures: list[str] = []
    backward = kernel.capabilities.backward
    strategy = cases.case_specs(capabilities=kernel.capabilities, device=device, limits=limits,
                                generators=(generator,), dtypes=dtypes, backward=backward)  # fmt: skip

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.data())
    def run(data: st.DataObject) -> None:
        spec = data.draw(strategy)
        result = check_case(kernel, make_case(spec, device))
        tally[result.status] += 1
        for name, comparison in result.comparisons.items():
            worst[name] = max(worst.get(name, 0.0), comparison.normalized.quantiles["max"])
        if result.status in ("failed", "error"):
            failures.append(f"{result.status}: {result.reason or ''} {spec.reproduction(kernel_name, device)}")

    run()
    errors = ", ".join(f"{name} {value:.3g}" for name, value in sorted(worst.items()))
    row = (f"| `{kernel_name}` | {sum(tally.values())} | {tally['passed']} | {tally['failed'] + tally['error']} "
           f"| {tally['unsupported']} | {errors} |")  # fmt: skip
    return "\n".join([row, *(f"  - {failure}" for failure in failures)]), len(failures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generator", required=True, help="a name of core.values.GENERATORS")
    parser.add_argument("--kernels", required=True, help="comma-separated kernel names (bundled or module:attr)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", type=int, default=40, help="cases per kernel (default 40)")
    parser.add_argument("--dtypes", help="comma-separated dtypes to draw (default: every dtype the kernel has)")
    args = parser.parse_args(argv)
    print(f"generator `{args.generator}`, {args.cases} cases per kernel on {args.device}\n")
    print("| kernel | cases | passed | failed | unsupported | worst normalized error |\n|---|---:|---:|---:|---:|---|")
    failed = 0
    for name in args.kernels.split(","):
        try:
            dtypes = tuple(args.dtypes.split(",")) if args.dtypes else None
            row, failures = probe(name, args.generator, args.device, args.cases, dtypes)
        except Fa2VerifyError as exc:
            row, failures = f"| `{name}` | - | - | - | - | {exc} |", 0
        print(row, flush=True)
        failed += failures
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
