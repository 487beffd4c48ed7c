"""The product and the lab apart (docs/design.md, "Layout").

``ci/`` holds only the product's CI: the files of :data:`PRODUCT_CI`, each
named (as ``ci/NAME``) by the GPU workflow, README.md or docs/*.md.  The
project's own measurements (device sessions, third-party builds, probes) live
in ``lab/``, every file of it named in lab/README.md, and no test imports
from ``lab``: the product's tests must pass without it.  docs/benchmarks.md
gives the current results only, in at most :data:`BENCHMARKS_PAGE_LINES`
lines; the earlier ones are in lab/benchmarks-history.md.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import pathlib
import re

import pytest

from tests.helpers import needs_shellcheck, shellcheck

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
LAB = ROOT / "lab"

#: Everything ``ci/`` may hold: what .github/workflows/gpu-verify.yml and a user's CI call, and what those read.
PRODUCT_CI = frozenset({
    "setup.sh", "properties.sh", "verify.sh", "report.sh", "gate.sh", "summary.sh", "common.sh",
    "main-job.sh", "durations.json", "allure-check.mjs", "package.json", "package-lock.json",
})
#: Not committed: what ``npm ci --prefix ci`` installs.
CI_IGNORED = frozenset({"node_modules"})
#: The most lines docs/benchmarks.md, the page of current results, may have.
BENCHMARKS_PAGE_LINES = 400
BENCHMARKS_HISTORY = "lab/benchmarks-history.md"


def lab_imports(path: pathlib.Path) -> list[str]:
    """What a module takes from ``lab``: ``import lab...``, ``from lab... import``, or a path built from ``"lab"``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "lab"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "lab":
            found.append(node.module)
        elif isinstance(node, ast.Constant) and node.value == "lab":
            found.append(f'"lab" (line {node.lineno})')
    return found


def unlisted_ci_files(ci: pathlib.Path) -> list[str]:
    """The entries of ``ci`` that are neither product CI nor ignored."""
    return sorted(entry.name for entry in ci.iterdir() if entry.name not in PRODUCT_CI | CI_IGNORED)


@functools.cache
def product_text() -> str:
    """Where the product's CI is named: the workflow, README.md and docs/*.md."""
    paths = [ROOT / ".github" / "workflows" / "gpu-verify.yml", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(path.read_text() for path in paths)


def page_overflow(path: pathlib.Path, limit: int) -> int:
    """How many lines ``path`` has beyond ``limit`` (0 when it fits)."""
    return max(0, len(path.read_text().splitlines()) - limit)


def unnamed_lab_files(lab: pathlib.Path) -> list[str]:
    """Files under ``lab`` whose name (or a backquoted glob matching it) lab/README.md does not give."""
    readme = (lab / "README.md").read_text()
    names = set(re.findall(r"`([^`\s]+)`", readme))
    files = (path for path in lab.rglob("*") if path.is_file() and "__pycache__" not in path.parts)
    return sorted(str(path.relative_to(lab)) for path in files
                  if path.name != "README.md" and not any(fnmatch.fnmatch(path.name, name) for name in names))


#: This module alone names ``lab``: it reads lab/README.md, and imports nothing from there.
TEST_MODULES = sorted(path for path in TESTS.glob("*.py") if path.name != pathlib.Path(__file__).name)


@pytest.mark.parametrize("path", TEST_MODULES, ids=lambda path: path.name)
def test_no_test_imports_from_the_lab(path):
    assert not lab_imports(path), f"tests/{path.name} takes {lab_imports(path)} from lab/"


def test_the_import_check_sees_each_way_into_the_lab(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import lab.probes.count_variants\nfrom lab.probes import probe_shapes\nROOT / 'lab'\n"
                      "from benchmarks import suite_time\nimport labels\n")
    assert lab_imports(module) == ["lab.probes.count_variants", "lab.probes", '"lab" (line 3)']


def test_ci_holds_only_the_products_ci():
    assert not unlisted_ci_files(ROOT / "ci"), (
        f"ci/ holds {unlisted_ci_files(ROOT / 'ci')}, not product CI: lab material goes to lab/ (lab/README.md)")


def test_the_ci_check_names_a_lab_script_left_in_ci(tmp_path):
    for name in (*PRODUCT_CI, "node_modules", "device-scale.sh", "flex-ci-rest.k"):
        (tmp_path / name).touch()
    assert unlisted_ci_files(tmp_path) == ["device-scale.sh", "flex-ci-rest.k"]


@pytest.mark.parametrize("name", sorted(PRODUCT_CI))
def test_each_product_ci_file_exists_and_is_named_by_the_workflow_or_the_docs(name):
    assert (ROOT / "ci" / name).is_file(), f"ci/{name} is listed as product CI but missing"
    assert f"ci/{name}" in product_text(), f"ci/{name}: neither the workflow nor README.md nor docs/ name it"


def test_the_workflow_calls_nothing_of_the_lab():
    assert "lab/" not in (ROOT / ".github" / "workflows" / "gpu-verify.yml").read_text()


def test_every_lab_file_is_described_in_its_readme():
    assert not unnamed_lab_files(LAB), f"lab/README.md says nothing of {unnamed_lab_files(LAB)}"


def test_the_readme_check_names_an_undescribed_lab_file(tmp_path):
    (tmp_path / "probes").mkdir()
    (tmp_path / "README.md").write_text("- `probe_a.py`: ...\n- `flex-*.k`: ...\n")
    for name in ("probes/probe_a.py", "probes/probe_b.py", "flex-ci.k"):
        (tmp_path / name).touch()
    assert unnamed_lab_files(tmp_path) == ["probes/probe_b.py"]


@needs_shellcheck
def test_lab_scripts_pass_shellcheck():
    """The lab's shell scripts stay linted like the product's (tests/test_workflow.py)."""
    completed = shellcheck(list(LAB.rglob("*.sh")))
    assert completed.returncode == 0, completed.stdout


def test_the_benchmarks_page_holds_current_results_within_its_limit():
    page = ROOT / "docs" / "benchmarks.md"
    assert not page_overflow(page, BENCHMARKS_PAGE_LINES), (
        f"docs/benchmarks.md is {page_overflow(page, BENCHMARKS_PAGE_LINES)} lines over {BENCHMARKS_PAGE_LINES}: "
        f"move superseded results to {BENCHMARKS_HISTORY}")
    assert (ROOT / BENCHMARKS_HISTORY).is_file() and BENCHMARKS_HISTORY in page.read_text()


def test_the_page_check_counts_the_lines_over_the_limit(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text("line\n" * 401)
    assert page_overflow(page, 400) == 1
    page.write_text("line\n" * 400)
    assert page_overflow(page, 400) == 0
