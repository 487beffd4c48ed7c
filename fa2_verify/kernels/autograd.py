"""Any autograd attention function as a kernel target, in one call: :func:`autograd_target`.

Most kernels people ship are autograd functions,
``out = fn(q, k, v, causal=..., softmax_scale=...)`` then ``out.backward(dout)``,
often in (batch, heads, seqlen, head_dim) layout and often without an LSE.
:func:`autograd_target` turns one into the contract of docs/design.md
("The kernel contract"):

* ``forward`` calls ``fn`` without gradients on the contract's tensors
  (transposed views for ``layout="bhsd"``), takes ``out`` from what it returns
  (the tensor itself, or the first element of a tuple) and the LSE through the
  ``lse`` callable, converted to the natural log (``lse_base=2``:
  ``lse * ln 2``).  Without an ``lse`` callable the target declares
  ``lse=False``: the forward returns ``(out, None)`` and the LSE is reported
  as unsupported ("kernel provides no LSE"), never as passed.
* ``backward`` recomputes ``fn`` with gradients on leaf copies of q, k, v and
  differentiates it with ``dout`` (``torch.autograd.grad``, unused inputs
  giving zeros).  Recomputing, rather than keeping the graph of the forward
  call, keeps the target stateless: the ``out`` and ``lse`` the harness hands
  back are never touched, so the backward cannot modify the forward's outputs,
  and each entry point allocates its own outputs under poisoning.  The
  gradients are those of the recomputed forward, which is what the function
  returns for the same inputs when its forward is deterministic.
* ``window_size`` is passed to ``fn`` only when the capabilities declare
  ``window=True``, so a function without that keyword works as long as it
  does not claim windows.  ``deterministic`` is not passed: a target declaring
  ``deterministic_backward`` states that its one backward is deterministic.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import torch

from fa2_verify.core.contract import UNBOUNDED, Capabilities
from fa2_verify.core.errors import UsageError

#: Layouts a function may take its tensors in.
LAYOUTS = ("bshd", "bhsd")

#: Bases an LSE may come in: the natural log (the contract's) or log2.
LSE_BASES = {math.e: "e", 2: "2"}


def recomputed_gradients(
    call: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor], dout, q, k, v
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)``: ``out = call(q, k, v)`` recomputed on leaf copies of q, k, v and differentiated
    with ``dout`` (``torch.autograd.grad``; an input ``out`` does not depend on gets zeros)."""
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        return torch.autograd.grad(call(*leaves), leaves, dout, materialize_grads=True)


def _capabilities(capabilities: Capabilities | Mapping[str, Any], provides_lse: bool) -> Capabilities:
    """The declared capabilities with ``lse`` set from whether an ``lse`` callable was given."""
    if isinstance(capabilities, Mapping) and "lse" in capabilities:
        raise UsageError(
            f"capabilities lse={capabilities['lse']!r}: leave it out, autograd_target sets it from its lse argument"
        )
    declared = Capabilities.from_mapping(capabilities)
    if provides_lse and not declared.lse:
        raise UsageError("capabilities lse=False contradicts the lse function given: pass lse=None, or drop lse=False")
    if declared.varlen:
        raise UsageError("capabilities varlen=True: autograd_target has no varlen entry points; declare varlen=False")
    return dataclasses.replace(declared, lse=provides_lse)


class AutogradTarget:
    """The contract around an autograd function (see the module docstring)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        layout: str,
        lse: Callable[[Any], torch.Tensor] | None,
        lse_base: float,
        capabilities: Capabilities,
    ) -> None:
        self.fn = fn
        self.layout = layout
        self.lse = lse
        self.lse_base = lse_base
        self.capabilities = capabilities

    def config(self) -> dict[str, Any]:
        return {
            "function": f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))}",
            "layout": self.layout,
            "lse": "none" if self.lse is None else f"base {LSE_BASES[self.lse_base]}",
        }

    def _call(self, q, k, v, *, softmax_scale, causal, window_size) -> Any:
        """``fn`` on the contract's tensors in the function's layout."""
        if self.layout == "bhsd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        keywords: dict[str, Any] = {"causal": causal, "softmax_scale": softmax_scale}
        if self.capabilities.window:
            keywords["window_size"] = tuple(window_size)
        return self.fn(q, k, v, **keywords)

    def _out(self, returned: Any) -> torch.Tensor:
        out = returned[0] if isinstance(returned, (tuple, list)) else returned
        return out.transpose(1, 2) if self.layout == "bhsd" and isinstance(out, torch.Tensor) else out

    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED)):
        with torch.no_grad():
            returned = self._call(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)
            if self.lse is None:
                return self._out(returned), None
            lse = self.lse(returned)
            if isinstance(lse, torch.Tensor) and self.lse_base == 2:
                lse = (lse.to(torch.float64) * math.log(2)).to(lse.dtype)
            return self._out(returned), lse

    def backward(
        self, dout, q, k, v, out, lse, *, softmax_scale, causal=False, window_size=(UNBOUNDED, UNBOUNDED),
        deterministic=False,
    ):  # fmt: skip
        masking = {"softmax_scale": softmax_scale, "causal": causal, "window_size": window_size}
        return recomputed_gradients(lambda *leaves: self._out(self._call(*leaves, **masking)), dout, q, k, v)


def autograd_target(
    fn: Callable[..., Any],
    *,
    capabilities: Capabilities | Mapping[str, Any],
    layout: str = "bshd",
    lse: Callable[[Any], torch.Tensor] | None = None,
    lse_base: float = math.e,
) -> AutogradTarget:
    """A kernel target from ``out = fn(q, k, v, causal=..., softmax_scale=...[, window_size=...])``.

    ``layout``: ``"bshd"`` (batch, seqlen, heads, head_dim), the contract's, or
    ``"bhsd"`` (batch, heads, seqlen, head_dim).  ``lse``: ``None`` when the
    function gives no LSE, else a callable taking what ``fn`` returned and
    giving the LSE, float32 (batch, heads_q, seqlen_q), in base ``lse_base``
    (``math.e`` or ``2``).  ``capabilities``: a :class:`Capabilities` or a plain
    mapping of its fields (``lse`` is set from the ``lse`` argument).  Every bad
    argument raises a one-line :class:`~core.errors.UsageError`.
    """
    if not callable(fn):
        raise UsageError(f"fn={fn!r} is not callable: pass the attention function")
    if layout not in LAYOUTS:
        raise UsageError(f"layout={layout!r} is not a layout: use one of {', '.join(LAYOUTS)}")
    if lse is not None and not callable(lse):
        raise UsageError(f"lse={lse!r} is not callable: pass None, or a function of fn's return value giving the LSE")
    if lse_base not in LSE_BASES:
        raise UsageError(f"lse_base={lse_base!r} is not supported: use math.e or 2")
    return AutogradTarget(
        fn, layout=layout, lse=lse, lse_base=lse_base, capabilities=_capabilities(capabilities, lse is not None)
    )
