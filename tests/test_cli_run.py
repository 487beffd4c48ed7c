"""``fa2-verify run`` and ``fa2-verify repro`` end to end: exit codes, the table, messages, tolerance.json.

The restricted kernels below are loadable as ``tests.test_cli_run:NAME``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

from fa2_verify.core.contract import UNBOUNDED, Capabilities, effective_window
from fa2_verify.core.varlen import VarlenSpec
from fa2_verify.cli.main import main
from fa2_verify.kernels.reference import DEFERRED
from fa2_verify.kernels.torch_flash import cuda_op_window
from fa2_verify.app.cases.fitting import fitted_cases
from fa2_verify.app.cases.fixed import FIXED_CASES
from fa2_verify.verify.registry import load_kernel
from fa2_verify.records.report_json import SCHEMA_VERSION, load_tolerance_report
from fa2_verify.verify.results import CaseResult
from tests import breakers, crashing
from tests.helpers import ctrl_c_raises

REPO = pathlib.Path(__file__).resolve().parents[1]


class Restricted:
    """The reference kernel behind narrower capabilities."""

    def __init__(self, capabilities: Capabilities):
        self.capabilities = capabilities

    def forward(self, *args, **kwargs):
        return load_kernel("reference").forward(*args, **kwargs)

    def backward(self, *args, **kwargs):
        return load_kernel("reference").backward(*args, **kwargs)

    def config(self):
        return {"wraps": "reference"}


FLOAT32_ONLY = Restricted(Capabilities(dtypes={"cpu": ("float32",)}, head_dims=(32, 40, 64)))
NOTHING = Restricted(Capabilities(dtypes={"cpu": ("float64",)}, head_dims=(8,)))


class ExitingConfig(Restricted):
    """A target whose ``config()`` calls ``sys.exit(0)``."""

    def config(self):
        sys.exit(0)


EXITING_CONFIG = ExitingConfig(FLOAT32_ONLY.capabilities)


class CtrlC(Restricted):
    """A target during whose forward the user presses Ctrl-C (SIGINT to this process)."""

    def forward(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return super().forward(*args, **kwargs)


CTRL_C = CtrlC(FLOAT32_ONLY.capabilities)


class FlashAttnWindows:
    """The reference with the window flash-attn applies in place of the contract's (``cuda_op_window``): a right
    bound of ``seqlen_k`` or more read as unbounded, or as ``seqlen_k`` beside a bounded left side."""

    capabilities = DEFERRED.capabilities

    @staticmethod
    def _window(q, k, causal, window_size):
        return cuda_op_window(q.shape[1], k.shape[1], effective_window(causal, window_size))

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        return DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, window_size=self._window(q, k, causal, window_size))

    def backward(self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED),
                 deterministic=False):  # fmt: skip
        return DEFERRED.backward(dout, q, k, v, out, lse, softmax_scale=softmax_scale,
                                 window_size=self._window(q, k, causal, window_size), deterministic=deterministic)


FLASH_ATTN_WINDOWS = FlashAttnWindows()

#: The reference run sequence by sequence through the varlen entry points: a correct varlen kernel.
VARLEN_BY_LOOP = breakers.VarlenByLoop()
#: The fixed set's cases with one sequence each; the reference has no varlen entry points.
DENSE = [spec for spec in FIXED_CASES if not isinstance(spec, VarlenSpec)]
(PACKED,) = [spec for spec in FIXED_CASES if isinstance(spec, VarlenSpec)]


def _cli(*argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(list(argv))
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module", autouse=True)
def golden_cache(tmp_path_factory):
    """Share golden results between the runs of this module (same cases, same inputs)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FA2_VERIFY_GOLDEN_CACHE", str(tmp_path_factory.mktemp("golden-cache")))
        yield


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    report = tmp_path_factory.mktemp("report")
    code, stdout, stderr = _cli("run", "--kernel", "reference", "--report", str(report))
    return code, stdout, stderr, report / "tolerance.json"


def test_reference_passes_on_cpu(reference_run):
    code, stdout, stderr, _ = reference_run
    assert code == 0, stdout + stderr
    assert f"reference on cpu: {len(DENSE)} passed, 0 failed, 0 errors, 1 unsupported" in stdout
    assert f"{PACKED.name}" in stdout and "varlen" in stdout
    header = stdout.splitlines()[0].split()
    assert header[:6] == ["case", "output", "dtype", "p50", "p99", "max"]
    for dtype in ("float16", "bfloat16", "float32"):
        assert f" {dtype} " in stdout


def test_tolerance_json_schema(reference_run):
    path = reference_run[3]
    record = load_tolerance_report(path)
    assert record["schema_version"] == SCHEMA_VERSION
    assert record["kernel"] == "reference" and record["device"] == "cpu"
    assert {"torch", "python", "device_name"} <= set(record["environment"])
    assert record["environment"]["torch"] == torch.__version__
    assert record["config"] == load_kernel("reference").config()
    assert record["environment"]["kernel_config"] == record["config"]
    assert record["thresholds"] == {"out": 1.0, "lse": 1.0, "dq": 1.0, "dk": 1.0, "dv": 1.0}
    assert record["summary"] == {"passed": len(DENSE), "failed": 0, "unsupported": 1, "error": 0}
    assert record["cases"][-1]["spec"]["seqlens"] == [list(pair) for pair in PACKED.seqlens]
    for case in record["cases"][:-1]:
        assert case["status"] == "passed"
        assert set(case["comparisons"]) == {"out", "lse", "dq", "dk", "dv"}
        normalized = case["comparisons"]["out"]["normalized"]
        assert set(normalized["quantiles"]) == {"p50", "p90", "p99", "p99.9", "max"}
        assert sum(normalized["histogram"]["counts"]) == normalized["count"] == case["comparisons"]["out"]["numel"]


def test_existing_report_is_not_overwritten(reference_run):
    path = reference_run[3]
    before = path.read_bytes()
    code, stdout, stderr = _cli("run", "--kernel", "reference", "--report", str(path.parent))
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and "tolerance.json exists: pass --overwrite" in stderr
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "mutant, failing",
    [
        ("LSE_BASE2", "lse (float32) mismatches the golden"),
        ("CAUSAL_SHIFT", "out ("),
        ("SKIP_RESCALE", "out ("),
        ("OUT_REWRITTEN_BY_BACKWARD", "tests.mutants:OUT_REWRITTEN_BY_BACKWARD.backward modified its input out in place"),
        ("BACKWARD_EXITS", "tests.mutants:BACKWARD_EXITS.backward raised SystemExit: 0"),
    ],
)
def test_mutants_fail_naming_the_output(mutant, failing):
    code, stdout, _ = _cli("run", "--kernel", f"tests.mutants:{mutant}")
    assert code == 1
    assert failing in stdout
    assert "reproduce: fa2-verify repro --kernel tests.mutants:" in stdout


def test_unsupported_cases_are_listed_never_passed(tmp_path):
    code, stdout, _ = _cli("run", "--kernel", "tests.test_cli_run:FLOAT32_ONLY", "--report", str(tmp_path))
    assert code == 0
    assert "unsupported: dtype=float16 is not supported on cpu" in stdout
    record = json.loads((tmp_path / "tolerance.json").read_text())
    statuses = {case["spec"]["dtype"]: set() for case in record["cases"]}
    for case in record["cases"]:
        statuses[case["spec"]["dtype"]].add(case["status"])
    assert statuses == {"float16": {"unsupported"}, "bfloat16": {"unsupported"}, "float32": {"passed"}}
    assert record["config"] == {"wraps": "reference"}


def test_nothing_supported_is_an_error_and_overwrite_replaces_the_report(tmp_path):
    (tmp_path / "tolerance.json").write_text("old")
    code, stdout, stderr = _cli(
        "run", "--kernel", "tests.test_cli_run:NOTHING", "--report", str(tmp_path), "--overwrite"
    )
    assert code == 2
    assert "supports none of the" in stderr and "nothing was verified" in stderr
    assert json.loads((tmp_path / "tolerance.json").read_text())["summary"]["unsupported"] == len(FIXED_CASES)


def test_a_hook_that_exits_is_one_line_exit_2():
    code, stdout, stderr = _cli("run", "--kernel", "tests.test_cli_run:EXITING_CONFIG")
    assert code == 2 and stdout == ""
    assert stderr == "fa2-verify: error: kernel 'tests.test_cli_run:EXITING_CONFIG': config() raised SystemExit: 0\n"


@pytest.mark.parametrize(
    "option, make_path, message",
    [
        ("--report", lambda tmp: tmp / "a-file" / "reports", "a-file is not a directory"),
        ("--report", lambda tmp: tmp, "tolerance.json is a directory: name a file"),
        ("--markdown", lambda tmp: tmp, "is a directory: name a file"),
        ("--markdown", lambda tmp: tmp / "a-file" / "summary.md", "a-file is not a directory"),
    ],
    ids=["report-under-a-file", "report-file-is-a-directory", "markdown-is-a-directory", "markdown-under-a-file"],
)
def test_unwritable_output_is_refused_before_any_case_runs(tmp_path, option, make_path, message):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "tolerance.json").mkdir()
    code, stdout, stderr = _cli("run", "--kernel", "reference", option, str(make_path(tmp_path)))
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and f"{option}=" in stderr and message in stderr


def test_report_and_markdown_naming_one_file_are_refused_before_any_case_runs(tmp_path):
    code, stdout, stderr = _cli("run", "--kernel", "reference", "--report", str(tmp_path),
                                "--markdown", str(tmp_path / "tolerance.json"), "--overwrite")  # fmt: skip
    assert code == 2 and stdout == "" and stderr.count("\n") == 1 and "name the same file" in stderr
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_a_kernel_stops_the_run_with_status_130():
    with ctrl_c_raises():
        code, stdout, stderr = _cli("run", "--kernel", "tests.test_cli_run:CTRL_C")
    assert code == 130 and "passed" not in stdout
    assert stderr.splitlines()[-1] == "fa2-verify: interrupted: nothing was verified to completion"


def test_run_case_reruns_the_named_cases_alone_in_set_order():
    first, second = FIXED_CASES[4].name, FIXED_CASES[1].name
    code, stdout, stderr = _cli("run", "--kernel", "reference", "--case", first, "--case", second, "--case", first)
    assert code == 0, stdout + stderr
    ran = [line.split()[0] for line in stdout[stdout.index("kernel s") :].splitlines()[1:3]]
    assert ran == [second, first]
    assert f"case set: fixed (cpu, 2 cases, chosen by --case from {len(FIXED_CASES)})" in stdout
    assert stderr.splitlines() == [f"fa2-verify: running case 1 of 2: {second}", f"fa2-verify: running case 2 of 2: {first}"]


def test_run_case_naming_an_unsupported_case_is_not_a_pass():
    """Asked for by name and not verified: exit 2 naming the case and the reason, though the other case passed."""
    code, stdout, stderr = _cli("run", "--kernel", "tests.test_cli_run:FLOAT32_ONLY", "--case", "fp16-causal",
                                "--case", "fp32-causal")  # fmt: skip
    assert code == 2 and "1 passed, 0 failed, 0 errors, 1 unsupported" in stdout
    assert stderr.splitlines()[-1] == (
        "fa2-verify: error: --case=fp16-causal: --kernel=tests.test_cli_run:FLOAT32_ONLY does not support it on "
        "--device=cpu (dtype=float16 is not supported on cpu (supported: ['float32'])): a case named by --case was "
        "not verified"
    )


def test_run_case_with_an_unknown_name_lists_the_names_in_one_line():
    code, stdout, stderr = _cli("run", "--kernel", "reference", "--case", FIXED_CASES[0].name, "--case", "fp16-nothing")
    assert code == 2 and stdout == "" and stderr.count("\n") == 1
    assert stderr.startswith("fa2-verify: error: --case=fp16-nothing is not a case of the fixed set: use one of ")
    assert all(spec.name in stderr for spec in FIXED_CASES)


def test_a_kernel_that_kills_run_leaves_the_case_it_was_on_as_the_last_line():
    """tests/crashing.py: the backward aborts the process on the first case run with head_dim 40 (a case's
    head dim fitted to the kernel's 32 and 40: the 64 of the second case becomes 40)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [sys.executable, "-m", "fa2_verify", "run", "--kernel", "tests.crashing:ABORTS_ON_HEAD_DIM_40"],
        capture_output=True, text=True, env=environment, cwd=REPO, timeout=120,
    )
    cases = fitted_cases(crashing.ABORTS_ON_HEAD_DIM_40.capabilities, FIXED_CASES, "cpu")
    doomed = next(index for index, spec in enumerate(cases) if spec.head_dim == crashing.FATAL_HEAD_DIM)
    assert completed.returncode != 0 and completed.stdout == ""
    announced = [line for line in completed.stderr.splitlines() if line.startswith("fa2-verify: ")]
    assert doomed > 0 and announced[-2] == (
        f"fa2-verify: running case {doomed + 1} of {len(cases)}: {cases[doomed].name}"
    )
    assert announced[-1].startswith("fa2-verify: error: the process running the kernel ended (signal 6, SIGABRT)")


def test_unknown_kernel_is_one_line_exit_2():
    code, stdout, stderr = _cli("run", "--kernel", "no-such-kernel")
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and "unknown kernel 'no-such-kernel'" in stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without a GPU")
def test_cuda_without_a_gpu_is_one_line_exit_2():
    code, stdout, stderr = _cli("run", "--kernel", "reference", "--device", "cuda")
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and "--device=cuda: no CUDA device is visible" in stderr


@pytest.mark.parametrize(
    "argv, message",
    [((), "fa2-verify: error: the following arguments are required: COMMAND (see fa2-verify --help)"),
     (("run",), "fa2-verify run: error: the following arguments are required: --kernel"),
     (("run", "--kernel", "reference", "--cases", "big"), "fa2-verify run: error: argument --cases: invalid choice: 'big'"),
     (("gate", "--kernel", "reference", "--baseline", "b.json", "--relative-margin", "abc"),
      "fa2-verify gate: error: argument --relative-margin: invalid float value: 'abc'"),
     (("corpus",), "fa2-verify corpus: error: the following arguments are required: ACTION")],
    ids=["no-command", "missing-kernel", "bad-choice", "not-a-number", "no-action"],
)
def test_a_malformed_command_line_is_one_line_exit_2(capsys, argv, message):
    """argparse's errors too: one line naming the argument, never its usage block."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    stderr = capsys.readouterr().err
    assert exited.value.code == 2 and stderr.count("\n") == 1 and stderr.startswith(message)


def test_bad_device_is_one_line_exit_2():
    code, _, stderr = _cli("run", "--kernel", "reference", "--device", "gpu0")
    assert code == 2 and stderr.count("\n") == 1 and "--device='gpu0' is not a device" in stderr


def test_the_packed_case_checks_every_sequence_through_the_varlen_entry_points(tmp_path):
    """A varlen kernel gets one result per sequence (empty ones included), each named after the batch."""
    code, stdout, stderr = _cli("run", "--kernel", "tests.test_cli_run:VARLEN_BY_LOOP", "--case", PACKED.name,
                                "--report", str(tmp_path))  # fmt: skip
    assert code == 0, stdout + stderr
    assert f"0 failed, 0 errors, 0 unsupported (of {len(PACKED.seqlens)} results)" in stdout
    record = json.loads((tmp_path / "tolerance.json").read_text())
    assert [case["spec"]["name"] for case in record["cases"]] == [f"{PACKED.name}/{i}" for i in range(len(PACKED.seqlens))]
    assert all(case["packed"] == PACKED.to_dict() for case in record["cases"])
    assert CaseResult.from_dict(record["cases"][0]).packed == PACKED
    timing = {line.split()[0]: line.split()[1:] for line in stdout.splitlines() if line.startswith(f"{PACKED.name}/")}
    kernel_seconds = [row[0] for _, row in sorted(timing.items())]
    assert kernel_seconds[0] != "-" and set(kernel_seconds[1:]) == {"-"}, "the batch's one call is timed once"


def test_a_varlen_bug_fails_the_packed_case_and_its_reproduction_reruns_the_batch():
    """Keys leaking from the next packed sequence fail the packed case; the reproduction line names the whole
    batch (with its seqlens), and ``repro`` runs it through the varlen entry points again."""
    code, stdout, _ = _cli("run", "--kernel", "tests.breakers:VARLEN_OVERRUN", "--case", PACKED.name)
    assert code == 1 and f"{PACKED.name}/0" in stdout
    assert "a sequence of a packed batch, checked through the varlen entry points" in stdout
    reproduction = next(line for line in stdout.splitlines() if "reproduce:" in line)
    spec = reproduction.split("--case '")[1].rstrip("'")
    assert json.loads(spec) == PACKED.to_dict()
    code, stdout, _ = _cli("repro", "--kernel", "tests.breakers:VARLEN_OVERRUN", "--case", spec)
    assert code == 1 and f"{PACKED.name}/0:" in stdout and "mismatches the golden" in stdout
    code, stdout, _ = _cli("repro", "--kernel", "tests.test_cli_run:VARLEN_BY_LOOP", "--case", spec)
    assert code == 0, stdout


def test_the_fixed_set_catches_windows_read_as_flash_attn_reads_them():
    """The two cases whose right bound lies past seqlen_k fail, one with rows that must see no key (so its
    message says the mask hides every key there); every other fixed case has the same window either way."""
    code, stdout, _ = _cli("run", "--kernel", "tests.test_cli_run:FLASH_ATTN_WINDOWS")
    assert code == 1
    assert f"{len(DENSE) - 2} passed, 2 failed, 0 errors, 1 unsupported" in stdout
    failed = {json.loads(line.split("case: ", 1)[1])["name"] for line in stdout.splitlines() if "  case: {" in line}
    assert failed == {"fp16-right-window-past-keys", "bf16-window-past-keys-gqa"}, stdout
    assert "sees no key under the case's mask" in stdout


def test_repro_runs_one_case():
    spec = json.dumps(FIXED_CASES[1].to_dict())
    code, stdout, _ = _cli("repro", "--kernel", "reference", "--case", spec)
    assert code == 0
    assert FIXED_CASES[1].name in stdout and "normalized" in stdout and "worst" in stdout


def test_repro_of_a_failure_exits_1_with_its_description():
    spec = json.dumps(FIXED_CASES[1].to_dict())
    code, stdout, _ = _cli("repro", "--kernel", "tests.mutants:LSE_BASE2", "--case", spec)
    assert code == 1 and "lse (float32) mismatches the golden" in stdout


@pytest.mark.parametrize(
    "case, message",
    [("{not json", "--case: not valid JSON"), ("[1, 2]", "--case: case spec is a list, expected a JSON object"),
     ('{"batch": 1}', "--case: case spec lacks the required fields"), ('{"colour": 1}', "unknown fields ['colour']")],
)
def test_repro_rejects_a_bad_case_in_one_line(case, message):
    code, _, stderr = _cli("repro", "--kernel", "reference", "--case", case)
    assert code == 2 and stderr.count("\n") == 1 and message in stderr


def test_console_entry_point_exit_code():
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [sys.executable, "-m", "fa2_verify", "run", "--kernel", "no-such-kernel"],
        capture_output=True, text=True, env=environment, cwd=REPO, timeout=120,
    )
    assert completed.returncode == 2
    assert completed.stderr.startswith("fa2-verify: error: unknown kernel") and completed.stderr.count("\n") == 1


def test_bounds_check_without_the_interpreter_is_one_line_exit_2(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, stdout, stderr = _cli("run", "--kernel", "reference", "--bounds-check")
    assert code == 2 and stdout == "" and stderr.count("\n") == 1
    assert "--bounds-check needs TRITON_INTERPRET=1" in stderr


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_bounds_check_makes_a_stray_read_an_error_that_passes_without_it():
    """tests/stray_read.py reads one element before q; only --bounds-check sees it."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "fa2_verify", "run", "--kernel", "tests.stray_read:KERNEL", "--case",
               "fp32-causal"]
    unchecked = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=REPO, timeout=300)
    assert unchecked.returncode == 0, unchecked.stdout + unchecked.stderr
    checked = subprocess.run([*command, "--bounds-check"], capture_output=True, text=True, env=environment, cwd=REPO,
                             timeout=300)
    assert checked.returncode == 1
    assert "outside every tensor argument, the first 4 bytes before the nearest one" in checked.stdout
