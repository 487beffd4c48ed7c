"""The mutant catalog (tests/mutants.py) is what it claims: each mutant loads
through the registry, documents its bug, and on a small deterministic case
that triggers its bug differs from the reference by a lot or returns NaN
(or, for a mutant that exits, exits: ``os._exit`` raises in the verifier).
Whether the verification catches them is the property suite's business."""

from __future__ import annotations

import pytest
import torch

import dataclasses

from fa2_verify.kernels.reference import DEFERRED, TiledAttention
from fa2_verify.core.case import CaseSpec, make_case
from fa2_verify.core.varlen import VarlenSpec, pack
from fa2_verify.core.layouts import in_layout
from fa2_verify.verify.kernel_call import run_case, run_varlen
from fa2_verify.verify.registry import LoadedKernel
from tests import breakers, mutants
from tests.naive import make_inputs, relative_error
from fa2_verify.verify.poison import poisoned
from fa2_verify.verify.registry import load_kernel
from fa2_verify.verify.user_code import KernelExited, UserCodeRaised, call_user_code

#: Smallest max |mutant - reference| / max |reference| that counts as "differs by a lot".
DEVIATION = 1e-2

#: mutant -> (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), dtype, call arguments
#: (standard normal inputs), or a case spec: a case that triggers the mutant's bug; for a varlen
#: mutant, a packed batch and the memory layout of its inputs (core.layouts); for a layout mutant,
#: a case and the layout of its inputs (NaN-guarded, backward handed out in it).
TRIGGERS = {
    "LSE_BASE2": ((1, 20, 20, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "CAUSAL_SHIFT": ((1, 40, 40, 2, 2, 8), torch.float32, {"softmax_scale": 0.3, "causal": True}),
    "TOP_LEFT_CAUSAL": ((1, 20, 50, 2, 2, 8), torch.float32, {"softmax_scale": 0.3, "causal": True}),
    "SKIP_RESCALE": ((1, 20, 64, 2, 2, 16), torch.float32, {"softmax_scale": 1.0}),
    "STALE_MAX": ((1, 20, 64, 2, 2, 16), torch.float32, {"softmax_scale": 1.0}),
    "WINDOW_OFF_BY_ONE": ((1, 30, 30, 2, 2, 8), torch.float32, {"softmax_scale": 0.3, "window_size": (4, 2)}),
    "WINDOW_LEFT_EXCLUSIVE": ((1, 30, 30, 2, 2, 8), torch.float32, {"softmax_scale": 0.3, "window_size": (4, 2)}),
    "WINDOW_MINUS_ONE_AS_EDGE": ((1, 20, 20, 2, 2, 8), torch.float32, {"softmax_scale": 0.3, "window_size": (-1, 0)}),
    "GQA_WRONG_HEAD": ((1, 20, 20, 4, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "TAIL_BLOCK_UNWRITTEN": ((1, 40, 20, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "TAIL_UNMASKED": ((1, 20, 40, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "ACC_IN_INPUT_DTYPE": ((1, 20, 256, 2, 2, 64), torch.bfloat16, {"softmax_scale": 1.0}),
    "DELTA_FROM_ROUNDED": ((1, 20, 20, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "DQ_MISSING_SCALE": ((1, 20, 20, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "DK_DV_GQA_NOT_SUMMED": ((1, 20, 20, 4, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "DQ_LOST_UPDATE": ((1, 20, 64, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "EMPTY_ROW_NAN": ((1, 6, 3, 2, 2, 8), torch.float32, {"softmax_scale": 0.3, "causal": True}),
    "OUT_REWRITTEN_BY_BACKWARD": ((1, 20, 20, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "BACKWARD_EXITS": ((1, 20, 20, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "CAUSAL_OS_EXITS": ((1, 20, 20, 2, 2, 8), torch.float32, {"softmax_scale": 0.3, "causal": True}),
    "DK_CHUNK_OFFSET": ((1, 20, 20, 2, 2, 160), torch.float32, {"softmax_scale": 0.3}),
    "DECODE_IGNORES_WINDOW": ((1, 1, 40, 2, 2, 8), torch.float32, {"softmax_scale": 0.3, "window_size": (5, 0)}),
    "DETERMINISTIC_DQ_DROPS_LAST_BLOCK": ((1, 20, 64, 2, 2, 8), torch.float32, {"softmax_scale": 0.3, "deterministic": True}),
    "LARGE_TILE_STALE_MAX": ((1, 4, 256, 2, 2, 16), torch.float32, {"softmax_scale": 1.0}),
    "SPLIT_KV_LSE_MAX": ((1, 4, 200, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "SPLIT_PARTIALS_IN_FLOAT8": ((1, 20, 8, 2, 2, 8), torch.float32, {"softmax_scale": 0.3}),
    "VARLEN_DETERMINISTIC_DQ_DROPS_LAST_BLOCK": (
        VarlenSpec.packing(((20, 64), (7, 40)), heads_q=2, heads_kv=2, head_dim=8, dtype="float32", softmax_scale=0.3,
                           backward=True, deterministic=True),
        "contiguous",
    ),
    "VARLEN_Q_ASSUMED_CONTIGUOUS": (
        VarlenSpec.packing(((20, 24), (7, 40)), heads_q=2, heads_kv=2, head_dim=8, dtype="float32", softmax_scale=0.3,
                           backward=True),
        "strided-seqlen",
    ),
    # bugs of memory layouts (core.layouts): a case and the layout of its inputs
    "DOUT_OUT_STRIDES_FROM_SHAPE": (CaseSpec(batch=2, seqlen_q=20, seqlen_k=20, heads_q=2, heads_kv=2, head_dim=8,
                                             dtype="float32", softmax_scale=0.3, backward=True), "outer-stride"),
    "KV_BATCH_STRIDE_FROM_SHAPE": (CaseSpec(batch=2, seqlen_q=20, seqlen_k=20, heads_q=4, heads_kv=2, head_dim=8,
                                            dtype="float32", softmax_scale=0.3, backward=True), "kv-expanded-batch"),
    "POINTER_ROUNDED_TO_16_BYTES": (CaseSpec(batch=1, seqlen_q=20, seqlen_k=20, heads_q=2, heads_kv=2, head_dim=8,
                                             dtype="float16", softmax_scale=0.3, backward=True), "unaligned-offset"),
    "V_PAST_SEQLEN_TIMES_ZERO": (CaseSpec(batch=2, seqlen_q=20, seqlen_k=20, heads_q=2, heads_kv=2, head_dim=8,
                                          dtype="float32", softmax_scale=0.3, backward=True), "contiguous"),
    "VARLEN_READS_PADDING": (
        VarlenSpec.packing(((20, 24), (7, 20)), heads_q=2, heads_kv=2, head_dim=8, dtype="float32", softmax_scale=0.3,
                           backward=True),
        "contiguous",
    ),
    # bugs that standard normal inputs do not reach: a case from a value generator of core.values
    "SKIP_SMALL_RESCALE": CaseSpec(batch=1, seqlen_q=20, seqlen_k=70, heads_q=2, heads_kv=1, head_dim=16,
                                   dtype="float64", generator="rescale-storm", seed=0),
    "DS_FLUSH_SUBNORMAL": CaseSpec(batch=2, seqlen_q=3, seqlen_k=3, heads_q=1, heads_kv=1, head_dim=8,
                                   dtype="float16", generator="normal-x2^-8", seed=0),
    "MAX_FROM_ZERO": CaseSpec(batch=1, seqlen_q=8, seqlen_k=40, heads_q=2, heads_kv=1, head_dim=16,
                              dtype="float32", generator="score-plateau", seed=0),
    "MAX_FROM_SENTINEL": CaseSpec(batch=1, seqlen_q=8, seqlen_k=40, heads_q=2, heads_kv=1, head_dim=16,
                                  dtype="float32", generator="far-below-zero", seed=0),
    "BWD_TAIL_UNMASKED": CaseSpec(batch=1, seqlen_q=8, seqlen_k=40, heads_q=2, heads_kv=1, head_dim=16,
                                  dtype="float32", generator="far-below-zero", seed=0),
}  # fmt: skip

#: Mutants whose bug is bounded below DEVIATION by construction, with the smallest deviation
#: that still counts as "a lot": SKIP_SMALL_RESCALE skips only rescales by less than 2^-12,
#: so it is off by about 2^-12 relative per skipped step (2^12 float32 unit roundoffs).
SMALL_DEVIATIONS = {"SKIP_SMALL_RESCALE": 2.0**-14}

#: Mutants whose bug is to end the process on their trigger case, not to compute wrong numbers, with what
#: their call raises in the verifier (``os._exit`` raises there, :mod:`verify.user_code`).
EXITING = {"BACKWARD_EXITS": SystemExit, "CAUSAL_OS_EXITS": KernelExited}


def test_catalog_is_complete() -> None:
    assert len(mutants.MUTANTS) >= 17
    assert set(mutants.MUTANTS) == set(TRIGGERS)


@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_mutant_loads_and_documents_its_bug(name: str) -> None:
    kernel = load_kernel(f"tests.mutants:{name}")
    assert kernel.target is mutants.MUTANTS[name] and isinstance(kernel.target, TiledAttention)
    assert dataclasses.replace(kernel.capabilities, varlen=False) == DEFERRED.capabilities
    assert kernel.config()["mutant"] == type(kernel.target).__name__
    assert len((type(kernel.target).__doc__ or "").split()) >= 12


def _run(kernel, trigger):
    """Every output; out and lse as forward returned them (backward gets copies, and ``deterministic``
    if the trigger names it)."""
    if isinstance(trigger, tuple) and isinstance(trigger[0], VarlenSpec):
        spec, layout = trigger
        if kernel is DEFERRED:  # the reference has no varlen entry points: run it sequence by sequence
            kernel = breakers.VARLEN_BY_LOOP
        return run_varlen(LoadedKernel("trigger", kernel), pack(spec, "cpu", layout), backward=True)
    if isinstance(trigger, tuple) and isinstance(trigger[0], CaseSpec):
        spec, layout = trigger
        return run_case(LoadedKernel("trigger", kernel), in_layout(make_case(spec), layout), backward=True)
    if isinstance(trigger, CaseSpec):
        case = make_case(trigger)
        q, k, v, dout = case.q, case.k, case.v, case.dout
        args = {"softmax_scale": trigger.scale, "causal": trigger.causal, "window_size": trigger.window_size}
    else:
        shape, dtype, args = trigger
        q, k, v, dout = make_inputs(shape, dtype, seed=1)
    masking = {name: value for name, value in args.items() if name != "deterministic"}
    with poisoned("cpu"):
        out, lse = kernel.forward(q, k, v, **masking)
        dq, dk, dv = kernel.backward(dout, q, k, v, out.clone(), lse.clone(), **args)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


@pytest.mark.parametrize("name", sorted(EXITING))
def test_exiting_mutant_exits(name: str) -> None:
    with pytest.raises(UserCodeRaised) as raised:
        call_user_code(lambda: _run(mutants.MUTANTS[name], TRIGGERS[name]))
    assert type(raised.value.raised) is EXITING[name]


@pytest.mark.parametrize("name", sorted(set(TRIGGERS) - set(EXITING)))
def test_mutant_deviates_from_reference(name: str) -> None:
    """On its trigger case, some output of the mutant is NaN or off by more than DEVIATION."""
    expected = _run(DEFERRED, TRIGGERS[name])
    actual = _run(mutants.MUTANTS[name], TRIGGERS[name])
    deviations = {output: relative_error(actual[output], expected[output]) for output in expected}
    assert max(deviations.values()) > SMALL_DEVIATIONS.get(name, DEVIATION), f"{name} matches the reference: {deviations}"
