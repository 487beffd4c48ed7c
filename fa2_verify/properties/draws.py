"""The cases the property suite draws, enumerated outside pytest from the properties themselves.

``fa2-verify warmup`` compiles ahead of the suite the kernel variants its
cases need, so it must draw what the properties draw.  Rather than a copy of
their case strategies, each declared property (:func:`properties.harness.declared_properties`)
runs here as Hypothesis runs it, against a stand-in suite (:class:`_Drawing`)
that draws from the same strategies (:func:`properties.cases.case_specs`,
:func:`properties.varlen.varlen_specs`) and stops the property where its check
announces the case it runs (:meth:`properties.session.Suite.running`), before
any kernel call.  What the property does to its draw before that (a causal
mask, a window) is in the case recorded; so is a layout it draws
(``label="layout"``).

From each recorded case :func:`drawn_cases` lists what the kernel runs: the
case contiguous, in the drawn layout too (one of :data:`core.layouts.LAYOUTS`;
a joint layout is left to the suite), and as MHA with K and V repeated when
the property needs GQA (the GQA relations, :func:`properties.relation_checks.gqa_as_mha`):
a superset of the suite's launches, never fewer.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import Capabilities
from fa2_verify.core.layouts import LAYOUTS
from fa2_verify.properties import profiles
from fa2_verify.properties.cases import case_specs
from fa2_verify.properties.profiles import Limits
from fa2_verify.properties.varlen import varlen_specs


class _Announced(Exception):
    """The property's check announced ``spec``: its case, recorded before any kernel call."""

    def __init__(self, spec: CaseSpec) -> None:
        super().__init__(spec.name)
        self.spec = spec


@dataclasses.dataclass(frozen=True)
class _Target:
    """A kernel that is only its capabilities: runs anywhere, is never called."""

    capabilities: Capabilities
    name: str = "drawn"

    def unavailable_reason(self, device: str | None = None) -> None:
        return None


@dataclasses.dataclass
class _Drawing:
    """What a property's body reads of its :class:`~properties.session.Suite`: cases drawn for ``draw_device``
    under ``limits``; ``device`` is the CPU, where a check's device test touches nothing."""

    kernel: _Target
    draw_device: str
    limits: Limits
    device: str = "cpu"
    kernel_errors: None = None
    running_case: str = ""

    def cases(self, **options: Any):
        return case_specs(capabilities=self.kernel.capabilities, device=self.draw_device, limits=self.limits, **options)

    def varlen_cases(self, **options: Any):
        return varlen_specs(capabilities=self.kernel.capabilities, device=self.draw_device, limits=self.limits, **options)

    def running(self, spec: CaseSpec) -> None:
        raise _Announced(spec)


class _Recording:
    """Hypothesis' ``data`` for a property's body, keeping the layout the body draws."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.layout = "contiguous"

    def draw(self, strategy: Any, label: Any = None) -> Any:
        value = self.data.draw(strategy, label=label)
        if label == "layout":
            self.layout = value
        return value


def _examples(body: Callable[[Any], None], examples: int, seed: int | None = None) -> None:
    """``body(data)`` on ``examples`` examples as Hypothesis draws them for a property: derandomized (the same
    cases on every run), or, with ``seed``, as a run with that seed draws them."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    @settings(max_examples=examples, derandomize=seed is None, database=None, deadline=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(st.data())
    def collect(data) -> None:
        body(data)

    (collect if seed is None else hypothesis_seed(seed)(collect))()


def drawn_cases(capabilities: Capabilities, device: str, limits: Limits, examples: int,
                seed: int | None = None) -> list[tuple[CaseSpec, str]]:
    """(case, layout) pairs a kernel declaring ``capabilities`` runs on ``device`` under ``limits``: ``examples``
    draws of each declared property it can run (the module docstring), derandomized or drawn with ``seed``.

    Draw-major: every property's first draw, then every property's second, and so on, as the suite reaches
    them (each property test starts with its first examples), so a warm-up that runs beside the suite
    compiles first what the suite needs first."""
    from fa2_verify.properties.harness import declared_properties, missing_requirement

    suite = _Drawing(_Target(capabilities), device, limits)
    draws: list[list[list[tuple[CaseSpec, str]]]] = []
    for prop in declared_properties():
        if missing_requirement(prop, suite) is not None:
            continue
        drawn: list[list[tuple[CaseSpec, str]]] = []

        def body(data: Any, prop=prop, drawn=drawn) -> None:
            recording = _Recording(data)
            try:
                prop.check(suite, recording)
            except _Announced as announced:
                drawn.append(_related(announced.spec, recording.layout, mha="gqa" in prop.requires))

        _examples(body, examples, seed)
        draws.append(drawn)
    rounds = itertools.zip_longest(*draws, fillvalue=[])
    return [case for draw_round in rounds for related in draw_round for case in related]


def _related(spec: CaseSpec, layout: str, *, mha: bool) -> list[tuple[CaseSpec, str]]:
    """``spec`` contiguous, in ``layout`` if the kernel's variants can be laid out so, and as MHA if ``mha``."""
    cases = [(spec, "contiguous")]
    if layout != "contiguous" and layout in LAYOUTS:
        cases.append((spec, layout))
    if mha and spec.heads_kv != spec.heads_q:
        cases.append((dataclasses.replace(spec, heads_kv=spec.heads_q), "contiguous"))
    return cases


def profile_cases(profile_name: str, examples: int, seed: int | None = None) -> list[tuple[CaseSpec, str]]:
    """(case, layout) pairs that the ``triton`` kernel runs on a GPU under ``profile_name``:
    :func:`drawn_cases` with its GPU capabilities and the profile's GPU limits."""
    from fa2_verify.kernels.triton_fa2 import environment

    capabilities = environment.Environment(triton_installed=True, interpret=False, cuda_available=True).capabilities
    return drawn_cases(capabilities, "cuda", profiles.get(profile_name).limits("cuda"), examples, seed)
