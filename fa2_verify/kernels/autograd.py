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
* The mask and scale reach ``fn`` under its own parameter names, read once
  from ``inspect.signature(fn)`` when the target is made (:func:`call_spelling`):
  flash-attn's ``causal, softmax_scale``, PyTorch SDPA's ``is_causal, scale``,
  the Triton tutorial's ``causal, sm_scale`` (its ``_attention.apply`` is read
  from ``forward`` and called positionally), or the names given in
  ``argnames``.  ``causal`` may be absent from a function declaring
  ``causal_only`` (or no causal masks), ``softmax_scale`` from one declaring
  ``custom_softmax_scale=False``; ``window_size`` is passed only when the
  capabilities declare ``window=True``.  Anything else missing is a one-line
  error naming it.  ``deterministic`` is not passed: a target declaring
  ``deterministic_backward`` states that its one backward is deterministic.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, Callable, Mapping

import torch

from fa2_verify.core.contract import UNBOUNDED, Capabilities
from fa2_verify.core.errors import UsageError

#: Layouts a function may take its tensors in.
LAYOUTS = ("bshd", "bhsd")

#: Bases an LSE may come in: the natural log (the contract's) or log2.
LSE_BASES = {math.e: "e", 2: "2"}


#: The contract's keywords a function receives, and the parameter names each is found under unless named.
KNOWN_ARGNAMES: dict[str, tuple[str, ...]] = {
    "causal": ("causal", "is_causal"),
    "softmax_scale": ("softmax_scale", "scale", "sm_scale"),
    "window_size": ("window_size",),
}


@dataclasses.dataclass(frozen=True)
class CallSpelling:
    """How ``fn`` takes the contract's keywords: ``positional`` (in order, right after q, k, v) and
    ``keywords`` (contract keyword -> fn's parameter name)."""

    positional: tuple[str, ...]
    keywords: Mapping[str, str]

    def arguments(self, values: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """``(args, kwargs)`` after q, k, v for the contract's ``values``."""
        return [values[role] for role in self.positional], {name: values[role] for role, name in self.keywords.items()}


def _parameters(fn: Callable[..., Any]) -> tuple[list[inspect.Parameter] | None, bool]:
    """``(parameters, positional)``: ``fn``'s parameters (``None`` when its signature cannot be read), and
    whether it is an ``autograd.Function``'s ``apply``, read from ``forward`` without ``ctx`` and called
    positionally (older PyTorch releases take no keywords there)."""
    owner = getattr(fn, "__self__", None)
    is_apply = isinstance(owner, type) and issubclass(owner, torch.autograd.Function) and fn.__name__ == "apply"
    try:
        parameters = list(inspect.signature(owner.forward if is_apply and owner is not None else fn).parameters.values())
    except (TypeError, ValueError):
        return None, False
    return (parameters[1:] if is_apply else parameters), is_apply


def call_spelling(
    fn: Callable[..., Any], argnames: Mapping[str, str] | None, capabilities: Capabilities
) -> CallSpelling:
    """The :class:`CallSpelling` of ``fn``: each contract keyword it needs, found by ``argnames`` or by
    :data:`KNOWN_ARGNAMES`; a one-line :class:`UsageError` naming what was not found.

    ``causal`` is needed when the kernel runs both causal and non-causal
    masks, ``softmax_scale`` when it declares ``custom_softmax_scale``,
    ``window_size`` when it declares ``window``; one not needed is still passed
    when ``fn`` has it.  A function taking ``**kwargs`` gets the contract's
    names where it has no parameter of its own; one whose signature cannot be
    read (a builtin) gets the names in ``argnames``.
    """
    named = dict(argnames or {})
    if not all(role in KNOWN_ARGNAMES and isinstance(name, str) and name for role, name in named.items()):
        raise UsageError(
            f"argnames={argnames!r} is not valid: map {', '.join(KNOWN_ARGNAMES)} to fn's parameter names"
        )
    needed = {
        "causal": capabilities.causal and not capabilities.causal_only,
        "softmax_scale": capabilities.custom_softmax_scale,
        "window_size": capabilities.window,
    }
    parameters, by_position = _parameters(fn)
    plain = [p for p in parameters or () if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    any_keyword = parameters is not None and any(p.kind is p.VAR_KEYWORD for p in parameters)
    where: dict[int, str] = {}
    keywords: dict[str, str] = {}
    for role, wanted in needed.items():
        if role == "window_size" and not wanted:
            continue
        candidates = (named[role],) if role in named else KNOWN_ARGNAMES[role]
        found = next((p for p in plain if p.name in candidates), None)
        if found is None and (role in named and parameters is None or any_keyword):
            keywords[role] = named.get(role, role)  # into **kwargs: the name given, else the contract's
        elif found is None and wanted:
            shown = "fn(...)" if parameters is None else f"fn{inspect.Signature(parameters)}"
            raise UsageError(
                f"{shown} has no parameter for {role} (looked for {', '.join(candidates)}): "
                f'name it with argnames={{"{role}": NAME}}'
            )
        elif found is not None and (by_position or found.kind is found.POSITIONAL_ONLY):
            where[plain.index(found)] = role
        elif found is not None:
            keywords[role] = found.name
    if sorted(where) != list(range(3, 3 + len(where))):
        raise UsageError(
            f"fn{inspect.Signature(parameters)} takes {', '.join(where.values())} by position, but not right "
            "after q, k, v: wrap fn in a function that takes them by keyword"
        )
    return CallSpelling(positional=tuple(where[index] for index in sorted(where)), keywords=keywords)


def recomputed_gradients(
    call: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor], dout, q, k, v
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)``: ``out = call(q, k, v)`` recomputed on leaf copies of q, k, v and differentiated
    with ``dout`` (``torch.autograd.grad``; an input ``out`` does not depend on gets zeros)."""
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        dq, dk, dv = torch.autograd.grad(call(*leaves), leaves, dout, materialize_grads=True)
    return dq, dk, dv


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
        spelling: CallSpelling,
    ) -> None:
        self.fn = fn
        self.spelling = spelling
        self.layout = layout
        self.lse = lse
        self.lse_base = lse_base
        self.capabilities = capabilities

    def config(self) -> dict[str, Any]:
        return {
            "function": f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))}",
            "layout": self.layout,
            "lse": "none" if self.lse is None else f"base {LSE_BASES[self.lse_base]}",
            "arguments": {**dict.fromkeys(self.spelling.positional, "positional"), **self.spelling.keywords},
        }

    def _call(self, q, k, v, *, softmax_scale, causal, window_size) -> Any:
        """``fn`` on the contract's tensors in the function's layout."""
        if self.layout == "bhsd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        values = {"causal": causal, "softmax_scale": softmax_scale, "window_size": tuple(window_size)}
        args, keywords = self.spelling.arguments(values)
        return self.fn(q, k, v, *args, **keywords)

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
    argnames: Mapping[str, str] | None = None,
) -> AutogradTarget:
    """A kernel target from ``out = fn(q, k, v, causal=..., softmax_scale=...[, window_size=...])``.

    ``fn``'s own names for the mask and scale are read from its signature
    (:func:`call_spelling`: ``causal``/``is_causal``, ``softmax_scale``/``scale``/``sm_scale``),
    or given once, e.g. ``argnames={"causal": "is_causal", "softmax_scale": "scale"}``.

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
    declared = _capabilities(capabilities, lse is not None)
    spelling = call_spelling(fn, argnames, declared)
    return AutogradTarget(fn, layout=layout, lse=lse, lse_base=lse_base, capabilities=declared, spelling=spelling)
