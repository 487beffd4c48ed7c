"""fa2_verify.verify.check on small cases: statuses, contract checks, poisoning, and the error model on the reference.

The broken kernels here wrap the bundled ``reference`` kernel with one defect each.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import signal
import sys

import pytest
import torch

from fa2_verify import golden
from fa2_verify.core.contract import Capabilities
from fa2_verify.verify import error_model
from fa2_verify.core.outputs import write_text_atomic
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.verify.check import check_case, run_cases
from fa2_verify.core.errors import GoldenError, ReportError, UnsupportedCase
from fa2_verify.verify.poison import poisoned
from fa2_verify.verify.registry import LoadedKernel, load_kernel
from fa2_verify.verify.results import CaseResult
from tests.helpers import ctrl_c_raises

SPEC = CaseSpec(
    batch=1, seqlen_q=5, seqlen_k=9, heads_q=4, heads_kv=2, head_dim=32, dtype="float16", causal=True, seed=3
)
EMPTY_ROWS = dataclasses.replace(SPEC, seqlen_q=9, seqlen_k=5, name="empty-rows")


@pytest.fixture(scope="module")
def reference() -> LoadedKernel:
    return load_kernel("reference")


class Defective:
    """The reference kernel with one defect, chosen by ``defect``."""

    def __init__(self, defect: str, reference: LoadedKernel, capabilities: Capabilities | None = None):
        self.defect = defect
        self.reference = reference
        self.capabilities = capabilities or reference.capabilities

    def unavailable_reason(self):
        return "the package it wraps is not installed" if self.defect == "unavailable" else None

    def forward(self, q, k, v, **masking):
        if self.defect == "raises":
            raise RuntimeError("boom")
        if self.defect == "forward-exits":
            sys.exit(0)
        if self.defect == "ctrl-c":
            os.kill(os.getpid(), signal.SIGINT)
        if self.defect == "ctrl-c-swallowed":
            try:
                os.kill(os.getpid(), signal.SIGINT)
            except KeyboardInterrupt:
                raise RuntimeError("launch aborted") from None
        if self.defect == "raises-unsupported":
            raise UnsupportedCase("this shape needs a split-k launch")
        out, lse = self.reference.forward(q, k, v, **masking)
        if self.defect == "lse-shape":
            return out, lse.transpose(1, 2)
        if self.defect == "out-dtype":
            return out.float(), lse
        if self.defect == "one-value":
            return (out,)
        if self.defect == "out-list":
            return out.tolist(), lse
        if self.defect == "out-elsewhere":
            return out.to("meta"), lse
        if self.defect == "unwritten":
            partial = torch.empty_like(out)
            partial.view(-1)[:-1] = out.reshape(-1)[:-1]
            return partial, lse
        if self.defect == "modifies-input":
            q[0, 0, 0, 0] += 1
        return out, lse

    def backward(self, dout, q, k, v, out, lse, **masking):
        if self.defect == "backward-worker-interrupted":
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(_interrupted_worker).result()
        if self.defect == "backward-writes-out":
            out.zero_()
        if self.defect == "backward-writes-lse":
            lse[0, 0, 0] = 0.0
        if self.defect == "backward-writes-dout":
            dout.neg_()
        dq, dk, dv = self.reference.backward(dout, q, k, v, out, lse, **masking)
        if self.defect == "dq-unscaled":
            return dq / masking["softmax_scale"], dk, dv
        return dq, dk, dv


def _interrupted_worker() -> None:
    raise KeyboardInterrupt


def _check(defect: str, reference: LoadedKernel, spec: CaseSpec = SPEC, **kwargs) -> CaseResult:
    kernel = LoadedKernel(name=f"defect-{defect}", target=Defective(defect, reference, **kwargs))
    return check_case(kernel, make_case(spec, "cpu"))


def test_reference_passes_and_reports_every_output(reference):
    result = check_case(reference, make_case(SPEC, "cpu"))
    assert result.status == "passed", [c.worst for c in result.comparisons.values()]
    assert set(result.comparisons) == {"out", "lse", "dq", "dk", "dv"}
    assert result.comparisons["lse"].dtype == "float32" and result.comparisons["out"].dtype == "float16"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_reference_stays_within_the_bound_with_empty_rows(reference, dtype):
    """normalized error <= 1 on every output, and exact zeros/infinities on rows that see no key."""
    result = check_case(reference, make_case(dataclasses.replace(EMPTY_ROWS, dtype=dtype), "cpu"))
    assert result.status == "passed", [c.worst for c in result.comparisons.values()]
    assert all(c.normalized.quantiles["max"] <= 1.0 for c in result.comparisons.values())


def test_capabilities_make_a_case_unsupported(reference):
    only_float32 = Capabilities(dtypes={"cpu": ("float32",)}, head_dims=(32,))
    result = _check("none", reference, capabilities=only_float32)
    assert result.status == "unsupported" and not result.passed and not result.counts_as_failure
    assert "dtype=float16 is not supported" in result.reason
    assert result.comparisons == {}


def test_unsupported_case_raised_by_the_kernel(reference):
    result = _check("raises-unsupported", reference)
    assert result.status == "unsupported" and result.reason == "this shape needs a split-k launch"


def test_unavailable_kernel_is_unsupported(reference):
    result = _check("unavailable", reference)
    assert result.status == "unsupported" and "not installed" in result.reason


@pytest.mark.parametrize(
    "defect, reason",
    [
        ("raises", "defect-raises.forward raised RuntimeError: boom"),
        ("lse-shape", "returned lse with shape (1, 5, 4), expected (1, 4, 5) = (batch, heads_q, seqlen_q)"),
        ("out-dtype", "returned out with dtype float32, expected float16"),
        ("one-value", "returned 1 value(s), expected 2: (out, lse)"),
        ("out-list", "returned out as list, expected a tensor"),
        ("out-elsewhere", "returned out on meta, expected cpu"),
        ("modifies-input", "defect-modifies-input.forward modified its input q in place"),
        ("forward-exits", "defect-forward-exits.forward raised SystemExit: 0"),
        ("backward-worker-interrupted", "defect-backward-worker-interrupted.backward raised KeyboardInterrupt"),
        ("backward-writes-out", "defect-backward-writes-out.backward modified its input out in place"),
        ("backward-writes-lse", "defect-backward-writes-lse.backward modified its input lse in place"),
        ("backward-writes-dout", "defect-backward-writes-dout.backward modified its input dout in place"),
    ],
)
def test_kernel_errors_and_contract_violations_fail_the_case(reference, defect, reason):
    result = _check(defect, reference)
    assert result.status == "error" and result.counts_as_failure
    assert reason in result.reason


@pytest.mark.parametrize("defect", ["ctrl-c", "ctrl-c-swallowed"])
def test_a_ctrl_c_during_the_kernel_stops_the_run(reference, defect):
    """A SIGINT that arrives while the kernel runs is the user's: it ends the run, whatever the kernel made of it."""
    with ctrl_c_raises():
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            _check(defect, reference)
        assert signal.getsignal(signal.SIGINT) is handler


def test_backward_cannot_repair_the_forward_results(reference):
    """A forward that returns 1.5 * out is compared as returned, though backward writes the right O into out."""
    result = check_case(load_kernel("tests.mutants:OUT_REWRITTEN_BY_BACKWARD"), make_case(SPEC, "cpu"))
    assert result.status == "error"
    assert result.reason == "tests.mutants:OUT_REWRITTEN_BY_BACKWARD.backward modified its input out in place"
    forward_only = check_case(
        load_kernel("tests.mutants:OUT_REWRITTEN_BY_BACKWARD"), make_case(dataclasses.replace(SPEC, backward=False), "cpu")
    )
    assert forward_only.failed_outputs() == ["out"]


def test_unwritten_element_fails_through_poisoning(reference):
    result = _check("unwritten", reference)
    out = result.comparisons["out"]
    assert result.status == "failed" and not out.passed
    assert out.nonfinite == 1 and out.mismatches == 1
    assert out.worst["path"] == "out[b=0, i=4, h=3, c=31]" and math.isnan(out.worst["actual"])


def test_dq_without_softmax_scale_fails_only_dq(reference):
    result = _check("dq-unscaled", reference)
    assert result.failed_outputs() == ["dq"]
    assert result.comparisons["dq"].normalized.quantiles["max"] > 10


def test_an_error_in_the_golden_propagates(reference, monkeypatch):
    def broken(*args, **kwargs):
        raise GoldenError("mpmath certification failed")

    monkeypatch.setattr(golden, "compute", broken)
    with pytest.raises(GoldenError, match="certification failed"):
        check_case(reference, make_case(SPEC, "cpu"))


def test_poisoned_allocations_read_nan_and_settings_are_restored():
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    with pytest.raises(KeyError):
        with poisoned("cpu", [((3, 4), torch.float16)]):
            assert torch.empty(3, 4, dtype=torch.float16).isnan().all()
            assert torch.empty_like(torch.zeros(5)).isnan().all()
            raise KeyError("leaves the block")
    after = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    assert after == before


@pytest.mark.gpu
def test_poisoned_cuda_allocations_read_nan():
    with poisoned("cuda", [((64, 64), torch.float16)]):
        assert torch.empty(64, 64, dtype=torch.float16, device="cuda").isnan().all()


def test_run_result_is_strict_json_and_its_cases_round_trip(reference):
    run = run_cases(reference, [SPEC, EMPTY_ROWS], "cpu")
    record = json.loads(json.dumps(run.to_dict(), allow_nan=False))
    assert record["summary"] == {"passed": 2, "failed": 0, "unsupported": 0, "error": 0}
    assert record["thresholds"] == dict(error_model.THRESHOLDS)
    assert record["environment"]["torch"] == torch.__version__
    assert [CaseResult.from_dict(case).to_dict() for case in record["cases"]] == record["cases"]


def test_write_text_atomic_never_overwrites_unless_asked(tmp_path):
    target = tmp_path / "sub" / "report.json"
    write_text_atomic(target, "first", overwrite=False, flag="--out")
    with pytest.raises(ReportError, match="exists: pass --overwrite"):
        write_text_atomic(target, "second", overwrite=False, flag="--out")
    assert target.read_text() == "first"
    write_text_atomic(target, "third", overwrite=True, flag="--out")
    assert target.read_text() == "third"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]
