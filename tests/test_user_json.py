"""User-supplied JSON goes through one reader (``core.user_json``): a value too deep, a number too long, bytes
that are not UTF-8 or a constant that is not JSON is one line naming the file or option (exit 2), never a
traceback; every command and the plugin's ``--fa2-durations`` read through it."""

from __future__ import annotations

import json

import pytest

from fa2_verify.cli import main as cli
from fa2_verify.core.errors import BaselineError, InputJsonError, ReportError
from fa2_verify.core.user_json import MAX_DEPTH, MAX_NUMBER_CHARS, parse_json, read_json
from fa2_verify.properties import ordering, schedule
from fa2_verify.records.baseline import load_baseline
from fa2_verify.app.cases.gate_corpus import DEFAULT_PATH
from fa2_verify.records.report_json import load_tolerance_report

DEEP = "[" * 20000 + "]" * 20000
LONG_INTEGER = '{"batch": ' + "1" * 5000 + "}"
NOT_UTF8 = b'{"schema_version": 1, "corpus_version": 1, "cases": [{"name": "\xff"}]}'

BAD = {
    "deep": (DEEP, f"nested more than {MAX_DEPTH} levels deep"),
    "long-integer": (LONG_INTEGER, "a number of 5000 characters"),
    "long-float": ('[1.' + "0" * 5000 + "]", "a number of 5002 characters"),
    "not-utf8": (NOT_UTF8, "not UTF-8 (invalid start byte at byte 63)"),
    "lone-surrogate": ('"\udcff"', "not UTF-8"),
    "nan": ('{"a": NaN}', "not valid JSON (NaN is not strict JSON)"),
    "overflowing-float": ("[1e999]", "the number 1e999, beyond float64's range"),
    "syntax": ("{not json", "not valid JSON (Expecting property name"),
}


@pytest.mark.parametrize("data, problem", BAD.values(), ids=BAD.keys())
def test_bad_json_is_one_line_naming_the_source(data, problem):
    with pytest.raises(InputJsonError) as raised:
        parse_json(data, "--case")
    message = str(raised.value)
    assert message.startswith("--case: ") and problem in message and "\n" not in message


def test_json_within_the_bounds_is_read():
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_json(nested, "x") is not None
    longest = "1" * MAX_NUMBER_CHARS
    assert parse_json(f'{{"a": {longest}, "b": "[[[[{{{{\\"", "c": [2.5e-3, -1]}}'.encode(), "x") == {
        "a": int(longest), "b": '[[[[{{\"', "c": [2.5e-3, -1]}


def test_an_unreadable_file_is_named(tmp_path):
    with pytest.raises(InputJsonError, match=r"^--corpus=.*missing.json: cannot read it \("):
        read_json(tmp_path / "missing.json", f"--corpus={tmp_path / 'missing.json'}")


def _cli(capsys, *arguments: str) -> tuple[int, str]:
    code = cli.main(list(arguments))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", [DEEP, LONG_INTEGER], ids=["deep", "long-integer"])
def test_repro_and_corpus_add_refuse_bad_case_json_in_one_line(case, capsys, tmp_path):
    code, error = _cli(capsys, "repro", "--kernel", "reference", "--case", case)
    assert code == 2 and error.startswith("fa2-verify: error: --case: ") and error.count("\n") == 1
    corpus = tmp_path / "gate.json"
    corpus.write_bytes(DEFAULT_PATH.read_bytes())
    code, error = _cli(capsys, "corpus", "add", "--corpus", str(corpus), "--case", case)
    assert code == 2 and error.startswith("fa2-verify: error: --case: ") and error.count("\n") == 1
    assert corpus.read_bytes() == DEFAULT_PATH.read_bytes()


@pytest.mark.parametrize("content", [DEEP.encode(), LONG_INTEGER.encode(), NOT_UTF8], ids=["deep", "long", "not-utf8"])
def test_baseline_gate_and_corpus_commands_refuse_a_bad_file_in_one_line(content, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    out = tmp_path / "out.json"
    for arguments, option in [
        (("corpus", "list", "--corpus", str(bad)), "--corpus="),
        (("baseline", "--kernel", "reference", "--corpus", str(bad), "--out", str(out)), "--corpus="),
        (("gate", "--kernel", "reference", "--baseline", str(bad)), "--baseline="),
    ]:
        code, error = _cli(capsys, *arguments)
        assert code == 2 and error.startswith(f"fa2-verify: error: {option}{bad}") and error.count("\n") == 1
    assert not out.exists()


def test_each_loader_keeps_its_error_class(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(DEEP)
    with pytest.raises(BaselineError, match="is corrupt: arrays and objects nested"):
        load_baseline(bad)
    with pytest.raises(ReportError, match="--tolerance=.*: arrays and objects nested"):
        load_tolerance_report(bad)
    with pytest.raises(ValueError, match="arrays and objects nested"):
        schedule.durations_file(str(bad), "reference cpu dev")


@pytest.mark.parametrize("content", [DEEP, LONG_INTEGER], ids=["deep", "long-integer"])
def test_a_bad_durations_file_is_a_pytest_usage_error_not_an_internal_error(content, tmp_path):
    path = tmp_path / "durations.json"
    path.write_text(content)
    with pytest.raises(pytest.UsageError) as raised:
        ordering.durations_option(str(path), "reference cpu dev")
    assert str(raised.value).startswith(f"--fa2-durations={path}: ") and "\n" not in str(raised.value)
    path.write_text(json.dumps({"reference cpu dev": {"test_g.py::test_a[float16]": [1.5]}}))
    assert ordering.durations_option(str(path), "reference cpu dev") == {"test_g.py::test_a[float16]": [1.5]}
