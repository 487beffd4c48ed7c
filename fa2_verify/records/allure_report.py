"""Allure: one result per property test with its error distributions, and the HTML report.

Under ``pytest --alluredir DIR`` (allure-pytest), a property test that checked
many Hypothesis examples calls :func:`record_property_test` once, after its
last example, with every :class:`~verify.results.CaseResult` it produced.
That adds to the test's single Allure result

* labels ``kernel``, ``device``, and one ``dtype`` and one ``feature`` label
  per value seen (:meth:`core.case.CaseSpec.feature`);
* parameters ``kernel``, ``device``, ``examples`` (cases compared) and
  ``unsupported`` (cases skipped with their reason), the last two excluded
  from Allure's history id, so a test keeps its history across runs;
* one PNG per output: the normalized-error and ULP histograms over every
  example (:func:`records.plots.histogram_png`; docs/error-model.md);
* the data as CSV (one row per case and output, with quantiles) and as JSON
  (every :meth:`CaseResult.to_dict`); each CSV row ends with its case spec
  JSON, the argument of ``fa2-verify repro --case``.

Without ``--alluredir`` nothing is drawn or attached.  :func:`generate_html`
turns a results directory (or the merged results of several runner shards,
:mod:`records.allure_merge`) into an HTML report with Allure 3 (the npm package
``allure``; ``npm ci --prefix ci`` installs the pinned version into
``ci/node_modules``).
"""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fa2_verify.core.errors import ReportError, UsageError
from fa2_verify.records import allure_merge
from fa2_verify.core.outputs import check_output_directory, directory_replacing
from fa2_verify.verify.metrics import QUANTILES

if TYPE_CHECKING:
    from fa2_verify.verify.results import CaseResult

#: The Allure 3 CLI installed by ``npm ci --prefix ci`` in a source checkout.
CHECKOUT_ALLURE = pathlib.Path(__file__).resolve().parents[2] / "ci" / "node_modules" / ".bin" / "allure"

#: Environment variable naming the Allure 3 executable (overrides the lookup).
ALLURE_ENV = "FA2_VERIFY_ALLURE"

#: Seconds ``allure generate`` may take.
GENERATE_TIMEOUT = 600


def active() -> bool:
    """True when an Allure listener is registered (pytest ran with ``--alluredir``)."""
    from allure_commons import plugin_manager

    return bool(plugin_manager.hook.attach_data.get_hookimpls())


def _distinct(values) -> list[str]:
    return sorted(set(values))


def label_test(results: Sequence[CaseResult], *, kernel: str, device: str) -> None:
    """Labels and parameters of the running test (see the module docstring)."""
    import allure

    allure.dynamic.label("kernel", kernel)
    allure.dynamic.label("device", device)
    specs = [result.spec for result in results]
    for dtype in _distinct(spec.dtype for spec in specs):
        allure.dynamic.label("dtype", dtype)
    for feature in _distinct(spec.feature() for spec in specs):
        allure.dynamic.label("feature", feature)
    allure.dynamic.parameter("kernel", kernel)
    allure.dynamic.parameter("device", device)
    examples = sum(bool(result.comparisons) for result in results)
    unsupported = sum(result.status == "unsupported" for result in results)
    allure.dynamic.parameter("examples", examples, excluded=True)
    allure.dynamic.parameter("unsupported", unsupported, excluded=True)


def distributions_csv(results: Sequence[CaseResult]) -> str:
    """One row per (case, output): verdict, sizes, and normalized-error and ULP quantiles."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    quantile_columns = [f"{metric}_{name}" for metric in ("normalized", "ulp") for name in QUANTILES]
    writer.writerow(
        [
            "case",
            "dtype",
            "feature",
            "status",
            "output",
            "numel",
            "mismatches",
            "nonfinite",
            "threshold",
            *quantile_columns,
            "flash_ratio",
            "spec",
        ]
    )
    for result in results:
        spec = result.spec
        for output, comparison in result.comparisons.items():
            quantiles = [
                getattr(comparison, metric).quantiles[name] for metric in ("normalized", "ulp") for name in QUANTILES
            ]
            writer.writerow(
                [
                    spec.name,
                    spec.dtype,
                    spec.feature(),
                    result.status,
                    output,
                    comparison.numel,
                    comparison.mismatches,
                    comparison.nonfinite,
                    comparison.threshold,
                    *(f"{value:.6g}" for value in quantiles),
                    "" if comparison.flash_ratio is None else f"{comparison.flash_ratio:.6g}",
                    json.dumps(spec.to_dict(), sort_keys=True),
                ]
            )
    return buffer.getvalue()


def attach_distributions(test_name: str, results: Sequence[CaseResult]) -> None:
    """Attach the histogram PNG of each output and the CSV/JSON data to the running test, once."""
    import allure

    from fa2_verify.records.plots import histogram_png

    by_output: dict[str, list] = {}
    for result in results:
        for output, comparison in result.comparisons.items():
            by_output.setdefault(output, []).append(comparison)
    for output, comparisons in by_output.items():
        allure.attach(
            histogram_png(output, comparisons, title=test_name),
            name=f"error histogram: {output}",
            attachment_type=allure.attachment_type.PNG,
        )
    if by_output:
        allure.attach(
            distributions_csv(results), name="error quantiles.csv", attachment_type=allure.attachment_type.CSV
        )
    allure.attach(
        json.dumps({"test": test_name, "cases": [result.to_dict() for result in results]}, indent=1, default=str),
        name="case results.json",
        attachment_type=allure.attachment_type.JSON,
    )


def distinct_cases(results: Sequence[CaseResult]) -> list[CaseResult]:
    """One result per case spec, the last one kept: Hypothesis replays and shrinks examples."""
    by_spec = {json.dumps(result.spec.to_dict(), sort_keys=True): result for result in results}
    return list(by_spec.values())


def record_property_test(test_name: str, results: Sequence[CaseResult], *, kernel: str, device: str) -> None:
    """Labels, parameters and attachments of one property test; a no-op without ``--alluredir``.

    Call it once per test, after its last example (e.g. from a
    ``pytest_runtest_call`` hook wrapper), with every result the test produced.
    """
    if not active():
        return
    results = distinct_cases(results)
    label_test(results, kernel=kernel, device=device)
    attach_distributions(test_name, results)


def find_allure(explicit: str | None = None) -> list[str]:
    """The command that runs Allure 3: ``explicit``, ``$FA2_VERIFY_ALLURE``, ``ci/node_modules``, or ``PATH``."""
    for candidate, source in ((explicit, "--allure"), (os.environ.get(ALLURE_ENV), f"${ALLURE_ENV}")):
        if candidate:
            resolved = shutil.which(candidate)
            if resolved is None:
                raise UsageError(f"{source}={candidate!r} is not an executable: point it at Allure 3's `allure`")
            return [resolved]
    if CHECKOUT_ALLURE.exists():
        return [str(CHECKOUT_ALLURE)]
    on_path = shutil.which("allure")
    if on_path is not None:
        return [on_path]
    raise ReportError(
        "Allure 3 is not installed: run `npm ci --prefix ci` in the fa2-verify checkout "
        f"(or `npm install allure@3`), or pass --allure PATH / set ${ALLURE_ENV}"
    )


def allure_version(command: list[str]) -> str:
    """``allure --version``; a non-3.x version (e.g. the Java Allure 2) is a :class:`ReportError`."""
    try:
        completed = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ReportError(f"cannot run {command[0]} --version: {exc}") from None
    version = completed.stdout.strip().splitlines()[-1] if completed.stdout.strip() else ""
    if completed.returncode != 0 or not version.startswith("3."):
        raise ReportError(
            f"{command[0]} is not Allure 3 (--version said {version or completed.stderr.strip()[:80]!r}): "
            "install it with `npm ci --prefix ci`"
        )
    return version


def generate_html(
    results: pathlib.Path | Sequence[pathlib.Path],
    out_dir: pathlib.Path,
    *,
    allure: str | None = None,
    name: str = "fa2-verify",
    overwrite: bool = False,
    merged_dir: pathlib.Path | None = None,
) -> pathlib.Path:
    """``allure generate RESULTS -o OUT``: the HTML report of an allure-results directory, or of the results
    of several runner shards of one run merged (:mod:`records.allure_merge`; ``merged_dir``: keep the merged
    results there too).  Everything is checked before anything is written."""
    merge = allure_merge.plan([results] if isinstance(results, (str, os.PathLike)) else results)
    inputs = [("results", directory) for directory in merge.directories]
    outputs = [("--out", pathlib.Path(out_dir)), ("--merged-results", merged_dir)]
    checked = {
        flag: _check_directory_output(path, overwrite, flag, inputs + [other for other in outputs if other[0] != flag])
        for flag, path in outputs if path is not None
    }
    command = find_allure(allure)
    allure_version(command)
    if merged_dir is not None:
        with directory_replacing(checked["--merged-results"]) as staging:
            allure_merge.write_merged(merge, staging)
        return _generate(command, merged_dir, checked["--out"], name)
    if len(merge.directories) == 1:
        return _generate(command, merge.directories[0], checked["--out"], name)
    with tempfile.TemporaryDirectory(prefix=".fa2-merged-results.") as scratch:
        allure_merge.write_merged(merge, pathlib.Path(scratch) / "results")
        return _generate(command, pathlib.Path(scratch) / "results", checked["--out"], name)


def _check_directory_output(
    path: pathlib.Path, overwrite: bool, flag: str, inputs: list[tuple[str, pathlib.Path | None]]
) -> pathlib.Path:
    """:func:`core.outputs.check_output_directory` of ``path`` against each of ``inputs``, the results read and
    the other directory written."""
    for label, where in inputs:
        if where is not None:
            check_output_directory(path, overwrite=overwrite, flag=flag, inputs={label: where})
    return pathlib.Path(path)


def _generate(command: list[str], results_dir: pathlib.Path, out_dir: pathlib.Path, name: str) -> pathlib.Path:
    """Run ``allure generate`` on ``results_dir`` into ``out_dir``, replacing it only once built."""
    with directory_replacing(out_dir) as staging:
        try:
            completed = subprocess.run(
                [*command, "generate", str(results_dir), "--output", str(staging), "--report-name", name],
                capture_output=True,
                text=True,
                timeout=GENERATE_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise ReportError(f"allure generate took longer than {GENERATE_TIMEOUT} s on {results_dir}") from None
        if completed.returncode != 0 or not (staging / "index.html").is_file():
            detail = (completed.stderr or completed.stdout).strip().splitlines()
            raise ReportError(
                f"allure generate failed (exit {completed.returncode}): {detail[-1] if detail else 'no output'}"
            )
    return out_dir / "index.html"
