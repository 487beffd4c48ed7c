"""Around each property test's run: skipped as unsupported, timed by its share, observed for the summary.

A property needing a capability the kernel lacks is skipped at setup with the
reason (:func:`skip_unsupported`).  Its call (:func:`around_call`) runs under
its share of ``--fa2-time-budget`` (:mod:`properties.pacing`: the test ends
once its share is spent, reporting the examples it ran); what it observed goes
to the summary (:mod:`properties.summary`) and its results to Allure
(:mod:`properties.allure_results`).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from fa2_verify.properties import options as suite_options
from fa2_verify.properties.allure_results import record_test
from fa2_verify.properties.collection import is_property
from fa2_verify.properties.declaration import attached_dtype, attached_property
from fa2_verify.properties.summary import OBSERVED, UNSUPPORTED

if TYPE_CHECKING:
    from fa2_verify.properties.session import Suite


def _suite(item: pytest.Function) -> Suite:
    """The property test's ``fa2_suite`` fixture (the plugin's :class:`~properties.session.Suite`)."""
    from fa2_verify.properties.session import Suite

    suite = item.funcargs["fa2_suite"]
    assert isinstance(suite, Suite), "the plugin's fa2_suite fixture is a Suite"
    return suite


def skip_unsupported(item: pytest.Item) -> None:
    """After setup: skip a property test whose kernel lacks a capability it requires, naming the reason."""
    if is_property(item):
        from fa2_verify.properties.harness import missing_requirement

        reason = missing_requirement(attached_property(item.obj), _suite(item))
        if reason is not None:
            item.user_properties.append((UNSUPPORTED, reason))
            pytest.skip(f"unsupported: {reason}")


def around_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """The body of the ``pytest_runtest_call`` wrapper (``yield from`` it): a property test runs between
    :meth:`~properties.session.Suite.start_test`, with its time share, and
    :meth:`~properties.session.Suite.end_test`; a spent share ends it as a pass."""
    if not is_property(item):
        return (yield)
    from fa2_verify.properties.pacing import ShareSpent, time_share

    suite = _suite(item)
    budget = suite_options.of(item.config)["time_budget"]
    workers = getattr(item.config, "workerinput", {}).get("workercount", 1)
    tests = sum(map(is_property, item.session.items))
    suite.start_test(item.name, attached_dtype(item.obj), time_share(budget, tests, workers) if budget else None)
    try:
        return (yield)
    except ShareSpent:
        return None
    finally:
        item.user_properties.append((OBSERVED, json.dumps(suite.end_test())))
        record_test(item, suite, suite.take_results())
