"""The ``triton`` target without launching a kernel: where it says it runs
(computed from the environment), its argument checks, its tile table and its
registry entry.  Kernel numerics are in tests/test_triton_interpreter.py."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from fa2_verify.core import triton_passes
from fa2_verify.core.contract import Capabilities
from fa2_verify.kernels.triton_fa2 import KERNEL, configs, environment, validation
from fa2_verify.kernels.triton_fa2.environment import CPU_DTYPES, CUDA_DTYPES, Environment
from fa2_verify.core.errors import UnsupportedCase, UsageError
from fa2_verify.verify.registry import load_kernel

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "env, dtypes, reason",
    [
        (Environment(triton_installed=False, interpret=False, cuda_available=True), {}, "triton is not installed"),
        (Environment(triton_installed=True, interpret=False, cuda_available=False), {}, "TRITON_INTERPRET=1"),
        (Environment(triton_installed=True, interpret=True, cuda_available=False), {"cpu": CPU_DTYPES}, None),
        (Environment(triton_installed=True, interpret=True, cuda_available=True), {"cpu": CPU_DTYPES}, None),
        (Environment(triton_installed=True, interpret=False, cuda_available=True), {"cuda": CUDA_DTYPES}, None),
    ],
    ids=["no-triton", "cpu-no-interpreter", "interpreter", "interpreter-with-cuda", "cuda"],
)
def test_capabilities_follow_environment(env, dtypes, reason) -> None:
    """cpu only under TRITON_INTERPRET (float16/float32), cuda otherwise; the reason names the fix."""
    assert dict(env.capabilities.dtypes) == dtypes
    actual = env.unavailable_reason()
    assert (actual is None) if reason is None else (reason in actual)


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("ON", True), ("0", False), ("", False)])
def test_interpret_mode_is_read_like_triton(monkeypatch, value, on) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert triton_passes.interpret_requested() is on


def test_package_import_does_not_import_triton() -> None:
    """Importing the target (and the registry loading it) is cheap: Triton loads on the first call."""
    code = ("import sys; from fa2_verify.verify.registry import load_kernel; k = load_kernel('triton'); k.capabilities; "
            "assert 'triton' not in sys.modules and 'fa2_verify.kernels.triton_fa2.kernels' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr[-2000:]


def test_registry_entry_loads() -> None:
    kernel = load_kernel("triton")
    assert kernel.target is KERNEL and isinstance(kernel.capabilities, Capabilities)
    assert kernel.capabilities.deterministic_backward and kernel.capabilities.varlen
    assert {40, 80, 96, 112, 160, 192, 256} <= set(kernel.capabilities.head_dims)
    assert kernel.config()["kernel"] == "triton_fa2"


def test_call_without_a_device_explains_why(monkeypatch) -> None:
    """No GPU and no interpreter: a one-line UnsupportedCase naming the fix, before Triton is imported."""
    monkeypatch.setattr(environment, "current", lambda: Environment(True, False, False))
    q = torch.zeros(1, 4, 1, 32, dtype=torch.float16)
    with pytest.raises(UnsupportedCase, match="TRITON_INTERPRET=1"):
        KERNEL.forward(q, q, q, softmax_scale=1.0)


def _tensor(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


def _dense(q_shape=(1, 5, 2, 32), k_shape=(1, 7, 2, 32), **overrides):
    call = {"q": _tensor(*q_shape), "k": _tensor(*k_shape), "v": _tensor(*k_shape),
            "softmax_scale": 0.2, "causal": False, "window_size": (-1, -1)}
    call.update(overrides)
    return call


def _varlen(**overrides):
    call = {"q": _tensor(9, 2, 32), "k": _tensor(9, 2, 32), "v": _tensor(9, 2, 32),
            "cu_seqlens_q": torch.tensor([0, 4, 9], dtype=torch.int32),
            "cu_seqlens_k": torch.tensor([0, 4, 9], dtype=torch.int32),
            "max_seqlen_q": 5, "max_seqlen_k": 5, "softmax_scale": 0.2, "causal": True, "window_size": (-1, -1)}
    call.update(overrides)
    return call


BAD_DENSE = {
    "q-not-tensor": (_dense(q=[1.0]), UsageError, "q=list is not a tensor"),
    "q-3d": (_dense(q=_tensor(5, 2, 32)), UsageError, r"q.shape=\(5, 2, 32\) has 3 dims"),
    "dtype-mix": (_dense(k=_tensor(1, 7, 2, 32, dtype=torch.float32)), UsageError, "k.dtype=float32 differs"),
    "heads": (_dense(q_shape=(1, 5, 3, 32)), UsageError, "heads_q=3 is not a multiple of heads_kv=2"),
    "v-shape": (_dense(v=_tensor(1, 6, 2, 32)), UsageError, r"v.shape=\(1, 6, 2, 32\) differs from k.shape"),
    "head-dim": (_dense(q_shape=(1, 5, 2, 20), k_shape=(1, 7, 2, 20)), UnsupportedCase, "head_dim=20 is not supported"),
    "bf16-cpu": (_dense(q=_tensor(1, 5, 2, 32, dtype=torch.bfloat16), k=_tensor(1, 7, 2, 32, dtype=torch.bfloat16),
                        v=_tensor(1, 7, 2, 32, dtype=torch.bfloat16)),
                 UnsupportedCase, "dtype=bfloat16 is not supported on cpu"),
    "dtype-int": (_dense(q=torch.zeros(1, 5, 2, 32, dtype=torch.int32), k=torch.zeros(1, 7, 2, 32, dtype=torch.int32),
                         v=torch.zeros(1, 7, 2, 32, dtype=torch.int32)),
                  UnsupportedCase, "dtype=int32 is not supported"),
    "window-arity": (_dense(window_size=(3,)), UsageError, r"window_size=\(3,\) is not a pair"),
    "window-bound": (_dense(window_size=(-2, 0)), UsageError, "has a bound below -1"),
    "scale-type": (_dense(softmax_scale="a"), UsageError, "softmax_scale='a' is not a number"),
    "scale-negative": (_dense(softmax_scale=-1.0), UnsupportedCase, "softmax_scale=-1.0 is not supported"),
}

BAD_VARLEN = {
    "cu-dtype": (_varlen(cu_seqlens_q=torch.tensor([0, 4, 9])), UsageError, "cu_seqlens_q has dtype=int64"),
    "cu-total": (_varlen(cu_seqlens_k=torch.tensor([0, 4, 8], dtype=torch.int32)), UsageError,
                 r"cu_seqlens_k=\[0, 4, 8\] is not 0 = c_0"),
    "cu-decreasing": (_varlen(cu_seqlens_q=torch.tensor([0, 6, 4, 9], dtype=torch.int32),
                              cu_seqlens_k=torch.tensor([0, 4, 4, 9], dtype=torch.int32)),
                      UsageError, "cu_seqlens_q=.* is not 0 = c_0"),
    "max-seqlen": (_varlen(max_seqlen_q=3), UsageError, r"max_seqlen_q=3 is below the longest sequence \(5\)"),
    "batch-mismatch": (_varlen(cu_seqlens_k=torch.tensor([0, 9], dtype=torch.int32), max_seqlen_k=9), UsageError,
                       "cu_seqlens_q has 3 offsets and cu_seqlens_k 2"),
}


@pytest.fixture
def interpreter_environment(monkeypatch):
    """The checks as they run under TRITON_INTERPRET=1 (cpu: float16, float32)."""
    monkeypatch.setattr(environment, "current", lambda: Environment(True, True, False))


@pytest.mark.parametrize("call, error, message", BAD_DENSE.values(), ids=BAD_DENSE.keys())
def test_bad_dense_call_is_rejected(interpreter_environment, call, error, message) -> None:
    with pytest.raises(error, match=message) as raised:
        validation.check_forward(**call)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("call, error, message", BAD_VARLEN.values(), ids=BAD_VARLEN.keys())
def test_bad_varlen_call_is_rejected(interpreter_environment, call, error, message) -> None:
    with pytest.raises(error, match=message) as raised:
        validation.check_forward_varlen(**call)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"dout": _tensor(1, 4, 2, 32)}, r"dout.shape=\(1, 4, 2, 32\) differs from q.shape"),
        ({"lse": torch.zeros(1, 2, 5, dtype=torch.float16)}, r"lse has shape=\(1, 2, 5\), dtype=float16"),
        ({"lse": torch.zeros(1, 5, 2)}, r"expected float32 \(1, 2, 5\)"),
    ],
    ids=["dout-shape", "lse-dtype", "lse-layout"],
)
def test_bad_backward_inputs_are_rejected(interpreter_environment, change, message) -> None:
    call = _dense()
    problem = validation.check_forward(**call)
    extras = {"dout": torch.zeros_like(call["q"]), "out": torch.zeros_like(call["q"]),
              "lse": torch.zeros(1, 2, 5)}
    validation.check_backward_extras(problem, call["q"], **extras)
    extras.update(change)
    with pytest.raises(UsageError, match=message):
        validation.check_backward_extras(problem, call["q"], **extras)


def test_problem_pads_head_dim_to_a_power_of_two(interpreter_environment) -> None:
    sizes = {}
    for head_dim in (32, 40, 64, 80, 96, 112, 128, 160, 192, 256):
        call = _dense(q_shape=(1, 5, 2, head_dim), k_shape=(1, 7, 2, head_dim))
        sizes[head_dim] = validation.check_forward(**call).block_d
    assert sizes == {32: 32, 40: 64, 64: 64, 80: 128, 96: 128, 112: 128, 128: 128, 160: 256, 192: 256, 256: 256}


def test_causal_is_a_right_window_of_zero(interpreter_environment) -> None:
    problem = validation.check_forward(**_dense(causal=True, window_size=(5, 9)))
    assert (problem.left, problem.right) == (5, 0)


@pytest.mark.parametrize("target", sorted(configs.TABLES))
def test_tile_table_covers_every_pass_precision_and_head_dim(target) -> None:
    for pass_name in configs.PASSES:
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for block_d in (32, 64, 128, 256):
                for seqlen in (1, configs.SHORT_SEQLEN, configs.SHORT_SEQLEN + 1):
                    tile = configs.select(target, pass_name, dtype, block_d, seqlen)
                    assert tile.block_m >= 16 and tile.block_n >= 16, (target, pass_name, block_d)


def test_short_sequences_use_their_own_rows() -> None:
    short = configs.select("sm90", "forward", torch.float16, 128, configs.SHORT_SEQLEN)
    long = configs.select("sm90", "forward", torch.float16, 128, configs.SHORT_SEQLEN + 1)
    assert short != long and short == configs.SHORT_TABLES["sm90"][("forward", "16bit", 128)]
