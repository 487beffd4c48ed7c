"""``fa2-verify race``: many calls per case, each output held to its promise (bitwise, or the atomic-dQ bound).

The breaker is :class:`tests.breakers.DriftingOrderDq`: dQ's key-block sums added in reverse on every
8th call.  It is not in tests/mutants.py: the catalog requires every mutant to differ from the reference
by more than 1e-2 and to be caught by the ci profile's properties, and a changed summation order differs
by float32 rounding only, which is no error at all unless the kernel promised the same bits.
"""

from __future__ import annotations

import json

import pytest

from fa2_verify.cli.main import main
from fa2_verify.properties.race import ATOMIC_DQ_BOUND, BITWISE, NONE, promises
from fa2_verify.core.case import CaseSpec
from fa2_verify.kernels.reference import DEFERRED
from fa2_verify.app.cases.race import RACE_CASES
from tests import breakers

#: Five key blocks of 16 per row (65 keys), so that reversing their order changes float32 sums.
CASE = {"batch": 1, "seqlen_q": 4, "seqlen_k": 65, "heads_q": 1, "heads_kv": 1, "head_dim": 8,
        "dtype": "float32", "backward": True, "seed": 7, "name": "tiny-sk65"}


def _race(tmp_path, kernel: str, *, deterministic: bool, repeats: int = 8) -> tuple[int, str, dict]:
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{**CASE, "deterministic": deterministic}]))
    report = tmp_path / "race.json"
    status = main(["race", "--kernel", kernel, "--cases", str(cases), "--repeats", str(repeats),
                   "--json-report", str(report)])
    return status, report.read_text(), json.loads(report.read_text())


def test_a_declared_deterministic_backward_whose_dq_order_drifts_is_caught(tmp_path, capsys):
    status, _, report = _race(tmp_path, "tests.breakers:DRIFTING_DQ_DECLARED_DETERMINISTIC", deterministic=True)
    stdout = capsys.readouterr().out
    assert status == 1
    assert "case tiny-sk65: dq: 2 distinct result(s) in 9 calls" in stdout
    assert "first difference at call" in stdout and "dq[b=0, i=" in stdout and "promise bitwise: BROKEN" in stdout
    (dq,) = [output for output in report["cases"][0]["outputs"] if output["output"] == "dq"]
    assert dq["promise"] == BITWISE and not dq["passed"] and dq["first_difference"]["path"].startswith("dq[")


def test_a_correct_nondeterministic_dq_passes_within_the_atomic_bound(tmp_path, capsys):
    """The same drifting order, not declared deterministic: the spread is there, and within the bound."""
    status, _, report = _race(tmp_path, "tests.breakers:DRIFTING_DQ", deterministic=False)
    assert status == 0, capsys.readouterr().out
    (dq,) = [output for output in report["cases"][0]["outputs"] if output["output"] == "dq"]
    assert dq["promise"] == ATOMIC_DQ_BOUND and dq["passed"]
    assert dq["distinct"] == 2 and 0 < dq["spread_over_bound"] <= 1, "the order never changed dq: vacuous"


def test_a_dq_spread_beyond_rounding_breaks_the_atomic_bound(tmp_path, capsys):
    status, _, report = _race(tmp_path, "tests.breakers:NOISY_DQ", deterministic=False, repeats=1)
    assert status == 1
    (dq,) = [output for output in report["cases"][0]["outputs"] if output["output"] == "dq"]
    assert dq["spread_over_bound"] > 1 and "of the atomic-dQ bound (worst dq[" in capsys.readouterr().out


def test_the_reference_passes_the_race_prone_set(capsys):
    assert main(["race", "--kernel", "reference", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert f"3 passed, 0 failed, 0 errors, 0 unsupported (of {len(RACE_CASES['cpu'])} cases)" in out


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_bad_repeats_is_one_line_exit_2(value, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["race", "--kernel", "reference", "--repeats", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--repeats" in err


def test_a_case_file_that_is_not_a_list_of_specs_is_one_line_exit_2(tmp_path, capsys):
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(CASE))
    assert main(["race", "--kernel", "reference", "--cases", str(cases)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "expected a non-empty JSON list of case specs" in err


def test_gqa_dk_dv_promise_nothing_where_the_kernel_says_so():
    spec = CaseSpec.from_dict({**CASE, "heads_q": 2})
    declared = breakers.GqaRandomOrderDkDv().capabilities
    assert promises(DEFERRED.capabilities, spec) == {"out": BITWISE, "lse": BITWISE, "dq": ATOMIC_DQ_BOUND,
                                                    "dk": BITWISE, "dv": BITWISE}
    assert promises(declared, spec)["dk"] == NONE
