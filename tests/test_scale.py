"""The scale code path on the CPU: the case sets, chunked comparison, ``run --cases scale``, the scale mutants.

The GPU demonstration (the scale set passing ``triton`` and ``torch-flash``
and failing each scale mutant at 128k tokens) is ``lab/device/device-scale.sh``;
here everything runs on small shapes, within the CI budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fa2_verify.app.cases import scale
from fa2_verify.cli.main import main
from fa2_verify.core import values
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.contract import visible_mask, visible_ranges
from fa2_verify.core.varlen import VarlenSpec
from fa2_verify.properties import profiles, shapes
from fa2_verify.properties.cases import fit_budget, work
from fa2_verify.verify import error_model, memory, metrics
from fa2_verify.verify.check import check_case, run_cases
from fa2_verify.app.cases.fixed import FIXED_CASES
from fa2_verify.verify.registry import LoadedKernel, load_kernel
from fa2_verify.app.cases.scale import CPU_CASES, CUDA_CASES, DEVICE_BYTES
from tests import mutants

GiB = 2**30


@pytest.fixture(scope="module", autouse=True)
def golden_cache(tmp_path_factory):
    """Share golden results between the runs of this module (the fixed set is run once per scale mutant)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FA2_VERIFY_GOLDEN_CACHE", str(tmp_path_factory.mktemp("golden-cache")))
        yield


def _elements(spec: CaseSpec) -> int:
    return spec.batch * spec.seqlen_q * spec.heads_q * spec.head_dim


def _device_bytes(spec: CaseSpec) -> int:
    """The size guard's estimate of ``spec`` on a GPU: what ``run --cases scale`` refuses a case by."""
    return memory.estimate(spec, "cuda").device


def test_gpu_scale_set_reaches_the_production_paths_and_fits_an_h100():
    cases = CUDA_CASES
    assert all(_device_bytes(spec) <= DEVICE_BYTES for spec in cases), {s.name: _device_bytes(s) / GiB for s in cases}
    lengths = {n for spec in cases for n in (spec.seqlen_q, spec.seqlen_k)}
    assert {4096, 16384, 65537, 131072} <= lengths
    assert any(s.causal for s in cases) and any(not s.causal and s.window_size == (-1, -1) for s in cases)
    assert any(s.window_size != (-1, -1) for s in cases)
    assert any(s.seqlen_q != s.seqlen_k for s in cases)
    assert any(s.head_dim == 256 for s in cases)
    assert any(s.heads_q >= 32 and s.heads_q == 8 * s.heads_kv for s in cases)
    over = [s for s in cases if _elements(s) > 2**31]
    assert over and any((s.batch - 1) * _elements(s) // s.batch >= 2**31 for s in over)
    assert any(math.ceil(s.seqlen_q / 128) >= 65536 for s in cases)
    # flash-attn PR #2260: a dQ accumulator padded to 128 rows per (batch, head) passes 2^31 with tiny sequences
    assert any(s.batch * s.heads_q * 128 * s.head_dim > 2**31 and max(s.seqlen_q, s.seqlen_k) <= 3 and s.backward
               for s in cases)


def test_cpu_scale_set_keeps_long_keys_and_head_dim_256():
    assert max(spec.seqlen_k for spec in CPU_CASES) >= 4096
    assert any(spec.head_dim == 256 for spec in CPU_CASES)


def test_the_device_estimate_counts_every_float64_copy():
    spec = CUDA_CASES[0]
    forward_only = dataclasses.replace(spec, backward=False)
    assert _device_bytes(forward_only) < _device_bytes(spec)
    # the golden's outputs and the bounds alone are two float64 copies of out, dq, dk and dv
    assert _device_bytes(spec) > 2 * 8 * 4 * _elements(spec)


def test_chunked_comparison_equals_one_chunk(monkeypatch):
    """Bounds in blocks of a few rows and metrics in chunks of a few elements give the same numbers."""
    spec = CaseSpec(batch=1, seqlen_q=37, seqlen_k=70, heads_q=2, heads_kv=1, head_dim=16, dtype="bfloat16",
                    window_size=(20, 3), seed=5)
    case = make_case(spec)
    kernel = load_kernel("reference")
    whole = check_case(kernel, case)
    monkeypatch.setattr(error_model, "WORK_ELEMENTS", {"cpu": 600, "cuda": 600})
    monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 397)
    chunked = check_case(kernel, case)
    assert chunked.status == whole.status == "passed"
    for output, comparison in whole.comparisons.items():
        other = chunked.comparisons[output]
        assert other.mismatches == comparison.mismatches and other.worst["index"] == comparison.worst["index"]
        for name in metrics.METRIC_EDGES:
            expected, actual = getattr(comparison, name), getattr(other, name)
            assert actual.histogram == expected.histogram
            assert actual.quantiles == pytest.approx(expected.quantiles, rel=1e-12)


def test_radix_selection_gives_exact_order_statistics():
    values = torch.cat([torch.rand(5000, dtype=torch.float64) ** 9 * 1e4, torch.zeros(40, dtype=torch.float64),
                        torch.full((7,), math.inf, dtype=torch.float64), torch.tensor([2.0**-1074])])
    values = values[torch.randperm(len(values), generator=torch.Generator().manual_seed(0))]
    ordered = torch.sort(values).values
    ranks = [0, 1, 17, 2500, len(values) - 8, len(values) - 1]
    chunks = lambda: ({"v": chunk} for chunk in values.split(333))
    assert metrics.order_statistics(chunks, ranks)["v"] == [float(ordered[r]) for r in ranks]


def test_run_scale_prints_the_set_and_the_time_split(monkeypatch):
    """``run --cases scale`` on the CPU, on a small copy of one scale case (the whole set is timed in docs/)."""
    small = dataclasses.replace(CPU_CASES[-1], batch=2)
    monkeypatch.setattr(scale, "SCALE_CASES", {"cpu": (small,)})
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["run", "--kernel", "reference", "--cases", "scale"])
    out = stdout.getvalue()
    assert code == 0, out + stderr.getvalue()
    assert "case set: scale (cpu, 1 cases)" in out
    timing = out[out.index("kernel s") :].splitlines()
    assert timing[1].split()[0] == small.name and len(timing[1].split()) == 5


@pytest.mark.parametrize("name", sorted(mutants.SCALE_MUTANTS))
def test_scale_mutant_passes_the_fixed_set(name):
    """Right at every fixed shape: ``fa2-verify run`` (fixed) cannot catch it (its packed batch is unsupported:
    the mutants have no varlen entry points)."""
    kernel = LoadedKernel(name, mutants.SCALE_MUTANTS[name])
    counts = run_cases(kernel, FIXED_CASES, "cpu").counts()
    packed = sum(isinstance(spec, VarlenSpec) for spec in FIXED_CASES)
    assert counts == {"passed": len(FIXED_CASES) - packed, "failed": 0, "unsupported": packed, "error": 0}


#: A scale mutant with its limit lowered to small shapes, a case past that limit, and the outputs it must fail.
LOWERED = {
    "keys-past-16-causal": (
        mutants.KeysPastLimitIgnored(key_limit=16),
        CaseSpec(batch=1, seqlen_q=20, seqlen_k=40, heads_q=2, heads_kv=2, head_dim=8, dtype="float32", causal=True),
        {"out", "lse", "dk", "dv"},
    ),
    "keys-past-16-window": (
        mutants.KeysPastLimitIgnored(key_limit=16),
        CaseSpec(batch=1, seqlen_q=30, seqlen_k=30, heads_q=2, heads_kv=1, head_dim=8, dtype="float16",
                 window_size=(20, 2)),
        {"out", "dk", "dv"},
    ),
    "last-tile-stale-from-128-rows": (
        mutants.StaleLastQueryTile(min_seqlen_q=128),
        CaseSpec(batch=1, seqlen_q=130, seqlen_k=130, heads_q=1, heads_kv=1, head_dim=16, dtype="float16",
                 causal=True, generator="boundary-keys"),
        {"out", "lse"},
    ),
    "offset-wrap-12-bits": (
        mutants.BatchOffsetWrap(offset_bits=12),
        CaseSpec(batch=2, seqlen_q=40, seqlen_k=40, heads_q=2, heads_kv=2, head_dim=32, dtype="bfloat16"),
        {"out", "lse", "dk"},
    ),
}


@pytest.mark.parametrize("lowered", sorted(LOWERED))
def test_scale_mutant_fails_past_its_limit(lowered):
    """The same deviation with its limit lowered is caught, naming the outputs it breaks."""
    mutant, spec, outputs = LOWERED[lowered]
    result = check_case(LoadedKernel(lowered, mutant), make_case(spec))
    assert result.status == "failed" and outputs <= set(result.failed_outputs()), result.failed_outputs()


def test_boundary_keys_pair_the_index_limits_with_rows_that_see_them():
    """The 65,537-key scale case: key 65,536 (past 16 bits) dominates the last row, each pair is visible."""
    spec = next(spec for spec in CUDA_CASES if spec.name == "sk65537-none-fp16")
    pairs = dict(values.boundary_pairs(spec))
    assert pairs[spec.seqlen_q - 1] == 65536 and {65535, 0, 63, 64, 127} <= set(pairs.values())
    first, last = visible_ranges(spec.seqlen_q, spec.seqlen_k, causal=spec.causal, window_size=spec.window_size)
    assert all(first[row] <= key <= last[row] for row, key in pairs.items())
    causal = next(spec for spec in CUDA_CASES if spec.name == "s131072-causal-bf16")
    rows = dict(values.boundary_pairs(causal))
    assert {131071, 131008, 65536, 65535} <= set(rows) and rows[131071] == 131071


def test_boundary_keys_rows_put_their_weight_on_their_key():
    spec = CaseSpec(batch=2, seqlen_q=70, seqlen_k=200, heads_q=2, heads_kv=1, head_dim=32, dtype="bfloat16",
                    causal=True, generator="boundary-keys", seed=3)
    case = make_case(spec)
    q, k = case.q.double(), case.k.double().repeat_interleave(2, dim=2)
    mask = visible_mask(spec.seqlen_q, spec.seqlen_k, causal=True)
    weights = torch.softmax(torch.einsum("bihc,bjhc->bhij", q, k).mul(spec.scale).masked_fill(~mask, -math.inf), -1)
    pairs = values.boundary_pairs(spec)
    assert len(pairs) >= 6
    for row, key in pairs:
        assert float(weights[:, :, row, key].min()) > 1 - 1e-4, (row, key)


def test_a_key_past_the_limit_fails_out_by_a_whole_value_under_boundary_keys():
    """Forward only: ``boundary-keys`` gives the dropped key (64, a tile edge) a row of its own, the last, whose
    ``out`` then errs by a whole value (under ``normal`` values, at 65,537 keys, by ``1/65,537`` of one)."""
    mutant = mutants.KeysPastLimitIgnored(key_limit=64)
    spec = CaseSpec(batch=1, seqlen_q=4, seqlen_k=65, heads_q=1, heads_kv=1, head_dim=16, dtype="float16",
                    generator="boundary-keys", backward=False)
    result = check_case(LoadedKernel("keys-past-64", mutant), make_case(spec))
    assert result.status == "failed"
    assert result.comparisons["out"].normalized.quantiles["max"] >= 10
    assert result.comparisons["out"].worst["index"][1] == spec.seqlen_q - 1


def test_keys_mutant_declines_a_window_it_cannot_keep():
    mutant = mutants.KeysPastLimitIgnored(key_limit=16)
    case = make_case(CaseSpec(batch=1, seqlen_q=30, seqlen_k=40, heads_q=1, heads_kv=1, head_dim=8, dtype="float32",
                              window_size=(4, 0)))
    assert check_case(LoadedKernel("keys", mutant), case).status == "unsupported"


# The scale profile ------------------------------------------------------------------


def test_scale_profile_draws_production_shapes_on_a_gpu_and_ci_shapes_on_a_cpu():
    scale = profiles.get("scale")
    assert scale.targeting and not scale.derandomize
    assert scale.cpu_limits == profiles.get("ci").cpu_limits
    limits = scale.cuda_limits
    assert limits.max_seqlen == 131072 and limits.max_head_dim == 256
    assert limits.max_batch * limits.max_heads_kv * limits.max_group >= 2048


def test_long_boundary_lengths_hold_the_index_and_grid_edges():
    lengths = set(shapes.boundary_lengths(min_value=1, max_value=131072))
    assert {255, 257, 4095, 4097, 65535, 65536, 65537, 131071, 131072} <= lengths


@settings(max_examples=50, derandomize=True, database=None)
@given(st.data())
def test_block_multiples_are_one_off_a_multiple_of_64(data):
    n = data.draw(shapes.block_multiples(min_value=1, max_value=131072))
    assert 1 <= n <= 131072 and n % 64 in (0, 1, 63)


def test_fit_budget_cuts_batch_and_heads_first_and_keeps_the_long_keys():
    limits = profiles.get("scale").cuda_limits
    spec = CaseSpec(batch=32, seqlen_q=131072, seqlen_k=131072, heads_q=128, heads_kv=16, head_dim=256,
                    dtype="bfloat16", causal=True)
    fitted = fit_budget(spec, limits, min_batch=2, min_group=2)
    assert work(fitted) <= limits.max_work and _device_bytes(fitted) <= limits.max_bytes
    assert fitted.seqlen_k == 131072 and fitted.batch == 2 and fitted.heads_q // fitted.heads_kv == 2
    assert fitted.seqlen_q in shapes.boundary_lengths(min_value=1, max_value=131072)
    small = CaseSpec(batch=3, seqlen_q=65537, seqlen_k=17, heads_q=8, heads_kv=1, head_dim=64, dtype="float16")
    assert fit_budget(small, limits) == small
    assert fit_budget(spec, profiles.get("ci").cuda_limits) == spec


def test_fit_budget_with_mha_counts_the_mha_twin_of_a_gqa_relation():
    """The GQA relations hold the case and its MHA twin, whose K, V (and their float64 error-model copies) are
    ``group`` times larger: a case drawn in the ``scale`` profile ran the H100 out of memory with 34.65 GiB
    asked for the twin's copy (b7 h24/3, 27,903 keys, d 248)."""
    limits = profiles.get("scale").cuda_limits
    spec = CaseSpec(batch=28, seqlen_q=2, seqlen_k=27903, heads_q=24, heads_kv=3, head_dim=248, dtype="float16",
                    window_size=(197, 0), softmax_scale=2.0**-6, generator="uniform-x2^2", seed=95138)
    alone = fit_budget(spec, limits, min_group=2)
    assert memory.estimate(dataclasses.replace(alone, heads_kv=alone.heads_q), "cuda").device > limits.max_bytes
    twin = fit_budget(spec, limits, min_group=2, with_mha=True)
    held = memory.estimate(twin, "cuda").device + memory.estimate(dataclasses.replace(twin, heads_kv=twin.heads_q), "cuda").device
    assert held <= limits.max_bytes and twin.heads_q // twin.heads_kv >= 2 and twin.seqlen_k == spec.seqlen_k
