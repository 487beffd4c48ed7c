"""Kernels with conventions of their own: causal-only, top-left masks, SDPA's argument names, no custom scale.

The adapters of docs/targets.md ("Verify your own kernel") are run here as
printed there (tests/user_kernels.py), each verified by ``fa2-verify run`` on
at least ten fixed cases; the same kernels declared with the wrong convention
fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
import pathlib
import re

import pytest
import torch
from hypothesis import given, settings

import fa2_verify
from fa2_verify.cli.main import main
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.contract import Capabilities, visible_mask
from fa2_verify.core.errors import UsageError
from fa2_verify.core.varlen import VarlenSpec
from fa2_verify.kernels.autograd import recomputed_gradients
from fa2_verify.properties import masks
from fa2_verify.properties.cases import case_specs
from fa2_verify.verify.check import check_case
from fa2_verify.app.cases.fitting import fit_case, fitted_cases
from fa2_verify.app.cases.fixed import FIXED_CASES
from fa2_verify.verify.registry import LoadedKernel
from tests import user_kernels

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "targets.md"
ALL_DTYPES = {"cpu": ["float16", "bfloat16", "float32"]}

#: Ten fixed cases, the cheapest on the CPU, that still hold every dtype, empty rows and 257 keys.
TEN_CASES = ("fp16-causal", "fp16-none-sk1", "bf16-none-sq1", "bf16-causal-mqa-empty-rows", "bf16-window-empty-rows",
             "fp32-causal", "fp32-window-mqa", "fp16-left-window-sk257", "fp16-right-window-past-keys",
             "bf16-window-past-keys-gqa")


def _run(kernel: str, cases=TEN_CASES) -> tuple[int, str]:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        code = main(["run", "--kernel", f"tests.user_kernels:{kernel}", *(f"--case={name}" for name in cases)])
    return code, stdout.getvalue()


@pytest.mark.parametrize("kernel", ["SDPA", "CAUSAL_TOP_LEFT"])
def test_a_kernel_with_its_own_conventions_gets_ten_fixed_cases_verified(kernel):
    code, stdout = _run(kernel)
    assert code == 0 and f"{len(TEN_CASES)} passed, 0 failed, 0 errors, 0 unsupported" in stdout, stdout
    assert "fitted to the kernel:" in stdout


def test_the_sdpa_adapter_has_the_window_cases_fitted_and_says_so():
    code, stdout = _run("SDPA", ("fp32-window-mqa",))
    assert code == 0 and "fp32-window-mqa: heads_kv 1 -> 2, window_size (5, 5) -> (-1, -1)" in stdout


def test_a_forward_only_kernel_with_an_lse_has_its_lse_verified():
    code, stdout = _run("WITH_LSE", ("fp32-causal", "bf16-none-sq1"))
    assert code == 0 and "2 passed" in stdout and re.search(r"fp32-causal +lse +float32 .* passed", stdout)


def _checked(target, **fields):
    spec = CaseSpec(**{"batch": 1, "seqlen_q": 16, "seqlen_k": 32, "heads_q": 2, "heads_kv": 2, "head_dim": 32,
                       "dtype": "float32", "causal": True, "seed": 3, **fields})  # fmt: skip
    return check_case(LoadedKernel("user", target), make_case(spec))


CAUSAL_ONLY = {"dtypes": ALL_DTYPES, "head_dims": [32], "causal_only": True, "gqa": False, "window": False}


@pytest.mark.parametrize("seqlens", [(16, 32), (32, 16)])
def test_a_top_left_kernel_that_does_not_declare_it_fails(seqlens):
    undeclared = fa2_verify.autograd_target(user_kernels.causal_attn, layout="bhsd", capabilities=CAUSAL_ONLY)
    result = _checked(undeclared, seqlen_q=seqlens[0], seqlen_k=seqlens[1])
    assert result.status == "failed" and "out" in result.failed_outputs()


def test_a_kernel_declaring_top_left_but_computing_bottom_right_fails():
    bottom_right = fa2_verify.autograd_target(
        user_kernels.bhsd_attention, layout="bhsd", capabilities={**CAUSAL_ONLY, "causal_alignment": "top_left"}
    )
    assert _checked(bottom_right, causal_alignment="top_left").status == "failed"
    assert _checked(user_kernels.CAUSAL_TOP_LEFT, causal_alignment="top_left").status == "passed"


def test_top_left_masks_put_query_i_on_key_i():
    expected = torch.tensor([[True, False, False, False, False], [True, True, False, False, False],
                             [True, True, True, False, False]])  # fmt: skip
    assert torch.equal(visible_mask(3, 5, causal=True, alignment="top_left"), expected)
    assert torch.equal(visible_mask(3, 5, causal=True), torch.ones(3, 5, dtype=torch.bool).tril(2))


def test_the_alignment_is_carried_by_the_case_record_and_old_records_read_bottom_right():
    spec = CaseSpec(batch=1, seqlen_q=3, seqlen_k=5, heads_q=1, heads_kv=1, head_dim=8, dtype="float32", causal=True)
    assert "causal_alignment" not in spec.to_dict() and CaseSpec.from_dict(spec.to_dict()) == spec
    top_left = spec.aligned("top_left")
    assert top_left.to_dict()["causal_alignment"] == "top_left" and CaseSpec.from_dict(top_left.to_dict()) == top_left
    assert dataclasses.replace(spec, seqlen_k=3).aligned("top_left").causal_alignment == "bottom_right"
    with pytest.raises(UsageError, match="causal_alignment='top-left': must be one of bottom_right, top_left"):
        CaseSpec.from_dict({**spec.to_dict(), "causal_alignment": "top-left"})


def test_a_case_outside_the_kernels_conventions_is_unsupported_and_one_inside_is_not():
    capabilities = Capabilities.from_mapping({**CAUSAL_ONLY, "causal_alignment": "top_left",
                                              "custom_softmax_scale": False})  # fmt: skip
    spec = CaseSpec(batch=1, seqlen_q=3, seqlen_k=5, heads_q=1, heads_kv=1, head_dim=32, dtype="float32", causal=True)
    assert "bottom-right aligned, the kernel's top-left" in spec.unsupported_reason(capabilities, "cpu")
    assert spec.aligned("top_left").unsupported_reason(capabilities, "cpu") is None
    assert "causal masks only" in dataclasses.replace(spec, causal=False).unsupported_reason(capabilities, "cpu")
    scaled = dataclasses.replace(spec, softmax_scale=0.3).aligned("top_left")
    assert "custom softmax_scale is not supported" in scaled.unsupported_reason(capabilities, "cpu")


@pytest.mark.parametrize("fields, message", [
    ({"causal_alignment": "top-left"}, "causal_alignment='top-left' is not valid"),
    ({"causal_only": True, "causal": False}, "causal_only=True is not valid"),
    ({"custom_softmax_scale": "no"}, "custom_softmax_scale='no' is not valid"),
])  # fmt: skip
def test_a_bad_convention_declaration_is_a_one_line_error(fields, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        Capabilities.from_mapping({**CAUSAL_ONLY, **fields})


def test_fitting_takes_away_only_what_the_kernel_lacks():
    mha = Capabilities.from_mapping({"dtypes": ALL_DTYPES, "head_dims": [32, 40, 64], "gqa": False, "window": False})
    fitted = {spec.name: spec for spec in fitted_cases(mha, FIXED_CASES, "cpu")}
    assert fitted["fp16-none-gqa"] == dataclasses.replace(FIXED_CASES[0], heads_kv=4)
    assert fitted["fp16-window-mqa"].window_size == (-1, -1) and not fitted["fp16-window-mqa"].causal
    assert sum(spec.unsupported_reason(mha, "cpu") is None for spec in fitted.values()) == len(FIXED_CASES) - 1
    plain_scale = Capabilities.from_mapping({"dtypes": ALL_DTYPES, "head_dims": [64], "custom_softmax_scale": False})
    decode = next(spec for spec in FIXED_CASES if spec.name == "fp16-left-window-decode-gqa")
    assert fit_case(decode, plain_scale, "cpu") == dataclasses.replace(decode, softmax_scale=None, deterministic=False)


def test_a_causal_only_equal_length_multiple_of_128_kernel_gets_its_fixed_cases():
    capabilities = Capabilities.from_mapping({
        "dtypes": ALL_DTYPES, "head_dims": [64], "causal_only": True, "equal_seqlens": True, "seqlen_multiple_of": 128,
    })  # fmt: skip
    fitted = fitted_cases(capabilities, FIXED_CASES, "cpu")
    runnable = [spec for spec in fitted if spec.unsupported_reason(capabilities, "cpu") is None]
    assert len(runnable) == len(FIXED_CASES) - 1 and all(spec.causal for spec in fitted)
    assert all(not isinstance(spec, VarlenSpec) for spec in runnable)
    window = next(spec for spec in fitted if spec.name == "fp16-left-window-sk257")
    assert window.window_size == (200, -1) and window.seqlen_q == window.seqlen_k == 384


@settings(max_examples=30, deadline=None, database=None)
@given(masks.masks(seqlen_q=5, seqlen_k=3, causal_only=True))
def test_a_causal_only_kernel_is_drawn_causal_masks_only(mask):
    assert mask[0] is True


@settings(max_examples=15, deadline=None, database=None)
@given(case_specs(capabilities=user_kernels.CAUSAL_TOP_LEFT.capabilities, device="cpu"))
def test_the_case_strategy_draws_within_a_kernels_conventions(spec):
    assert spec.causal and spec.heads_q == spec.heads_kv
    assert spec.unsupported_reason(user_kernels.CAUSAL_TOP_LEFT.capabilities, "cpu") is None
    plain = dataclasses.replace(user_kernels.CAUSAL_TOP_LEFT.capabilities, custom_softmax_scale=False)
    assert dataclasses.replace(spec, softmax_scale=None).unsupported_reason(plain, "cpu") is None


class _TutorialAttention(torch.autograd.Function):
    """The Triton tutorial's interface, ``_attention.apply(q, k, v, causal, sm_scale)``, in plain PyTorch."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):
        ctx.save_for_backward(q, k, v)
        ctx.options = {"causal": causal, "softmax_scale": sm_scale}
        return user_kernels.bhsd_attention(q, k, v, **ctx.options)

    @staticmethod
    def backward(ctx, dout):
        attention = functools.partial(user_kernels.bhsd_attention, **ctx.options)
        return (*recomputed_gradients(attention, dout, *ctx.saved_tensors), None, None)


def _keywords(q, k, v, *, causal_flag=False, temperature=None):
    return user_kernels.bhsd_attention(q, k, v, causal=causal_flag, softmax_scale=temperature)


MHA = {"dtypes": {"cpu": ["float32"]}, "head_dims": [32], "gqa": False, "window": False}


@pytest.mark.parametrize("fn, argnames, arguments", [
    (user_kernels.attn, None, {"causal": "is_causal", "softmax_scale": "scale"}),
    (_TutorialAttention.apply, None, {"causal": "positional", "softmax_scale": "positional"}),
    (_keywords, {"causal": "causal_flag", "softmax_scale": "temperature"},
     {"causal": "causal_flag", "softmax_scale": "temperature"}),
])  # fmt: skip
def test_autograd_target_calls_fn_by_its_own_argument_names(fn, argnames, arguments):
    target = fa2_verify.autograd_target(fn, layout="bhsd", capabilities=MHA, argnames=argnames)
    assert target.config()["arguments"] == arguments
    assert _checked(target, causal=True, seqlen_k=16).status == "passed"


@pytest.mark.parametrize("fn, argnames, message", [
    (_keywords, None, "fn(q, k, v, *, causal_flag=False, temperature=None) has no parameter for causal "
                      "(looked for causal, is_causal)"),
    (_keywords, {"causal": "causal_flag"}, "has no parameter for softmax_scale (looked for softmax_scale, scale, "
                                           "sm_scale)"),
    (torch.nn.functional.scaled_dot_product_attention, None, "fn(...) has no parameter for causal"),
    (user_kernels.attn, {"mask": "is_causal"}, "argnames={'mask': 'is_causal'} is not valid"),
])  # fmt: skip
def test_an_unrecognised_signature_is_a_one_line_error_at_creation(fn, argnames, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        fa2_verify.autograd_target(fn, layout="bhsd", capabilities=MHA, argnames=argnames)


def test_a_causal_only_function_needs_no_causal_parameter_and_one_without_custom_scale_no_scale():
    def fixed_scale(q, k, v):
        return user_kernels.causal_attn(q, k, v, 1 / math.sqrt(q.shape[-1]))

    with pytest.raises(UsageError, match="no parameter for softmax_scale"):
        fa2_verify.autograd_target(fixed_scale, layout="bhsd", capabilities=CAUSAL_ONLY)
    target = fa2_verify.autograd_target(
        fixed_scale, layout="bhsd", capabilities={**CAUSAL_ONLY, "custom_softmax_scale": False, "causal_alignment": "top_left"}
    )
    assert _checked(target, seqlen_k=16).status == "passed"


def _snippets(text: str) -> dict[str, str]:
    return dict(re.findall(r"# docs: ([\w-]+)\n(.*?)# docs: end\n", text, re.S))


def test_the_docs_show_the_adapters_the_tests_run():
    tested = _snippets(pathlib.Path(user_kernels.__file__).read_text())
    assert set(tested) == {"sdpa", "with-lse", "causal-top-left"}
    shown = DOC.read_text()
    for name, snippet in tested.items():
        assert snippet in shown, f"docs/targets.md does not show the {name} adapter of tests/user_kernels.py as is"
        assert len(snippet.strip().splitlines()) <= 15
