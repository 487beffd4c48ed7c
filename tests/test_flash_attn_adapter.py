"""The ``flash-attn`` adapter (kernels/flash_attn.py): the 'not installed' report, and the
mapping of the contract onto flash_attn_func / flash_attn_varlen_func, checked against a
stand-in package that computes float64 attention (the real package is not installed here)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from fa2_verify.kernels import flash_attn
from fa2_verify.kernels.flash_attn import KERNEL
from tests.naive import attention, attention_grads, make_inputs
from fa2_verify.core.errors import UnsupportedCase
from fa2_verify.verify.registry import load_kernel


def test_missing_package_is_reported(monkeypatch) -> None:
    """Without the package: a reason naming it, and every call refused with it (never an ImportError)."""
    monkeypatch.setattr(flash_attn, "_package_installed", lambda: False)
    kernel = load_kernel("flash-attn")
    assert "flash-attn package is not installed" in kernel.unavailable_reason()
    assert "flash-attn package is not installed" in kernel.unavailable_reason("cuda")
    assert kernel.config() == {"kernel": "flash-attn", "flash_attn": None}
    q, k, v, dout = make_inputs((1, 4, 4, 1, 1, 8), torch.float16)
    with pytest.raises(UnsupportedCase, match="not installed"):
        KERNEL.forward(q, k, v, softmax_scale=0.5)
    with pytest.raises(UnsupportedCase, match="not installed"):
        KERNEL.backward(dout, q, k, v, q, None, softmax_scale=0.5, deterministic=True)


def test_no_gpu_is_reported(monkeypatch) -> None:
    monkeypatch.setattr(flash_attn, "_package_installed", lambda: True)
    monkeypatch.setattr(flash_attn, "_cuda_available", lambda: False)
    assert "no CUDA device" in KERNEL.unavailable_reason()


@pytest.fixture
def stand_in(monkeypatch):
    """A fake ``flash_attn`` package: float64 attention, recording each call's keyword arguments."""
    calls: list[tuple[str, dict]] = []

    def flash_attn_func(q, k, v, *, dropout_p, softmax_scale, causal, window_size, return_attn_probs=False,
                        deterministic=False):
        calls.append(("func", {"dropout_p": dropout_p, "causal": causal, "window_size": window_size,
                               "return_attn_probs": return_attn_probs, "deterministic": deterministic}))
        out, lse = attention(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
        return (out, lse, None) if return_attn_probs else out

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, *, dropout_p, softmax_scale, causal, window_size,
                               return_attn_probs=False, deterministic=False):
        calls.append(("varlen", {"cu": (cu_q.tolist(), cu_k.tolist()), "max": (max_q, max_k),
                                 "return_attn_probs": return_attn_probs, "deterministic": deterministic}))
        out, lse = attention(q[None], k[None], v[None], softmax_scale=softmax_scale, causal=causal,
                             window_size=window_size)
        return (out[0], lse[0], None) if return_attn_probs else out[0]

    package = types.SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func,
                                    __version__="stand-in")
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setattr(flash_attn, "_package_installed", lambda: True)
    monkeypatch.setattr(flash_attn, "_cuda_available", lambda: True)
    return calls


def test_forward_maps_onto_flash_attn_func(stand_in) -> None:
    """Mask and scale pass through as flash-attn's own; out and lse come back untouched."""
    q, k, v, _ = make_inputs((2, 9, 13, 4, 2, 8), torch.float64)
    mask = {"causal": True, "window_size": (3, -1)}
    out, lse = KERNEL.forward(q, k, v, softmax_scale=0.3, **mask)
    expected_out, expected_lse = attention(q, k, v, softmax_scale=0.3, **mask)
    assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse)
    assert stand_in == [("func", {"dropout_p": 0.0, "causal": True, "window_size": (3, -1),
                                  "return_attn_probs": True, "deterministic": False})]
    assert KERNEL.config()["flash_attn"] == "stand-in"


def test_backward_differentiates_flash_attn_func(stand_in) -> None:
    """dq, dk, dv are the autograd gradients of flash_attn_func, with deterministic= passed on."""
    q, k, v, dout = make_inputs((1, 7, 7, 2, 1, 8), torch.float64)
    grads = KERNEL.backward(dout, q, k, v, None, None, softmax_scale=0.3, causal=True, deterministic=True)
    expected = attention_grads(dout, q, k, v, softmax_scale=0.3, causal=True)
    for actual, want in zip(grads, expected):
        torch.testing.assert_close(actual, want, rtol=1e-12, atol=1e-12)
    assert stand_in[-1][1]["deterministic"] is True
    assert not any(t.requires_grad for t in (q, k, v))


def test_varlen_maps_onto_flash_attn_varlen_func(stand_in) -> None:
    q, k, v, dout = (t[0] for t in make_inputs((1, 6, 6, 2, 2, 8), torch.float64))
    cu = torch.tensor([0, 6], dtype=torch.int32)
    out, lse = KERNEL.forward_varlen(q, k, v, cu, cu, 6, 6, softmax_scale=0.3)
    grads = KERNEL.backward_varlen(dout, q, k, v, out, lse, cu, cu, 6, 6, softmax_scale=0.3, deterministic=True)
    assert out.shape == q.shape and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert stand_in[0] == ("varlen", {"cu": ([0, 6], [0, 6]), "max": (6, 6), "return_attn_probs": True,
                                      "deterministic": False})
    assert stand_in[1][1]["deterministic"] is True
