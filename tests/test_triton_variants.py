"""Compile variants of the ``triton`` kernels: what is constexpr, what shares a variant, and ``fa2-verify warmup``.

The keys are Triton's own (``kernels.triton_fa2.variants.key``), read on the
CPU from the launches a case makes on a Hopper GPU; docs/benchmarks.md,
"Compile variants", counts them for the profiles.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from fa2_verify.cli.main import main
from fa2_verify.core.case import CaseSpec
from fa2_verify.kernels.triton_fa2 import plans
from fa2_verify.core.triton_passes import interpret_requested

needs_compiler = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or interpret_requested(),
    reason="needs triton with TRITON_INTERPRET unset (the interpreter compiles no variants)",
)

BASE = CaseSpec(batch=2, seqlen_q=70, seqlen_k=33, heads_q=4, heads_kv=2, head_dim=64, dtype="float16", backward=True)


def _keys(specs, layout="contiguous") -> dict[str, set]:
    from fa2_verify.kernels.triton_fa2 import variants

    found: dict[str, set] = {kernel: set() for kernel in variants.KERNELS}
    for spec in specs:
        for plan in variants.launches(spec, layout=layout):
            found[plan.kernel].add(variants.key(plan))
    return found


@pytest.mark.parametrize(
    ("shape", "dtype", "unit"),
    [((2, 7, 3, 40), torch.float16, 8), ((2, 7, 3, 40), torch.float32, 4), ((1, 5, 1, 36), torch.float16, 4)],
)
def test_stride_unit_is_the_power_of_two_up_to_16_bytes_dividing_every_stride(shape, dtype, unit):
    """(batch, seq, head) strides 840/120/40 elements: 16 bytes of fp16 (8), of fp32 (4); 36-element rows: 4."""
    tensor = torch.empty(shape, dtype=dtype, device="meta")
    assert plans.stride_unit(tensor, varlen=False) == unit
    assert all(stride % unit == 0 for stride in plans.strides(tensor, varlen=False))


def test_a_stride_of_2_31_elements_or_more_is_passed_whole():
    """A batch of 131,072 x 64 x 256 fp16 elements (2^31) gets unit 1, so the kernel never multiplies a 32-bit
    quotient back past 2^31; one element less keeps the 16-byte unit."""
    whole = torch.empty_strided((2, 131072, 64, 256), (2**31, 64 * 256, 256, 1), dtype=torch.float16, device="meta")
    assert plans.stride_unit(whole, varlen=False) == 1
    below = torch.empty_strided((2, 131072, 64, 256), (2**31 - 8, 64 * 256, 256, 1), dtype=torch.float16, device="meta")
    assert plans.stride_unit(below, varlen=False) == 8


def test_an_absent_or_huge_window_bound_is_no_bound():
    """-1 and any bound past NO_BOUND reach the kernels as NO_BOUND; others as they are."""
    spec = dataclasses.replace(BASE, window_size=(3, 2**40))
    problem = plans.Problem(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(CaseSpec)})
    assert plans._bound(-1) == plans._bound(2**40) == plans.NO_BOUND
    assert plans._mask_and_sizes(problem) == (3, plans.NO_BOUND, 64 // plans.HEAD_DIM_UNIT)


@needs_compiler
def test_head_dims_windows_and_strides_share_one_variant_per_kernel():
    """Head dims 72..120 (one padded block), windows of any width (a huge one too), 2 or 3 heads,
    deterministic or not: one variant of each kernel (the key-tile pass: with atomic dQ and without)."""
    specs = [
        dataclasses.replace(BASE, head_dim=head_dim, window_size=window, heads_q=heads, heads_kv=heads,
                            deterministic=deterministic)
        for head_dim in (72, 96, 120)
        for window in ((5, 3), (0, 0), (7, 2**40))
        for heads in (2, 3)
        for deterministic in (False, True)
    ]
    counts = {kernel: len(keys) for kernel, keys in _keys(specs).items()}
    assert counts == {"forward_kernel": 1, "backward_preprocess_kernel": 1, "backward_kv_kernel": 2,
                      "backward_dq_kernel": 1}


def test_the_default_backward_computes_dq_in_its_own_pass_where_the_table_says_so():
    """16-bit head_dim 64 on Hopper (configs.separate_dq): the default backward runs the query-tile dQ
    pass and a key-tile pass without atomics, as the deterministic one does; head_dim 128, float32 and
    other GPUs keep the atomic adds."""
    from fa2_verify.kernels.triton_fa2 import variants

    def dq_passes(spec, target="sm90"):
        planned = {plan.kernel: plan for plan in variants.launches(spec, target=target)}
        return "backward_dq_kernel" in planned, planned["backward_kv_kernel"].constexprs["ATOMIC_DQ"]

    assert dq_passes(BASE) == (True, False)
    assert dq_passes(dataclasses.replace(BASE, head_dim=128)) == (False, True)
    assert dq_passes(dataclasses.replace(BASE, dtype="float32")) == (False, True)
    assert dq_passes(BASE, target="cuda") == (False, True)
    assert dq_passes(dataclasses.replace(BASE, head_dim=128, deterministic=True)) == (True, False)


@needs_compiler
def test_what_stays_compile_time():
    """The dtype, the padded block, a head dim that fills it, a left bound in the query-tile kernels and a
    GQA group of 1 in the backward each make a variant; a right bound alone (causal) does not in the forward."""
    variations = [BASE, dataclasses.replace(BASE, dtype="bfloat16"), dataclasses.replace(BASE, head_dim=72),
                  dataclasses.replace(BASE, head_dim=56), dataclasses.replace(BASE, window_size=(3, -1)),
                  dataclasses.replace(BASE, causal=True)]
    assert len(_keys(variations)["forward_kernel"]) == 5
    assert len(_keys([BASE, dataclasses.replace(BASE, heads_kv=4)])["backward_kv_kernel"]) == 2


@needs_compiler
@pytest.mark.parametrize("layout", ["heads-major", "padded-head-dim", "strided-seqlen"])
def test_the_property_layouts_share_the_contiguous_variants(layout):
    """Every stride of these layouts is a multiple of 16 bytes, as in the contiguous layout: same variants,
    dense and packed (the varlen property draws its layout too)."""
    from fa2_verify.core.varlen import VarlenSpec
    from fa2_verify.kernels.triton_fa2 import variants

    packed = VarlenSpec.packing(((3, 0), (17, 40)), heads_q=2, heads_kv=1, head_dim=40, dtype="float16", backward=True)
    for spec in (dataclasses.replace(BASE, head_dim=40), packed):
        strides = [plan.args[7:16] for plan in variants.launches(spec, layout=layout)[:1]]
        assert strides != [plan.args[7:16] for plan in variants.launches(spec)[:1]], "the layout was not applied"
        assert _keys([spec], layout=layout) == _keys([spec])


@needs_compiler
@pytest.mark.parametrize("layout", ["contiguous", "strided-seqlen"])
def test_warmup_arguments_have_the_real_launch_keys(layout):
    """The tiny tensors warmup compiles with give every launch's key, deterministic and varlen included."""
    from fa2_verify.core.varlen import VarlenSpec
    from fa2_verify.kernels.triton_fa2 import variants

    packed = VarlenSpec.packing(((3, 0), (17, 40)), heads_q=2, heads_kv=1, head_dim=40, dtype="float32", backward=True)
    for spec in (dataclasses.replace(BASE, deterministic=True), packed):
        for plan in variants.launches(spec, layout=layout):
            stand_ins = dataclasses.replace(plan, args=variants.device_args(plan, torch.device("cpu")))
            assert variants.key(stand_ins) == variants.key(plan)


def test_warmup_without_cuda_is_a_one_line_error(capfd):
    """On a machine without a CUDA device, warmup exits 2 with one line naming the cause."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert main(["warmup", "--profile", "ci", "--processes", "2"]) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no CUDA device is visible" in err


def test_warmup_refuses_a_process_count_below_one(capfd):
    assert main(["warmup", "--processes", "0"]) == 2
    assert "--processes=0" in capfd.readouterr().err


def test_warmup_draws_are_derandomized_or_drawn_from_a_seed():
    """Without a seed the warm-up draws the same cases every time; with one, as a run with that seed would
    (lab/probes/warmup_coverage.py compares the two)."""
    from fa2_verify.properties.draws import profile_cases

    assert profile_cases("ci", 3) == profile_cases("ci", 3)
    assert profile_cases("ci", 3, seed=5) == profile_cases("ci", 3, seed=5) != profile_cases("ci", 3)


def test_warmup_draws_come_draw_major():
    """Every property's first draw comes before any property's second (``drawn_cases``), so a warm-up beside
    the suite compiles the variants of the suite's first examples first: the draws of one example each are
    the first cases of the draws of three."""
    from fa2_verify.properties.draws import profile_cases

    first = profile_cases("ci", 1)
    assert len(set(first)) > 1
    assert profile_cases("ci", 3)[: len(first)] == first
