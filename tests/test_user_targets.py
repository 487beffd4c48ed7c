"""A user's own kernel as a target: plain-dict capabilities with shape constraints, any autograd
function (``fa2_verify.autograd_target``), a kernel without an LSE, verified by ``fa2-verify run``.

The property suite on the same kernels runs end to end in tests/test_plugin.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fa2_verify
from fa2_verify.cli.main import main
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.contract import NO_BACKWARD_REASON, NO_LSE_REASON, Capabilities
from fa2_verify.core.errors import UsageError
from fa2_verify.core.varlen import VarlenSpec
from fa2_verify.properties import shapes
from fa2_verify.properties.cases import case_specs
from fa2_verify.properties.profiles import get as get_profile
from fa2_verify.verify.check import check_case
from fa2_verify.app.cases.fitting import fit_case, fit_head_dim, fitted_cases
from fa2_verify.app.cases.fixed import FIXED_CASES
from fa2_verify.verify.registry import LoadedKernel, load_kernel
from tests import user_kernels

CPU_FLOAT32 = {"dtypes": {"cpu": ["float32"]}, "head_dims": [16]}

BAD_CAPABILITIES = {
    "not-a-mapping": (["float32"], "capabilities=list is not valid: use a mapping"),
    "unknown-field": ({**CPU_FLOAT32, "seqlen_multiple": 16}, "unknown field(s) ['seqlen_multiple']"),
    "missing-head-dims": ({"dtypes": {"cpu": ["float32"]}}, "lacks the required field(s) ['head_dims']"),
    "unknown-dtype": ({**CPU_FLOAT32, "dtypes": {"cpu": ["fp8"]}}, "dtypes['cpu']=['fp8'] is not valid"),
    "dtypes-as-string": ({**CPU_FLOAT32, "dtypes": {"cpu": "float32"}}, "dtypes['cpu']='float32' is not valid"),
    "dtypes-as-int": ({**CPU_FLOAT32, "dtypes": {"cpu": 16}}, "dtypes['cpu']=16 is not valid"),
    "dtypes-nested-list": (
        {**CPU_FLOAT32, "dtypes": {"cpu": [["float32"]]}}, "dtypes['cpu']=[['float32']] is not valid"
    ),
    "notes-as-int": ({**CPU_FLOAT32, "notes": 5}, "notes=5 is not valid: use a list of strings"),
    "notes-null": ({**CPU_FLOAT32, "notes": None}, "notes=None is not valid: use a list of strings"),
    "device-head-dims-as-list": ({**CPU_FLOAT32, "device_head_dims": [64]}, "device_head_dims=[64] is not valid"),
    "dtypes-of-no-device-type": (
        {**CPU_FLOAT32, "dtypes": {"gpu": ["float16"]}}, "dtypes has the key 'gpu', not a device type: use cpu or cuda"
    ),
    "dtypes-of-a-device-index": (
        {**CPU_FLOAT32, "dtypes": {"cuda:0": ["float16"]}}, "dtypes has the key 'cuda:0', not a device type"
    ),
    "head-dims-of-no-device-type": (
        {**CPU_FLOAT32, "device_head_dims": {"GPU": [64]}}, "device_head_dims has the key 'GPU', not a device type"
    ),
    "head-dims-as-int": ({**CPU_FLOAT32, "head_dims": 16}, "head_dims=16 is not valid: use a list of integers"),
    "no-head-dims": ({**CPU_FLOAT32, "head_dims": []}, "head_dims=() is not valid: list at least one"),
    "flag-as-string": ({**CPU_FLOAT32, "causal": "yes"}, "causal='yes' is not valid: use true or false"),
    "multiple-zero": ({**CPU_FLOAT32, "seqlen_multiple_of": 0}, "seqlen_multiple_of=0 is not valid"),
    "multiple-one-side": ({**CPU_FLOAT32, "seqlen_multiple_of": {"q": 16}}, "seqlen_multiple_of={'q': 16} is not valid"),
    "negative-min": ({**CPU_FLOAT32, "min_seqlen": -1}, "min_seqlen=-1 is not valid"),
    "max-as-float": ({**CPU_FLOAT32, "max_seqlen": 64.0}, "max_seqlen=64.0 is not valid"),
    "no-multiple-below-max": (
        {**CPU_FLOAT32, "seqlen_multiple_of": 128, "max_seqlen": 100},
        "capabilities leave no sequence length to run",
    ),
    "min-above-max": ({**CPU_FLOAT32, "min_seqlen": 65, "max_seqlen": 64}, "capabilities leave no sequence length"),
    "equal-lcm-above-max": (
        {**CPU_FLOAT32, "seqlen_multiple_of": {"q": 48, "k": 64}, "equal_seqlens": True, "max_seqlen": 150},
        "capabilities leave no sequence length",
    ),
}


@pytest.mark.parametrize("mapping, message", BAD_CAPABILITIES.values(), ids=BAD_CAPABILITIES.keys())
def test_bad_capabilities_mapping_is_one_line_usage_error(mapping, message):
    with pytest.raises(UsageError) as info:
        Capabilities.from_mapping(mapping)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_capabilities_mapping_round_trips_through_as_dict():
    declared = Capabilities.from_mapping(
        {**CPU_FLOAT32, "seqlen_multiple_of": {"q": 16, "k": 32}, "min_seqlen": 16, "max_seqlen": 512, "lse": False}
    )
    assert declared.seqlen_multiple_of == (16, 32) and declared.head_dims == (16,)
    assert Capabilities.from_mapping(declared.as_dict()) == declared


SHAPE_REASONS = {
    "q-not-multiple": ({"seqlen_multiple_of": 16}, 17, 32, "seqlen_q=17 is not a multiple of 16"),
    "k-not-multiple-per-side": ({"seqlen_multiple_of": {"q": 1, "k": 64}}, 17, 32, "seqlen_k=32 is not a multiple of 64"),
    "below-min": ({"min_seqlen": 8}, 4, 8, "seqlen_q=4 is below min_seqlen=8"),
    "above-max": ({"max_seqlen": 64}, 64, 65, "seqlen_k=65 is above max_seqlen=64"),
    "unequal": ({"equal_seqlens": True}, 16, 32, "seqlen_q=16 != seqlen_k=32: the kernel needs equal sequence lengths"),
}


@pytest.mark.parametrize("fields, seqlen_q, seqlen_k, reason", SHAPE_REASONS.values(), ids=SHAPE_REASONS.keys())
def test_case_spec_unsupported_reason_honors_shape_constraints(fields, seqlen_q, seqlen_k, reason):
    capabilities = Capabilities.from_mapping({**CPU_FLOAT32, **fields})
    spec = CaseSpec(batch=1, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=1, heads_kv=1, head_dim=16, dtype="float32")
    assert spec.unsupported_reason(capabilities, "cpu") == reason
    fitted = fit_case(spec, capabilities, "cpu")
    assert fitted is not None and fitted.unsupported_reason(capabilities, "cpu") is None


def test_fit_case_rounds_lengths_up_and_keeps_the_rest():
    capabilities = Capabilities.from_mapping({**CPU_FLOAT32, "seqlen_multiple_of": {"q": 16, "k": 32}})
    spec = next(spec for spec in FIXED_CASES if spec.name == "bf16-causal-mqa-empty-rows")
    fitted = fit_case(spec, capabilities, "cpu")
    assert (fitted.seqlen_q, fitted.seqlen_k, fitted.head_dim) == (48, 32, 16)
    assert dataclasses.replace(fitted, seqlen_q=spec.seqlen_q, seqlen_k=spec.seqlen_k, head_dim=spec.head_dim) == spec
    equal = Capabilities.from_mapping({**CPU_FLOAT32, "seqlen_multiple_of": 16, "equal_seqlens": True})
    fitted_equal = fitted_cases(equal, FIXED_CASES, "cpu")
    assert all(s.seqlen_q == s.seqlen_k and s.seqlen_q % 16 == 0 for s in fitted_equal)
    assert {s.seqlen_q for s in fitted_equal} == {32, 48, 272}
    assert len(fitted_cases(equal, FIXED_CASES, "cpu")) == len(FIXED_CASES)


def test_fit_case_drops_a_deterministic_backward_the_kernel_lacks():
    spec = next(spec for spec in FIXED_CASES if spec.deterministic)
    without = Capabilities.from_mapping(CPU_FLOAT32)
    assert fit_case(spec, without, "cpu") == dataclasses.replace(spec, deterministic=False, head_dim=16)
    with_mode = Capabilities.from_mapping({**CPU_FLOAT32, "deterministic_backward": True})
    assert fit_case(spec, with_mode, "cpu").deterministic


def test_fit_head_dim_takes_the_next_supported_one():
    """A case's head dim moves up to the next one the kernel has (down to its largest past the end), per device."""
    assert [fit_head_dim(dim, (64, 96, 128)) for dim in (32, 64, 65, 100, 256)] == [64, 64, 96, 128, 128]
    capabilities = Capabilities.from_mapping({"dtypes": {"cpu": ["float32"], "cuda": ["float16"]}, "head_dims": [32, 40],
                                              "device_head_dims": {"cuda": [64]}})  # fmt: skip
    spec = next(spec for spec in FIXED_CASES if spec.name == "fp16-window-mqa")
    assert fit_case(spec, capabilities, "cpu") is spec and fit_case(spec, capabilities, "cuda").head_dim == 64


CONSTRAINED = {
    "multiple-of-128": {**CPU_FLOAT32, "seqlen_multiple_of": 128},
    "per-side-16-and-48": {**CPU_FLOAT32, "seqlen_multiple_of": {"q": 16, "k": 48}},
    "equal-multiple-of-8": {**CPU_FLOAT32, "seqlen_multiple_of": 8, "equal_seqlens": True},
    "between-20-and-40": {**CPU_FLOAT32, "min_seqlen": 20, "max_seqlen": 40},
}


@pytest.mark.parametrize("fields", CONSTRAINED.values(), ids=CONSTRAINED.keys())
def test_strategies_draw_only_supported_lengths(fields):
    capabilities = Capabilities.from_mapping(fields)
    limits = get_profile("ci").limits("cpu")

    @settings(max_examples=60, derandomize=True, database=None)
    @given(case_specs(capabilities=capabilities, device="cpu", limits=limits))
    def check(spec):
        assert spec.unsupported_reason(capabilities, "cpu") is None, spec

    check()


def test_multiple_of_128_is_drawn_beyond_a_smaller_profile_limit():
    """The CPU ci profile stops at 72 tokens (257 on the long side of an unbalanced pair); a kernel that
    needs multiples of 128 is still drawn at 128, and at 256 on an unbalanced pair's long side."""
    capabilities = Capabilities.from_mapping({**CPU_FLOAT32, "seqlen_multiple_of": 128})
    drawn = set()

    @settings(max_examples=30, derandomize=True, database=None)
    @given(shapes.seqlen_pairs(max_value=72, capabilities=capabilities))
    def collect(pair):
        drawn.add(pair)

    collect()
    assert (128, 128) in drawn and drawn <= {(128, 128), (128, 256), (256, 128)}


def test_boundary_lengths_are_rounded_to_the_multiple_not_dropped():
    drawn = set()

    @settings(max_examples=200, derandomize=True, database=None)
    @given(shapes.seqlens(min_value=1, max_value=200, multiple_of=16))
    def collect(length):
        drawn.add(length)

    collect()
    assert all(length % 16 == 0 for length in drawn)
    assert {16, 32, 64, 128, 144} <= drawn  # 1, 17, 33, 65, 129 rounded up


def test_prefix_rows_keep_both_prefix_lengths_supported():
    capabilities = Capabilities.from_mapping({**CPU_FLOAT32, "seqlen_multiple_of": 16})
    drawn = set()

    @settings(max_examples=30, derandomize=True, database=None)
    @given(shapes.prefix_rows(seqlen_q=48, seqlen_k=64, capabilities=capabilities))
    def collect(rows):
        drawn.add(rows)

    collect()
    assert drawn == {16, 32, 48}


BAD_AUTOGRAD_TARGETS = {
    "not-callable": (dict(fn=None), "fn=None is not callable"),
    "bad-layout": (dict(layout="sbhd"), "layout='sbhd' is not a layout: use one of bshd, bhsd"),
    "lse-not-callable": (dict(lse=3), "lse=3 is not callable"),
    "lse-base-10": (dict(lse=lambda returned: returned[1], lse_base=10), "lse_base=10 is not supported"),
    "lse-in-capabilities": (dict(capabilities={**CPU_FLOAT32, "lse": True}), "leave it out"),
    "varlen": (dict(capabilities={**CPU_FLOAT32, "varlen": True}), "autograd_target has no varlen entry points"),
    "bad-capabilities": (dict(capabilities={"head_dims": [16]}), "lacks the required field(s) ['dtypes']"),
}


@pytest.mark.parametrize("overrides, message", BAD_AUTOGRAD_TARGETS.values(), ids=BAD_AUTOGRAD_TARGETS.keys())
def test_bad_autograd_target_arguments_are_one_line_usage_errors(overrides, message):
    arguments = {"fn": user_kernels.bhsd_attention, "capabilities": CPU_FLOAT32, **overrides}
    with pytest.raises(UsageError) as info:
        fa2_verify.autograd_target(arguments.pop("fn"), **arguments)
    assert message in str(info.value) and "\n" not in str(info.value)


def _check(target, **fields) -> object:
    spec = CaseSpec(
        **{"batch": 1, "seqlen_q": 16, "seqlen_k": 32, "heads_q": 2, "heads_kv": 1, "head_dim": 16,
           "dtype": "float32", "causal": True, "seed": 3, **fields}
    )  # fmt: skip
    return check_case(LoadedKernel("user", target), make_case(spec))


def test_a_kernel_without_lse_reports_lse_unsupported_and_still_checks_the_rest():
    result = _check(user_kernels.BHSD_NO_LSE)
    assert result.status == "passed" and set(result.comparisons) == {"out", "dq", "dk", "dv"}
    assert result.skipped_outputs == {"lse": NO_LSE_REASON}


def _detached_v(q, k, v, *, causal=False, softmax_scale=None):
    """Broken on purpose: v is cut from the graph, so dv comes back 0."""
    return user_kernels.bhsd_attention(q, k, v.detach(), causal=causal, softmax_scale=softmax_scale)


def _natural_lse_called_base_two(q, k, v, **options):
    out, lse2 = user_kernels.multiple_of_16_attention(q, k, v, **options)
    return out, lse2 * math.log(2)


BROKEN = {
    "backward-through-autograd": (
        fa2_verify.autograd_target(_detached_v, layout="bhsd", capabilities={**CPU_FLOAT32, "window": False}),
        {"dv"},
    ),
    "lse-base-converted": (
        fa2_verify.autograd_target(
            _natural_lse_called_base_two, lse=lambda returned: returned[1], lse_base=2,
            capabilities={**CPU_FLOAT32, "window": False},
        ),
        {"lse"},
    ),  # fmt: skip
}


@pytest.mark.parametrize("target, failing", BROKEN.values(), ids=BROKEN.keys())
def test_an_autograd_target_with_a_broken_output_fails_on_it(target, failing):
    result = _check(target)
    assert result.status == "failed" and set(result.failed_outputs()) == failing


class _LseDespiteDeclaringNone:
    """Returns an LSE although its capabilities declare none: a broken contract."""

    capabilities = {**CPU_FLOAT32, "lse": False}

    def forward(self, q, k, v, **options):
        return load_kernel("reference").forward(q, k, v, **options)


def test_an_lse_from_a_kernel_declaring_none_is_an_error():
    result = _check(_LseDespiteDeclaringNone(), backward=False)
    assert result.status == "error" and "return None in its place, or declare lse=True" in result.reason


def _cli(*argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(list(argv))
    return code, stdout.getvalue(), stderr.getvalue()


def test_kernels_command_shows_shape_constraints_and_a_missing_lse(capsys):
    assert main(["kernels", "tests.user_kernels:BHSD_NO_LSE", "tests.user_kernels:MULTIPLE_OF_16"]) == 0
    out = capsys.readouterr().out
    assert f"constraint: lse: {NO_LSE_REASON}" in out
    assert "constraint: seqlen_q a multiple of 16, seqlen_k a multiple of 16" in out


def test_run_verifies_a_bhsd_autograd_kernel_without_lse(tmp_path):
    code, stdout, _ = _cli("run", "--kernel", "tests.user_kernels:BHSD_NO_LSE", "--report", str(tmp_path))
    assert code == 0
    assert "fp16-causal                    lse    float16" in stdout and f"unsupported: {NO_LSE_REASON}" in stdout
    report = json.loads((tmp_path / "tolerance.json").read_text())
    assert report["verdict"] == "passed" and not any(group["output"] == "lse" for group in report["groups"])
    assert any(entry["reason"] == f"lse: {NO_LSE_REASON}" for entry in report["unsupported"])


def test_run_verifies_the_forward_of_a_forward_only_kernel_and_reports_the_gradients_unchecked(tmp_path):
    code, stdout, _ = _cli("run", "--kernel", "tests.user_kernels:FORWARD_ONLY", "--report", str(tmp_path))
    assert code == 0
    assert "fp16-causal                    dq     float16" in stdout and f"unsupported: {NO_BACKWARD_REASON}" in stdout
    report = json.loads((tmp_path / "tolerance.json").read_text())
    assert report["verdict"] == "passed" and {group["output"] for group in report["groups"]} == {"out"}
    capabilities = load_kernel("tests.user_kernels:FORWARD_ONLY").capabilities
    runnable = [spec for spec in fitted_cases(capabilities, FIXED_CASES, "cpu") if spec.unsupported_reason(capabilities, "cpu") is None]
    assert runnable and not any(spec.backward for spec in runnable)
    assert report["summary"] == {"passed": len(runnable), "failed": 0, "unsupported": len(FIXED_CASES) - len(runnable), "error": 0}
    assert any(entry["reason"] == f"dk: {NO_BACKWARD_REASON}" for entry in report["unsupported"])


def test_run_fits_the_fixed_cases_to_a_kernel_needing_multiples_of_16(tmp_path):
    code, stdout, _ = _cli("run", "--kernel", "tests.user_kernels:MULTIPLE_OF_16", "--report", str(tmp_path))
    assert code == 0
    report = json.loads((tmp_path / "tolerance.json").read_text())
    ran = [case for case in report["cases"] if case["status"] == "passed"]
    assert ran and all(case["spec"]["seqlen_q"] % 16 == 0 == case["spec"]["seqlen_k"] % 16 for case in ran)
    assert {case["spec"]["name"] for case in ran} >= {"fp16-causal", "fp32-causal", "fp16-none-gqa"}
    assert report["summary"]["error"] == 0 and any(group["output"] == "lse" for group in report["groups"])


def test_fit_case_fits_each_sequence_of_a_packed_batch():
    """A packed batch keeps its sequences and features; each sequence's lengths are fitted as a case's are."""
    (packed,) = [spec for spec in FIXED_CASES if isinstance(spec, VarlenSpec)]
    capabilities = Capabilities.from_mapping({**CPU_FLOAT32, "seqlen_multiple_of": 16, "varlen": True})
    fitted = fit_case(packed, capabilities, "cpu")
    assert isinstance(fitted, VarlenSpec) and len(fitted.seqlens) == len(packed.seqlens)
    assert all(seqlen % 16 == 0 for pair in fitted.seqlens for seqlen in pair)
    assert (fitted.seqlen_q, fitted.seqlen_k) == (max(q for q, _ in fitted.seqlens), max(k for _, k in fitted.seqlens))
    assert (fitted.causal, fitted.heads_q, fitted.heads_kv, fitted.name) == (True, 4, 2, packed.name)
    assert dataclasses.replace(fitted, dtype="float32").unsupported_reason(capabilities, "cpu") is None
    assert fit_case(packed, Capabilities.from_mapping({**CPU_FLOAT32, "varlen": True}), "cpu").seqlens == packed.seqlens
