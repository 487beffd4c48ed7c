"""A mask error and a value error are failures of different classes, so one does not hide the other.

Hypothesis tells failures apart by exception type and place, and reports each
with its own minimal example.  A kernel with two bugs, one letting rows that
see no key attend keys (flash-attn's right-bound window finding,
docs/targets.md) and one getting visible rows wrong, is reported twice by one
search of ``test_out_within_error_model``'s check: a
:class:`~properties.declaration.MaskFailure` and a plain
:class:`~properties.declaration.PropertyFailure`.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import UNBOUNDED
from fa2_verify.kernels.reference import DEFERRED
from fa2_verify.properties import golden_checks, profiles
from fa2_verify.properties.declaration import MaskFailure, PropertyFailure
from fa2_verify.properties.session import Suite
from fa2_verify.verify.registry import LoadedKernel

#: Rows 0 and 1 of 3 see no key (window (-1, 0), 1 key): only the mask bug shows.
HIDDEN_ROWS = CaseSpec(1, 3, 1, 1, 1, 16, "float32", window_size=(-1, 0), seed=1, backward=False)
#: Every row sees every key, 7 of them: only the value bug shows.
SEVEN_KEYS = CaseSpec(1, 4, 7, 1, 1, 16, "float32", seed=2, backward=False)


class TwoBugs:
    """The reference, except that a row that sees no key averages every value (as if unmasked), and that
    the output is 1% too large when there are exactly 7 keys."""

    capabilities = DEFERRED.capabilities

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        out, lse = DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        hidden = torch.isneginf(lse).transpose(1, 2)[..., None]  # (batch, seqlen_q, heads, 1)
        if k.shape[1]:
            mean = v.float().mean(dim=1, keepdim=True).repeat_interleave(q.shape[2] // k.shape[2], dim=2)
            out = torch.where(hidden, mean.to(out.dtype), out)
        if k.shape[1] == SEVEN_KEYS.seqlen_k:
            out = out * 1.01
        return out, lse


@pytest.fixture
def suite() -> Suite:
    return Suite(LoadedKernel("tests.test_failure_classes:TwoBugs", TwoBugs()), "cpu", profiles.get("ci"))


def _search(suite: Suite, specs: list[CaseSpec]) -> None:
    """Hypothesis' search (shrinking, every bug reported) over ``specs`` with the check of ``out``."""

    @settings(database=None, max_examples=10, report_multiple_bugs=True, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(specs))
    def search(spec: CaseSpec) -> None:
        golden_checks.against_golden(suite, spec, "out")

    search()


@pytest.mark.parametrize("spec, expected", [(HIDDEN_ROWS, MaskFailure), (SEVEN_KEYS, PropertyFailure)])
def test_each_bug_fails_with_its_class(suite, spec, expected):
    with pytest.raises(PropertyFailure) as raised:
        _search(suite, [spec])
    assert type(raised.value) is expected
    assert ("sees no key under the case's mask" in str(raised.value)) == (expected is MaskFailure)


def test_one_search_reports_both_bugs(suite):
    with pytest.raises(ExceptionGroup) as raised:
        _search(suite, [HIDDEN_ROWS, SEVEN_KEYS])
    assert sorted(type(error).__name__ for error in raised.value.exceptions) == ["MaskFailure", "PropertyFailure"]
