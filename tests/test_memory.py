"""The size guard: every entry refuses a case too large for the machine, or whose golden would run longer than
its limit, before allocating it, in one line.

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
from fa2_verify.app import runs
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import visible_mask
from fa2_verify.core.errors import CaseTooLarge
from fa2_verify.properties import options, verdicts
from fa2_verify.properties import profiles
from fa2_verify.properties.session import Suite
from fa2_verify.verify import check, golden_time, memory
from fa2_verify.verify.check import run_cases
from fa2_verify.app.cases.gate_corpus import load_corpus, save_corpus
from fa2_verify.verify.corpus import Corpus
from fa2_verify.app.cases.fixed import FIXED_CASES
from fa2_verify.app.cases.scale import SCALE_CASES
from fa2_verify.verify.registry import load_kernel

SMALL = CaseSpec(batch=1, seqlen_q=8, seqlen_k=8, heads_q=1, heads_kv=1, head_dim=8, dtype="float32", name="small")
LONG = CaseSpec(
    batch=1, seqlen_q=10**7, seqlen_k=10**7, heads_q=1, heads_kv=1, head_dim=64, dtype="float16", name="long"
)
WIDE = CaseSpec(batch=10**8, seqlen_q=16, seqlen_k=16, heads_q=1, heads_kv=1, head_dim=64, dtype="float16", name="wide")


#: What a refusal for memory says besides the case: the estimate, the free memory and the fix.
MEMORY_REFUSAL = ("needs about", "is free: use a smaller")
#: What a refusal for time says besides the case: the estimated seconds, the limit and the option that raises it.
TIME_REFUSAL = ("s of golden and comparison on cpu", "over the limit of", "--max-golden-seconds")


def _refused(message: str, spec: CaseSpec, parts: tuple[str, ...] = MEMORY_REFUSAL) -> bool:
    """One line naming the case and its shape, and the ``parts`` of its refusal."""
    message = message.removesuffix("\n")
    return (
        f"{spec.name} (batch={spec.batch}, seqlen_q={spec.seqlen_q}" in message
        and all(part in message for part in parts)
        and "\n" not in message
    )


@pytest.mark.parametrize("spec", [LONG, WIDE], ids=["seqlen-1e7", "batch-1e8"])
def test_repro_refuses_a_case_too_large_before_allocating_it(spec, capsys, monkeypatch):
    monkeypatch.setattr(runs, "check_spec", lambda *args: pytest.fail("repro allocated the case"))
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


def _declined_reasons(suite: Suite, case: CaseSpec) -> list[str]:
    """The reasons the property suite gives for declining every example of ``case`` (it must decline them all)."""

    @settings(max_examples=5, database=None)
    @given(st.just(case))
    def property_check(spec):
        verdicts.introduce(suite, spec)

    with pytest.raises(Unsatisfiable):
        property_check()
    return suite.take_observations()["unsupported"]


def test_the_property_suite_declines_a_case_too_large_with_the_estimate():
    reasons = _declined_reasons(Suite(load_kernel("reference"), "cpu", profiles.get("ci")), WIDE)
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


#: Fits in memory (its inputs are a few MiB) but its golden and comparison would take hours on any CPU.
SLOW = CaseSpec(
    batch=1, seqlen_q=200_000, seqlen_k=200_000, heads_q=1, heads_kv=1, head_dim=8, dtype="float16", name="slow"
)


def test_repro_refuses_a_case_whose_golden_would_run_for_hours(capsys, monkeypatch):
    """The memory guard lets it through (a few MiB); the time estimate does not."""
    assert memory.estimate(SLOW).combined < 2**30
    monkeypatch.setattr(runs, "check_spec", lambda *args: pytest.fail("repro ran the case"))
    assert cli.main(["repro", "--kernel", "reference", "--case", json.dumps(SLOW.to_dict())]) == 2
    error = capsys.readouterr().err
    assert error.startswith("fa2-verify: error: ") and _refused(error, SLOW, TIME_REFUSAL)
    assert "over the limit of 600 s" in error


def test_max_golden_seconds_moves_the_limit_both_ways(monkeypatch):
    memory.require_fits(SLOW, "cpu", max_golden_seconds=10**7)
    memory.require_fits(SMALL, "cpu")
    with pytest.raises(CaseTooLarge) as raised:
        memory.require_fits(SMALL, "cpu", max_golden_seconds=1e-12)
    assert _refused(str(raised.value), SMALL, TIME_REFUSAL)
    monkeypatch.setattr(check, "check_case", lambda *args, **kwargs: pytest.fail("a case ran"))
    with pytest.raises(CaseTooLarge):
        run_cases(load_kernel("reference"), [SMALL, SLOW], "cpu", max_golden_seconds=1.0)


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_a_bad_max_golden_seconds_is_one_line(value, capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main(["run", "--kernel", "reference", "--max-golden-seconds", value])
    error = capsys.readouterr().err
    assert raised.value.code == 2 and "--max-golden-seconds" in error and error.count("\n") == 1
    with pytest.raises(pytest.UsageError, match="--fa2-max-golden-seconds"):
        options.seconds_option("--fa2-max-golden-seconds", value)
    assert options.seconds_option("--fa2-max-golden-seconds", "90") == 90.0


def test_the_property_suite_declines_a_case_over_its_time_limit():
    suite = Suite(load_kernel("reference"), "cpu", profiles.get("ci"), max_golden_seconds=1e-12)
    reasons = _declined_reasons(suite, SMALL)
    assert reasons and all(_refused(reason, SMALL, TIME_REFUSAL) for reason in reasons)


def test_the_case_sets_pass_the_time_guard_on_their_devices():
    """The default limit refuses none of the fixed set, the corpus or the scale set of each device type
    (``q-over-2^31``, the largest: 64 to 68 s of golden measured on an H100 and an H200, docs/benchmarks.md)."""
    for device, specs in [("cpu", FIXED_CASES + load_corpus().cases), *SCALE_CASES.items()]:
        assert max(golden_time.estimate_seconds(spec, device) for spec in specs) < golden_time.DEFAULT_MAX_SECONDS / 10


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (0, 0), (3, -1), (-1, 2), (2, 5), (40, 0)])
@pytest.mark.parametrize("seqlens", [(0, 5), (1, 1), (7, 13), (13, 7), (16, 16)])
def test_visible_pairs_counts_the_mask(seqlens, window, causal):
    spec = CaseSpec(batch=1, seqlen_q=seqlens[0], seqlen_k=seqlens[1], heads_q=1, heads_kv=1, head_dim=8,
                    dtype="float32", causal=causal, window_size=window)
    mask = visible_mask(*seqlens, causal=causal, window_size=window)
    assert golden_time.visible_pairs(spec) == int(mask.sum())
