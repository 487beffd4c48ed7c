"""benchmarks/targets_table.py: the kernel x property table of docs/targets.md, from JUnit files."""

from __future__ import annotations

from benchmarks import targets_table

NO_LSE = '<skipped type="pytest.skip" message="unsupported: the kernel provides no LSE">reason</skipped>'


def _case(name: str, body: str = "") -> str:
    """One ``<testcase>`` of the property suite's JUnit file; ``body`` its failure or skip element."""
    opening = f'<testcase classname="fa2_verify.properties.test_golden" name="{name}"'
    return f"{opening}>\n{body}</testcase>" if body else f"{opening}/>"


def _junit(*cases: str) -> str:
    """A JUnit file as pytest writes it, holding ``cases``."""
    body = "\n".join(cases)
    header = '<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="pytest">'
    return f"{header}\n{body}\n</testsuite></testsuites>\n"


JUNIT = _junit(
    _case("test_out_within_error_model"),
    _case(
        "test_dk_within_error_model",
        '<failure message="AssertionError: dk[b=0, i=1, h=0, c=3]: normalized error 1.15 &gt; 1">\n'
        "reproduce: fa2-verify repro --kernel sdpa-efficient --case '{\"batch\": 2}'</failure>",
    ),
    _case("test_lse_within_error_model", NO_LSE),
)


def test_each_outcome_gets_its_cell(tmp_path):
    junit = tmp_path / "properties-sdpa-efficient-ci-0.xml"
    junit.write_text(JUNIT)
    cells = targets_table.outcomes(junit)
    assert cells["test_out_within_error_model"] == "pass"
    assert cells["test_dk_within_error_model"].startswith("FAIL: AssertionError: dk[b=0, i=1, h=0, c=3]")
    assert "`fa2-verify repro --kernel sdpa-efficient --case '{\"batch\": 2}'`" in cells["test_dk_within_error_model"]
    assert cells["test_lse_within_error_model"] == "unsupported: the kernel provides no LSE"


def test_a_property_one_run_lacks_is_not_run(tmp_path):
    first, second = tmp_path / "properties-a-ci-0.xml", tmp_path / "properties-b-ci-0.xml"
    first.write_text(JUNIT)
    second.write_text(JUNIT.replace(_case("test_out_within_error_model"), ""))
    rows = targets_table.table([first, second]).splitlines()
    assert rows[0] == "| property | a-ci-0 | b-ci-0 |"
    assert "| `test_out_within_error_model` | pass | not run |" in rows


def test_nameless_cases_of_a_stopped_run_are_not_properties(tmp_path):
    """A run stopped by its time limit writes nameless test cases; they get no row."""
    junit = tmp_path / "properties-a-ci-0.xml"
    junit.write_text(JUNIT.replace("</testsuite>", '<testcase time="0.001" /></testsuite>'))
    assert "" not in targets_table.outcomes(junit)
    assert "| `` |" not in targets_table.table([junit])


def test_a_reproduction_that_names_its_device_is_kept_whole(tmp_path):
    junit = tmp_path / "properties-a-ci-0.xml"
    junit.write_text(JUNIT.replace("repro --kernel sdpa-efficient --case", "repro --kernel sdpa-efficient --device cuda --case"))
    cell = targets_table.outcomes(junit)["test_dk_within_error_model"]
    assert "`fa2-verify repro --kernel sdpa-efficient --device cuda --case '{\"batch\": 2}'`" in cell


SHARDED = _junit(
    _case("test_out_within_error_model[float16]"),
    _case("test_out_within_error_model[bfloat16]"),
    _case("test_dq_within_error_model[float16]"),
    _case(
        "test_dq_within_error_model[bfloat16]",
        '<failure message="PropertyFailure: dq (bfloat16) mismatches the golden">x</failure>',
    ),
    _case("test_lse_within_error_model[float16]", NO_LSE),
    _case("test_lse_within_error_model[bfloat16]", NO_LSE),
)


def test_a_property_tested_per_dtype_gets_one_cell(tmp_path):
    """Any dtype's failure fails the property; a pass names the dtypes that finished."""
    junit = tmp_path / "properties-a-ci-0.xml"
    junit.write_text(SHARDED)
    cells = targets_table.outcomes(junit)
    assert cells["test_out_within_error_model"] == "pass (float16, bfloat16)"
    assert cells["test_dq_within_error_model"] == "FAIL: PropertyFailure: dq (bfloat16) mismatches the golden"
    assert cells["test_lse_within_error_model"] == "unsupported: the kernel provides no LSE"
