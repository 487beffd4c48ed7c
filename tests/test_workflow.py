"""Lint of the GPU workflow (.github/workflows/gpu-verify.yml) and of the scripts it calls (ci/*.sh).

The workflow must run the property suite on every GPU, keep the Hypothesis
example database, build the Allure report, gate against the committed
baseline and publish the Markdown summary, each step through a ci/*.sh script
that exists, is executable, runs under ``set -euo pipefail`` and passes
shellcheck.  The scripts also run by hand (no GitHub variables needed).  On
the nightly schedule the suite runs as N runner shards per kernel, whose
results one job per kernel merges (``verify`` runs on every other event).
"""

from __future__ import annotations

import fnmatch
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.helpers import needs_shellcheck, shellcheck

ROOT = pathlib.Path(__file__).resolve().parents[1]
CI = ROOT / "ci"
WORKFLOW = ROOT / ".github" / "workflows" / "gpu-verify.yml"
SCRIPT = re.compile(r"\bci/[\w.-]+\.sh\b")
ORDER = ("ci/setup.sh", "ci/properties.sh", "ci/verify.sh", "ci/report.sh", "ci/gate.sh", "ci/summary.sh")
#: The scripts of the nightly jobs: each shard runs its part of the suite, the report job the rest once.
SHARD_ORDER = ("ci/setup.sh", "ci/properties.sh")
REPORT_ORDER = ("ci/setup.sh", "ci/verify.sh", "ci/report.sh", "ci/gate.sh", "ci/summary.sh")


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def job(workflow) -> dict:
    """The job of pushes, pull requests and dispatches: the whole suite on one runner per kernel."""
    return workflow["jobs"]["verify"]


@pytest.fixture(scope="module")
def shard_job(workflow) -> dict:
    return workflow["jobs"]["nightly-shard"]


@pytest.fixture(scope="module")
def report_job(workflow) -> dict:
    return workflow["jobs"]["nightly-report"]


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


def test_every_step_is_named_and_is_one_action_or_one_script(workflow):
    assert set(workflow["jobs"]) == {"verify", "nightly-shard", "nightly-report"}
    for step in (step for job in workflow["jobs"].values() for step in job["steps"]):
        assert step.get("name"), step
        assert ("uses" in step) != ("run" in step), step
        if "run" in step:
            assert SCRIPT.fullmatch(step["run"].strip()), f"run: should call one ci/*.sh script, got {step['run']!r}"
        else:
            assert re.fullmatch(r"actions/[\w-]+(/[\w-]+)?@v\d+", step["uses"]), step["uses"]


def test_scripts_run_in_order_and_later_steps_run_after_a_failure(job, shard_job, report_job):
    for each, order in ((job, ORDER), (shard_job, SHARD_ORDER), (report_job, REPORT_ORDER)):
        assert _scripts(each) == list(order)
        for step in each["steps"]:
            if step.get("run", "").strip() in order[1:]:
                assert "!cancelled()" in step["if"] and "steps.setup.outcome == 'success'" in step["if"]


def test_every_called_script_exists_is_executable_and_strict(workflow):
    for script in {script for job in workflow["jobs"].values() for script in _scripts(job)}:
        path = ROOT / script
        assert path.is_file(), script
        assert os.access(path, os.X_OK), f"{script} is not executable"
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n"), script
        assert "\nset -euo pipefail\n" in text, script
        assert 'cd "$(dirname "$0")/.."' in text, f"{script} must run from any directory"


def test_suite_uses_xdist_workers_on_every_gpu_and_keeps_the_example_database(job):
    properties = (CI / "properties.sh").read_text()
    assert "gpus=$(nvidia-smi -L | wc -l)" in properties and "workers=$((gpus * per_gpu))" in properties
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
    assert 'results=("$FA2_OUT/allure-results")' in report and '"$FA2_VERIFY" report "${results[@]}"' in report


def test_node_tools_are_pinned(tmp_path):
    import json

    package = json.loads((CI / "package.json").read_text())
    assert package["dependencies"]["allure"].startswith("3.")
    assert re.fullmatch(r"\d+\.\d+\.\d+", package["dependencies"]["playwright-core"])
    lock = json.loads((CI / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/allure"]["version"] == package["dependencies"]["allure"]


@needs_shellcheck
def test_scripts_pass_shellcheck():
    """The workflow's scripts (the lab's are checked by tests/test_repository_layout.py)."""
    completed = shellcheck(list(CI.glob("*.sh")))
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


def test_report_script_by_hand_merges_the_shards_and_names_a_missing_one(tmp_path):
    """ci/report.sh with ``$FA2_OUT/shards/*/allure-results`` merges them into ``$FA2_OUT/allure-results``
    (Allure itself faked: ``$FA2_VERIFY_ALLURE``); without one of the shards it fails in one line."""
    from tests.test_allure_merge import shard_results
    from tests.test_report_allure import FAKE_ALLURE_3

    fake = tmp_path / "fake-allure"
    fake.write_text(FAKE_ALLURE_3)
    fake.chmod(0o755)
    for index in (1, 2):
        (tmp_path / "shards" / f"properties-reference-shard{index}").mkdir(parents=True)
        shard_results(tmp_path / "shards" / f"properties-reference-shard{index}" / "allure-results", f"{index}/2",
                      {f"test_{index}": "passed"})
    completed = _by_hand("report.sh", tmp_path, FA2_VERIFY_ALLURE=str(fake))
    assert completed.returncode == 0, completed.stderr
    assert len(list((tmp_path / "allure-results").glob("*-result.json"))) == 2
    assert (tmp_path / "allure-report" / "index.html").is_file()
    shutil.rmtree(tmp_path / "shards" / "properties-reference-shard2")
    completed = _by_hand("report.sh", tmp_path, FA2_VERIFY_ALLURE=str(fake))
    assert completed.returncode == 2 and completed.stderr.startswith("fa2-verify: error: shard 2/2 missing")


def test_triton_compile_cache_is_kept_between_runs(workflow, job):
    path = "${{ github.workspace }}/.triton-cache"
    assert job["env"]["TRITON_CACHE_DIR"] == path
    for action in ("actions/cache/restore@", "actions/cache/save@"):
        steps = [step for step in job["steps"] if step.get("uses", "").startswith(action)]
        assert any(step["with"]["path"] == path for step in steps), action


@pytest.mark.parametrize("name, saving", [("verify", 1), ("nightly-shard", 0), ("nightly-report", 1)])
def test_only_runs_on_main_save_the_golden_cache(workflow, name, saving):
    """A pull request restores main's golden cache and saves none, so it cannot poison what main restores
    (docs/reports-and-gate.md, "Keying the golden cache"); of the nightly jobs, the report job alone saves it."""
    job = workflow["jobs"][name]
    golden = [step for step in job["steps"] if step.get("with", {}).get("path") == ".fa2-golden-cache"]
    restores = [step for step in golden if step["uses"].startswith("actions/cache/restore@")]
    saves = [step for step in golden if step["uses"].startswith("actions/cache/save@")]
    assert len(restores) == 1 and len(saves) == saving
    assert all(save["if"] == "${{ !cancelled() && github.ref == 'refs/heads/main' }}" for save in saves)
    assert not any(step["uses"].startswith("actions/cache@") for step in job["steps"] if "uses" in step)


def test_each_event_runs_the_suite_once_the_nightly_one_over_shards(job, shard_job, report_job):
    """The schedule runs the ``nightly`` profile as N runner shards per kernel and nothing else; every other
    event the ``dev`` profile in the one ``verify`` job."""
    assert job["if"] == "${{ github.event_name != 'schedule' }}" and job["env"]["FA2_PROFILE"] == "dev"
    for nightly in (shard_job, report_job):
        assert "github.event_name == 'schedule'" in nightly["if"] and nightly["env"]["FA2_PROFILE"] == "nightly"
        assert nightly["strategy"]["matrix"]["kernel"] == job["strategy"]["matrix"]["kernel"]
        assert nightly["runs-on"] == job["runs-on"] and nightly["timeout-minutes"] <= 120
        assert nightly["env"]["FA2_OUT"] == job["env"]["FA2_OUT"] and nightly["env"]["FA2_DEVICE"] == "cuda"


def test_the_shard_matrix_covers_shards_1_to_n_of_one_split(shard_job):
    match = re.fullmatch(r"\$\{\{ matrix\.shard \}\}/(\d+)", shard_job["env"]["FA2_SHARD"])
    assert match is not None, shard_job["env"]["FA2_SHARD"]
    count = int(match.group(1))
    assert count >= 2 and shard_job["strategy"]["matrix"]["shard"] == list(range(1, count + 1))
    assert f"/{count}" in shard_job["name"] and shard_job["strategy"]["fail-fast"] is False
    properties = (CI / "properties.sh").read_text()
    assert '[[ -n "${FA2_SHARD:-}" ]] && checks=(--fa2-shard "$FA2_SHARD")' in properties
    assert "--fa2-durations ci/durations.json" in properties


def test_the_report_job_merges_every_shards_results_even_after_a_red_shard(shard_job, report_job):
    """Each shard uploads its Allure results (and JUnit file) as an artifact; the report job, which waits for
    every shard and runs even when one failed, downloads those of its kernel to ``$FA2_OUT/shards``, where
    ci/report.sh merges them (and names a missing shard)."""
    (upload,) = [step for step in shard_job["steps"] if step.get("with", {}).get("name", "").startswith("properties-")]
    assert upload["if"] == "${{ !cancelled() }}"
    assert upload["with"]["path"].splitlines() == ["ci-out/${{ matrix.kernel }}/allure-results",
                                              "ci-out/${{ matrix.kernel }}/properties.xml"]
    assert report_job["needs"] == "nightly-shard" and report_job["if"].startswith("${{ !cancelled() && ")
    (download,) = [step for step in report_job["steps"] if step.get("uses", "").startswith("actions/download-artifact@")]
    name = upload["with"]["name"].replace("${{ matrix.shard }}", "3")
    assert fnmatch.fnmatchcase(name, download["with"]["pattern"])
    assert not fnmatch.fnmatchcase(name.replace("${{ matrix.kernel }}", "other"), download["with"]["pattern"])
    assert download["with"]["path"] == report_job["env"]["FA2_OUT"] + "/shards"
    runs = [step.get("run", "").strip() for step in report_job["steps"]]
    assert report_job["steps"].index(download) < runs.index("ci/report.sh")
    report = (CI / "report.sh").read_text()
    assert 'results=("$FA2_OUT"/shards/*/allure-results)' in report
    assert 'merged=(--merged-results "$FA2_OUT/allure-results")' in report


def _fake_gpu_runner(tmp_path: pathlib.Path, **env: str) -> tuple[subprocess.CompletedProcess, pathlib.Path]:
    """ci/properties.sh on a stand-in GPU runner: an ``nvidia-smi`` that lists one GPU and a venv whose
    ``python`` logs its arguments and answers ``gpu_shares`` with ``$FAKE_WORKERS_PER_GPU``; its warm-up
    writes its pid and sleeps ``$FAKE_WARMUP_SECONDS``, its pytest waits for that pid."""
    bin_dir, venv_bin = tmp_path / "bin", tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    venv_bin.mkdir(parents=True)
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'GPU 0: stand-in'\n")
    (venv_bin / "python").write_text(
        "#!/usr/bin/env bash\n"
        'echo "$*" >>"$FAKE_LOG"\n'
        'if [[ "$*" == "-m fa2_verify.properties.gpu_shares "* ]]; then echo "$FAKE_WORKERS_PER_GPU"; exit 0; fi\n'
        'if [[ "$*" == *" warmup "* ]]; then echo $$ >"$FAKE_PID"; exec sleep "$FAKE_WARMUP_SECONDS"; fi\n'
        'for _ in $(seq 50); do [[ -s "$FAKE_PID" ]] && break; sleep 0.1; done\n'
    )
    for tool in (bin_dir / "nvidia-smi", venv_bin / "python"):
        tool.chmod(0o755)
    variables = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FA2_DEVICE": "cuda",
                 "FA2_VENV": str(tmp_path / "venv"), "FA2_OUT": str(tmp_path / "out"), "FA2_KERNEL": "triton",
                 "FA2_PROFILE": "scale", "FA2_WORKERS_PER_GPU": "1", "FAKE_LOG": str(tmp_path / "log"),
                 "FAKE_PID": str(tmp_path / "pid"), "FAKE_WARMUP_SECONDS": "60", "FAKE_WORKERS_PER_GPU": "3", **env}
    run = subprocess.run(["bash", str(CI / "properties.sh")], env=variables, capture_output=True, text=True,
                         timeout=60)
    return run, tmp_path


def test_a_background_warmup_runs_beside_the_suite_and_stops_with_it(tmp_path):
    run, out = _fake_gpu_runner(tmp_path, FA2_WARMUP="background")
    assert run.returncode == 0, run.stderr
    calls = (out / "log").read_text().splitlines()
    idle = max(len(os.sched_getaffinity(0)) - 1, 1)
    assert f"-m fa2_verify warmup --profile scale --processes {idle}" in calls
    assert any(call.startswith("-m pytest --pyargs fa2_verify.properties -n 1 ") for call in calls)
    pid = int((out / "pid").read_text())
    for _ in range(50):
        if not pathlib.Path(f"/proc/{pid}").exists():
            break
        subprocess.run(["sleep", "0.1"], check=True)
    assert not pathlib.Path(f"/proc/{pid}").exists(), "the warm-up outlived the suite"


def test_workers_per_gpu_come_from_the_profile_unless_set(tmp_path):
    """Unset, FA2_WORKERS_PER_GPU is what ``gpu_shares`` answers for the profile (3 here); set, it wins."""
    started = tmp_path / "no-warm-up"
    started.write_text("0\n")  # no warm-up to wait for
    run, out = _fake_gpu_runner(tmp_path / "auto", FA2_WORKERS_PER_GPU="", FAKE_PID=str(started))
    assert run.returncode == 0, run.stderr
    calls = (out / "log").read_text().splitlines()
    assert "-m fa2_verify.properties.gpu_shares scale" in calls
    assert any(call.startswith("-m pytest --pyargs fa2_verify.properties -n 3 ") for call in calls)
    run, out = _fake_gpu_runner(tmp_path / "set", FA2_WORKERS_PER_GPU="2", FAKE_PID=str(started))
    calls = (out / "log").read_text().splitlines()
    assert not any("gpu_shares" in call for call in calls)
    assert any(call.startswith("-m pytest --pyargs fa2_verify.properties -n 2 ") for call in calls)


def test_a_background_warmup_that_ended_first_leaves_the_suite_status_alone(tmp_path):
    run, _ = _fake_gpu_runner(tmp_path, FA2_WARMUP="background", FAKE_WARMUP_SECONDS="0")
    assert run.returncode == 0, run.stderr


def test_properties_refuses_an_unknown_warmup_mode(tmp_path):
    run, _ = _fake_gpu_runner(tmp_path, FA2_WARMUP="soon")
    assert run.returncode == 2 and "FA2_WARMUP=soon: use 0, 1 or background" in run.stderr
