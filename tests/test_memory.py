"""The size guard: every entry refuses a case too large for the machine before allocating it, in one line.

The estimate itself (:mod:`fa2_verify.verify.memory`) is checked against what
a 128k-token case must not count: a float64 ``seqlen_q x seqlen_k`` matrix in
the golden, which works in row blocks.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from fa2_verify.cli import main as cli
from fa2_verify.cli.commands import repro
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import CaseTooLarge
from fa2_verify.properties import verdicts
from fa2_verify.properties import profiles
from fa2_verify.properties.session import Suite
from fa2_verify.verify import check, memory
from fa2_verify.verify.check import run_cases
from fa2_verify.verify.corpus import Corpus, save_corpus
from fa2_verify.verify.registry import load_kernel

SMALL = CaseSpec(batch=1, seqlen_q=8, seqlen_k=8, heads_q=1, heads_kv=1, head_dim=8, dtype="float32", name="small")
LONG = CaseSpec(
    batch=1, seqlen_q=10**7, seqlen_k=10**7, heads_q=1, heads_kv=1, head_dim=64, dtype="float16", name="long"
)
WIDE = CaseSpec(batch=10**8, seqlen_q=16, seqlen_k=16, heads_q=1, heads_kv=1, head_dim=64, dtype="float16", name="wide")


def _refused(message: str, spec: CaseSpec) -> bool:
    """One line naming the case and its shape, the estimate, the free memory and the fix."""
    message = message.removesuffix("\n")
    return (
        f"{spec.name} (batch={spec.batch}, seqlen_q={spec.seqlen_q}" in message
        and "needs about" in message
        and "is free: use a smaller" in message
        and "\n" not in message
    )


@pytest.mark.parametrize("spec", [LONG, WIDE], ids=["seqlen-1e7", "batch-1e8"])
def test_repro_refuses_a_case_too_large_before_allocating_it(spec, capsys, monkeypatch):
    monkeypatch.setattr(repro, "check_spec", lambda *args: pytest.fail("repro allocated the case"))
    assert cli.main(["repro", "--kernel", "reference", "--case", json.dumps(spec.to_dict())]) == 2
    error = capsys.readouterr().err
    assert error.startswith("fa2-verify: error: ") and _refused(error, spec)


def test_run_cases_refuses_before_running_any_case(monkeypatch):
    monkeypatch.setattr(check, "check_case", lambda *args, **kwargs: pytest.fail("a case ran"))
    with pytest.raises(CaseTooLarge) as raised:
        run_cases(load_kernel("reference"), [SMALL, WIDE], "cpu")
    assert _refused(str(raised.value), WIDE)


def test_baseline_refuses_a_corpus_with_a_case_too_large(tmp_path, capsys):
    corpus = save_corpus(Corpus(version=1, cases=(SMALL, LONG)), tmp_path / "corpus.json")
    arguments = ["baseline", "--kernel", "reference", "--corpus", str(corpus), "--out", str(tmp_path / "b.json")]
    assert cli.main(arguments) == 2
    assert _refused(capsys.readouterr().err, LONG)
    assert not (tmp_path / "b.json").exists()


def test_the_property_suite_declines_a_case_too_large_with_the_estimate():
    suite = Suite(load_kernel("reference"), "cpu", profiles.get("ci"))

    @settings(max_examples=5, database=None)
    @given(st.just(WIDE))
    def property_check(spec):
        verdicts.introduce(suite, spec)

    with pytest.raises(Unsatisfiable):
        property_check()
    reasons = suite.take_observations()["unsupported"]
    assert reasons and all(_refused(reason, WIDE) for reason in reasons)


def test_a_case_that_fits_passes_the_guard():
    memory.require_fits(SMALL, "cpu")
    assert 0 < memory.estimate(SMALL).combined < memory.free_memory("cpu")


def test_a_128k_token_case_counts_no_seqlen_squared_float64_buffer_in_the_golden():
    spec = CaseSpec(
        batch=1, seqlen_q=131072, seqlen_k=131072, heads_q=16, heads_kv=16, head_dim=128, dtype="bfloat16", causal=True
    )
    stages = {stage.name: stage for stage in memory.estimate(spec, "cuda").stages}
    assert stages["golden"].device < memory.FLOAT64 * spec.seqlen_q * spec.seqlen_k


@pytest.mark.gpu
def test_on_cuda_the_guard_reads_the_device_and_the_host_apart():
    free = memory.free_memory("cuda")
    assert 0 < free <= torch.cuda.get_device_properties(0).total_memory
    stage = memory.estimate(LONG, "cuda").largest(on_cpu=False).name
    with pytest.raises(CaseTooLarge, match=rf"needs about .* on cuda \(at its {stage} stage\)"):
        memory.require_fits(LONG, "cuda")
