"""Checks of run-to-run determinism (docs/error-model.md, "Determinism of atomic dQ")."""

from __future__ import annotations

from fa2_verify.properties import relations
from fa2_verify.properties.determinism import bitwise, dq_spread_bound
from fa2_verify.verify.kernel_config import declared_block_k
from fa2_verify.properties.session import Suite
from fa2_verify.properties.verdicts import call_kernel, conclude, golden_of, introduce
from fa2_verify.core.case import CaseSpec


def reproducible(suite: Suite, spec: CaseSpec, outputs: tuple[str, ...], repeats: int) -> None:
    """``outputs`` (those the kernel provides) bitwise identical over ``1 + repeats`` calls on the same inputs."""
    outputs = tuple(name for name in outputs if name not in suite.kernel.capabilities.missing_outputs())
    statement = f"{', '.join(outputs)} bitwise identical across calls"
    introduce(suite, spec)
    case = suite.case(spec)
    runs = call_kernel(suite, spec, outputs[0], *([case] * (1 + repeats)))
    comparisons = [bitwise(name, runs[0][name], again[name]) for again in runs[1:] for name in outputs]
    conclude(suite, spec, statement, comparisons)


def dq_spread_bounded(suite: Suite, spec: CaseSpec, repeats: int) -> None:
    """``|dq_r - dq_0| <= spread bound`` (docs/error-model.md, "Determinism of atomic dQ") over repeated backward calls."""
    statement = "dq run-to-run spread within the atomic-accumulation bound"
    introduce(suite, spec)
    case = suite.case(spec)
    runs = call_kernel(suite, spec, "dq", *([case] * (1 + repeats)))
    dq_runs = [outputs["dq"] for outputs in runs]
    bound = dq_spread_bound(case, golden_of(suite, case), dq_runs, block_k=declared_block_k(suite.kernel.config()))
    comparisons = [relations.compare_runs("dq", dq_runs[0], dq, bound, threshold=1.0) for dq in dq_runs[1:]]
    conclude(suite, spec, statement, comparisons)
