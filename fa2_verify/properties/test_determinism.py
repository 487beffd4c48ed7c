"""Run-to-run determinism: the same inputs give the same bits, except dQ's bounded atomic spread.

FA2's backward (Dao 2023, Algorithm 2) accumulates dQ across key blocks with
atomic adds in a run-dependent order; dK and dV, and the forward, have one
writer per element and a fixed order.  docs/error-model.md, "Determinism of
atomic dQ", derives the spread bound.
"""

from hypothesis import strategies as st

from fa2_verify.properties import determinism_checks
from fa2_verify.properties.declaration import declare

#: Extra calls per example: each is compared with the first.
REPEATS = st.integers(1, 3)


@declare(breaker="tests.breakers:NOISY_FORWARD")
def test_forward_bitwise_reproducible(suite, data):
    """bits(out_r, lse_r) = bits(out_0, lse_0) for every repeated forward call r."""
    spec = data.draw(suite.cases(), label="case")
    determinism_checks.reproducible(suite, spec, ("out", "lse"), data.draw(REPEATS, label="repeats"))


@declare(breaker="tests.breakers:NOISY_DK_DV", requires=("backward",))
def test_dk_dv_bitwise_reproducible(suite, data):
    """bits(dk_r, dv_r) = bits(dk_0, dv_0) for every repeated backward call r (default mode).

    MHA cases only for a kernel that sums a GQA group's dK, dV in an unspecified
    order (``Capabilities.gqa_dkv_reproducible=False``).
    """
    spec = data.draw(suite.cases(backward=True, gqa=suite.kernel.capabilities.gqa_dkv_reproducible), label="case")
    determinism_checks.reproducible(suite, spec, ("dk", "dv"), data.draw(REPEATS, label="repeats"))


@declare(breaker="tests.breakers:NOISY_DQ", requires=("backward",))
def test_dq_spread_within_atomic_bound(suite, data):
    """|dq_r - dq_0| <= 2 gamma_{N-1} (1 + 1/8) M + ulp(dq) elementwise (docs/error-model.md)."""
    spec = data.draw(suite.cases(backward=True), label="case")
    determinism_checks.dq_spread_bounded(suite, spec, data.draw(REPEATS, label="repeats"))


@declare(breaker="tests.breakers:NOISY_DK_DV", requires=("deterministic_backward",))
def test_gradients_bitwise_reproducible_in_deterministic_mode(suite, data):
    """bits(dq_r, dk_r, dv_r) = bits(dq_0, dk_0, dv_0) for every repeated call with deterministic=True."""
    spec = data.draw(suite.cases(backward=True, deterministic=True), label="case")
    determinism_checks.reproducible(suite, spec, ("dq", "dk", "dv"), data.draw(REPEATS, label="repeats"))
