"""Every output of the kernel against the mpmath golden, under the error model's thresholds.

``B`` is the first-order bound of docs/error-model.md (equations 2, 3, 8, 9
and 7 for out, lse, dq, dk and dv) and ``tau`` its threshold
(``verify.error_model.THRESHOLDS``); ``x*`` is the golden value.
"""

from hypothesis import strategies as st

from fa2_verify.core.layouts import VALUE_KEEPING_JOINT_LAYOUTS, layouts_for
from fa2_verify.properties import golden_checks
from fa2_verify.properties.declaration import declare


@declare(breaker="tests.mutants:SKIP_RESCALE")
def test_out_within_error_model(suite, data):
    """|out - out*| <= tau_out * B^O, elementwise (eq. 2)."""
    spec = data.draw(suite.cases(), label="case")
    golden_checks.against_golden(suite, spec, "out")


@declare(breaker="tests.mutants:LSE_BASE2", requires=("lse",))
def test_lse_within_error_model(suite, data):
    """|lse - lse*| <= tau_lse * B^L, rowwise; lse = +-inf exactly on rows that see no key (eq. 3)."""
    spec = data.draw(suite.cases(), label="case")
    golden_checks.against_golden(suite, spec, "lse")


@declare(breaker="tests.mutants:DQ_MISSING_SCALE", requires=("backward",))
def test_dq_within_error_model(suite, data):
    """|dq - dq*| <= tau_dq * B^dQ, elementwise (eq. 8)."""
    spec = data.draw(suite.cases(backward=True, deterministic=None), label="case")
    golden_checks.against_golden(suite, spec, "dq")


@declare(breaker="tests.mutants:DELTA_FROM_ROUNDED", requires=("backward",))
def test_dk_within_error_model(suite, data):
    """|dk - dk*| <= tau_dk * B^dK, elementwise (eq. 9)."""
    spec = data.draw(suite.cases(backward=True, deterministic=None), label="case")
    golden_checks.against_golden(suite, spec, "dk")


@declare(breaker="tests.mutants:DK_DV_GQA_NOT_SUMMED", requires=("backward",))
def test_dv_within_error_model(suite, data):
    """|dv - dv*| <= tau_dv * B^dV, elementwise (eq. 7)."""
    spec = data.draw(suite.cases(backward=True, deterministic=None), label="case")
    golden_checks.against_golden(suite, spec, "dv")


@declare(breaker="tests.mutants:EMPTY_ROW_NAN")
def test_outputs_finite_where_golden_finite(suite, data):
    """isfinite(x*) => isfinite(x) for every output x, with outputs allocated from NaN-poisoned memory."""
    spec = data.draw(suite.cases(backward=suite.kernel.capabilities.backward), label="case")
    golden_checks.finite_where_golden_finite(suite, spec)


@declare(breaker="tests.breakers:VARLEN_OVERRUN", requires=("varlen",))
def test_varlen_outputs_within_error_model(suite, data):
    """For each packed sequence s (empty ones included): |x_s - x_s*| <= tau_x * B^x_s for every output x,
    the packed inputs contiguous or in a non-contiguous layout (shrinking toward contiguous), NaN around them."""
    spec = data.draw(suite.varlen_cases(backward=suite.kernel.capabilities.backward), label="varlen case")
    golden_checks.varlen_within_error_model(suite, spec, data.draw(
        st.sampled_from(layouts_for(suite.kernel.capabilities) + VALUE_KEEPING_JOINT_LAYOUTS), label="layout"))
