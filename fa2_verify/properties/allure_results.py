"""The property suite in Allure's results (``--alluredir``): one result per property test, and the run described.

Each property test gives one Allure result, whatever the number of examples
it checked (:func:`record_test`, :func:`records.allure_report.record_property_test`);
the run's kernel, device, profile, dtypes and runner shard are written for
``fa2-verify report`` to merge the shards of one run (:func:`describe_run`,
:mod:`records.allure_merge`).
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

import pytest

from fa2_verify.core.runner_shard import WHOLE_RUN
from fa2_verify.properties import options as suite_options

if TYPE_CHECKING:
    from fa2_verify.properties.session import Suite
    from fa2_verify.verify.results import CaseResult


def record_test(item: pytest.Item, suite: Suite, results: list[CaseResult]) -> None:
    """Under ``--alluredir``, ``item``'s results as its one Allure result."""
    if item.config.getoption("allure_report_dir", None):
        from fa2_verify.records import allure_report

        allure_report.record_property_test(item.name, results, kernel=suite.kernel.name, device=suite.device)


def describe_run(session: pytest.Session) -> None:
    """Under ``--alluredir``, describe a property run in its Allure results (not on an xdist worker): kernel,
    device, profile, dtypes and runner shard, what ``fa2-verify report`` checks before merging the results
    of several shards (:mod:`records.allure_merge`)."""
    config = session.config
    alluredir = config.getoption("allure_report_dir", None)
    options = suite_options.of(config) if suite_options.configured(config) else None
    if not alluredir or options is None or options["kernel"] is None or hasattr(config, "workerinput"):
        return
    from fa2_verify.records.allure_merge import write_run

    dtypes = options["dtypes"]
    write_run(pathlib.Path(alluredir), {
        "kernel": options["kernel"], "device": options["run_device"], "profile": options["profile"],
        "dtypes": ",".join(dtypes) if dtypes is not None else "all the kernel runs",
        "shard": str(options["shard"] or WHOLE_RUN),
    })
