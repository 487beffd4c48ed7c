"""The Allure 3 HTML report, opened in headless Chromium: the error histograms are there and render.

Needs Node.js with ``npm ci --prefix ci`` done (Allure 3 and playwright-core in
``ci/node_modules``) and Chromium (Debian: ``apt-get install chromium``); the
test is skipped, saying which is missing, otherwise.  ``ci/allure-check.mjs``
serves the report on 127.0.0.1, opens each property test's attachments,
expands every ``error histogram: <output>`` PNG and waits until it decodes.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from tests.helpers import ROOT, run_inner_suite
from fa2_verify.cli import main as cli
from fa2_verify.records.allure_report import CHECKOUT_ALLURE

CHECK_SCRIPT = ROOT / "ci" / "allure-check.mjs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed (apt-get install nodejs npm)"
    if not CHECKOUT_ALLURE.exists() or not (ROOT / "ci" / "node_modules" / "playwright-core").is_dir():
        return "Allure 3 / playwright-core are not installed: run `npm ci --prefix ci`"
    if not pathlib.Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def test_report_shows_the_error_histograms_in_headless_chromium(tmp_path, capsys):
    results = run_inner_suite(tmp_path)
    report = tmp_path / "allure-report"
    assert cli.main(["report", str(results), "--out", str(report)]) == 0
    assert f"wrote {report / 'index.html'}" in capsys.readouterr().out
    screenshot = tmp_path / "allure-report.png"
    completed = subprocess.run(
        ["node", str(CHECK_SCRIPT), str(report), "--screenshot", str(screenshot), "--chromium", CHROMIUM],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    summary = json.loads(completed.stdout)
    assert summary["testsWithHistograms"] == 1
    (checked,) = summary["checked"]
    assert checked["name"] == "test_outputs_match_golden"
    assert [image["name"] for image in checked["rendered"]] == [
        f"error histogram: {output}" for output in ("out", "lse", "dq", "dk", "dv")
    ]
    assert all(image["width"] >= 600 and image["height"] >= 200 for image in checked["rendered"])
    assert screenshot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_check_fails_on_a_report_without_histograms(tmp_path):
    report = tmp_path / "empty-report"
    (report / "data" / "test-results").mkdir(parents=True)
    (report / "index.html").write_text("<html></html>")
    completed = subprocess.run(
        ["node", str(CHECK_SCRIPT), str(report), "--chromium", CHROMIUM], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 1
    assert "no test result" in json.loads(completed.stdout)["error"]
