"""Runs that several front ends make: a case set announced case by case (``run``, ``race``), one case in
full (``repro``), and the golden options of a command-line run (``baseline``, ``gate``, ``bench``).

Before each case of a set, ``fa2-verify: running case I of N: NAME`` goes to
stderr (:func:`announce`), so a kernel that kills the process leaves the case
it was on as the last line.  With a sanitizer timeout, a case that faulted
the device is run again under compute-sanitizer (:mod:`verify.sanitizer`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import sys
from typing import Sequence

from fa2_verify.app.cases.sets import case_label
from fa2_verify.core.case import CaseSpec
from fa2_verify.golden.options import GoldenOptions, shared_cache_dir
from fa2_verify.verify.check import check_spec, run_cases
from fa2_verify.verify.interpreter_bounds import bounds_checked
from fa2_verify.verify.memory import require_fits
from fa2_verify.verify.registry import LoadedKernel
from fa2_verify.verify.results import CaseResult, RunResult
from fa2_verify.verify.sanitizer import sanitized


def announce(index: int, total: int, spec: CaseSpec) -> None:
    """``fa2-verify: running case I of N: NAME`` on stderr, flushed before the case runs."""
    print(f"fa2-verify: running case {index + 1} of {total}: {case_label(spec)}", file=sys.stderr, flush=True)


def golden_options(cache_dir: pathlib.Path | None = None) -> GoldenOptions:
    """Golden options with the cache ``cache_dir`` (``--golden-cache``), else ``$FA2_VERIFY_GOLDEN_CACHE``,
    else ``./.fa2-golden-cache``: the commands, and later runs, share one golden per case."""
    return GoldenOptions(cache_dir=cache_dir or shared_cache_dir(pathlib.Path()))


def run_set(kernel: LoadedKernel, specs: Sequence[CaseSpec], device: str, *, max_golden_seconds: float | None,
            bounds_check: bool = False, sanitize_timeout: float | None = None) -> RunResult:
    """Every case of ``specs`` through the kernel (:func:`verify.check.run_cases`), each announced first;
    bounds-checked under the Triton interpreter with ``bounds_check``; with ``sanitize_timeout``, each case
    that faulted the device run again under compute-sanitizer for at most that long."""
    with bounds_checked() if bounds_check else contextlib.nullcontext():
        run = run_cases(kernel, specs, device, starting=lambda index, spec: announce(index, len(specs), spec),
                        max_golden_seconds=max_golden_seconds)
    if sanitize_timeout is not None:
        run = dataclasses.replace(run, cases=sanitized(run.cases, kernel.name, device, timeout=sanitize_timeout))
    return run


def check_one(kernel: LoadedKernel, spec: CaseSpec, device: str, *, max_golden_seconds: float | None,
              sanitize_timeout: float | None = None) -> list[CaseResult]:
    """One case spec (a packed batch: one result per sequence, :func:`verify.check.check_spec`), refused
    before anything is allocated when it does not fit (:func:`verify.memory.require_fits`); with
    ``sanitize_timeout``, run again under compute-sanitizer if it faulted the device."""
    require_fits(spec, device, max_golden_seconds=max_golden_seconds)
    results = check_spec(kernel, spec, device)
    if sanitize_timeout is not None:
        results = sanitized(results, kernel.name, device, spec.to_dict(), timeout=sanitize_timeout)
    return results
