"""The statistical, local and bias verdicts: a kernel's error in units of a model kernel's rounding noise.

The worst-case verdict (:mod:`verify.error_model`) proves that no correct
kernel exceeds its bound, but its bound grows like ``n u`` while real
rounding grows like ``sqrt(n) u``; at 65k to 131k keys an error a hundred
times the real noise passes it.  These three verdicts measure the noise
instead (docs/error-model.md, "Statistical and local verdicts"):

* the **model kernel** (:mod:`verify.model_kernel`) computes the case with
  FlashAttention-2's numerics in the case dtype, and its error ``e^M = |M - golden|`` is the rounding noise a
  correct kernel makes on these inputs;
* each element's **noise unit** is the larger of the largest model error in
  its tile (:data:`TILE` rows of one batch and head, or keys of one batch and
  kv head; every channel; a shorter last tile takes the last ``TILE`` tokens)
  and its worst-case bound times the tile's largest ratio of model error to
  bound, plus the element's own last rounding (half an
  ulp of the golden in ``T``; for ``lse``, float32's ulp and the exp and log
  approximations ``u_f (1 + ln n_i)`` of eq. (3));
* ``r = |actual - golden| / unit``.  **Statistical verdict**: an element with
  ``r > STATISTICAL_THRESHOLD`` is inconsistent with rounding.  **Local
  verdict**: the root mean square of ``r`` over a group (a row, a tile, a head,
  a batch, of at least :data:`MIN_GROUP_ELEMENTS` judged elements) above
  ``LOCAL_RATIO`` times the model's own over the same group
  (at least ``LOCAL_FLOOR``) is an error out of line with rounding: stale
  rows, a dropped key block, a head read from the wrong offset or scaled, a
  lost dQ update.  **Bias verdict** (:func:`bias`, ``out`` only): a head or a
  batch whose rows' signed errors lean one way (a self-normalized sum above
  :data:`BIAS_Z`, a mean above ``BIAS_RATIO`` times the model's and
  :data:`BIAS_FLOOR`) where rounding to nearest errs both ways: a head scaled
  by ``1 + eps`` with ``eps`` of the order of ``u``, under an ulp per element;
  its own premise asks the rows to round independently.

All rest on one premise: the rounding to ``T`` dominates the noise of
every correct kernel, so that what a kernel does otherwise (another
summation order, base-2 exponentials, split-KV weights in float32) adds
little.  They apply to float16 and bfloat16 cases only (float32 and float64
cases keep the worst-case verdict alone), and within a case only to tokens
whose sums have at least :data:`FEWEST_TERMS` terms and to the rows
where the exponentials' argument error ``u_a (|S_ij| + M_i)`` of eq. (1) is
small next to ``u``: ``u_a (2 M_i + 1) <= u / 8`` (:func:`premise`); for dQ
and dK also where the float32 sums ``dP_ij`` and ``D_i`` resolve their
difference ``dS_ij / P_ij`` to ``u``: ``u_a sum_j P_ij (|dO_i| . |V_j| + |D_i|)
<= u / 8 sum_j P_ij |dP_ij - D_i|``; dK and dV of a (batch, kv head) only when
every row of its query heads qualifies.
Elsewhere, as for logits far below zero where float32 cannot resolve
``S - m`` to ``u``, rows whose ``dS`` cancels below float32's resolution
of ``dP`` and ``D`` (a one-hot softmax row: ``D_i = dP_ij*``, so that another
summation order of the two leaves float32 noise the model may not make), and,
in a dtype that resolves below float32's smallest normal (bfloat16), elements
whose bound's share for float32 flushing exceeds ``u / 8`` of ``|x*|``
(a kernel that flushes errs there by what the model, which keeps subnormals,
does not: :func:`flush_matters`), and for the outputs a kernel accumulates in partial sums
rounded to ``T`` (:func:`judged_outputs`), the worst-case verdict alone judges.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from fa2_verify.core.case import CaseSpec
from fa2_verify.verify.error_model import (
    PartialSums,
    accumulation_unit,
    flush_unit,
    rows_seeing_keys,
    underflow_unit,
    unit_roundoff,
)
from fa2_verify.verify.metrics import tensor_path, ulp

#: Tokens (query rows, or keys for dK and dV) per tile: the noise unit's neighbourhood and a local group.
TILE = 64

#: Largest ``r`` of a correct kernel: its error at most this many times the model's largest in the tile.
STATISTICAL_THRESHOLD = 4.0

#: A group is out of line when its RMS ``r`` exceeds this many times the model's own RMS over the group ...
LOCAL_RATIO = 4.0

#: ... taken as at least this many noise units, so that where the model is exact (RMS 0) a group of
#: one-ulp differences (``r`` at most 2) is not flagged.
LOCAL_FLOOR = 0.5

#: Smallest group, in judged elements, the local verdict judges: the RMS of fewer is no average, and one element
#: is the statistical verdict's (a group of one would face ``LOCAL_RATIO x LOCAL_FLOOR`` = 2 units where an
#: element faces :data:`STATISTICAL_THRESHOLD`).  A row of ``lse`` is one element, a one-row last tile of it too.
MIN_GROUP_ELEMENTS = 16

#: The outputs the bias verdict judges: ``out``, whose rows' scale errors from rounding ``P~`` the model
#: measures (:func:`bias`).
BIAS_OUTPUTS = ("out",)

#: A group leans one way when the self-normalized sum of its rows' signed errors exceeds this (at most
#: ``2 exp(-BIAS_Z^2 / 2)``, 3e-8, for rows whose errors are independent and symmetric; Efron 1969) ...
BIAS_Z = 6.0

#: ... and its mean signed error exceeds this many times the model's own over the group ...
BIAS_RATIO = 4.0

#: ... and this many noise units, so that a systematic error of a legitimate kernel far below the rounding
#: (approximate exponentials and reciprocals: float32's ulp against ``T``'s) is not flagged.
BIAS_FLOOR = 0.125

#: The bias verdict's premise: the model's row scale errors are not all 0, and have a self-normalized sum over the
#: group of at most this, as independent errors do ...
PREMISE_Z = 4.0

#: ... or a mean below this many ``u``: the common lean of long bfloat16 rows (the density of ``P~`` falls across
#: each ulp cell, so rounding to nearest goes down slightly more often: about ``-3e-6`` at 16,384 keys), which
#: every kernel that rounds ``P~`` to ``T`` shares and which is 1/20 of this.
PREMISE_MEAN = 1 / 64


#: Dtypes these verdicts apply to.
DTYPES = (torch.float16, torch.bfloat16)

#: Per output: whether its tokens are keys, and the permutation to (batch, head, token, channel).
_LAYOUT = {
    "out": ("rows", (0, 2, 1, 3)),
    "lse": ("rows", None),
    "dq": ("rows", (0, 2, 1, 3)),
    "dk": ("keys", (0, 2, 1, 3)),
    "dv": ("keys", (0, 2, 1, 3)),
}


def judged_outputs(spec: CaseSpec, partials: PartialSums) -> tuple[str, ...]:
    """The outputs of ``spec`` the statistical and local verdicts judge: none for a case that is not 16-bit;
    else all but those the kernel accumulates in partial sums rounded to ``T`` (``partials``, eqs. 2b, 7b to
    9b): there intermediate roundings to ``T`` join the final one, with a structure the model kernel does not
    copy, so the premise that the model's noise is the kernel's no longer holds."""
    if spec.torch_dtype not in DTYPES:
        return ()
    declared = set()
    if partials.out_splits is not None and partials.out_splits > 1:
        declared.add("out")
    if partials.dq_keys is not None:
        declared.add("dq")
    if partials.dkv_rows is not None:
        declared.update(("dk", "dv"))
    return tuple(name for name in _LAYOUT if name not in declared)


def _canonical(output: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as (batch, head, token, channel); ``lse`` gains a channel axis of 1."""
    order = _LAYOUT[output][1]
    return tensor.unsqueeze(-1) if order is None else tensor.permute(order)


def _tiles(values: torch.Tensor) -> torch.Tensor:
    """(batch, head, tokens, channels) zero-padded to whole tiles, as (batch, head, tiles, TILE x channels)."""
    batch, heads, tokens, channels = values.shape
    padded = torch.nn.functional.pad(values, (0, 0, 0, (-tokens) % TILE))
    return padded.reshape(batch, heads, -1, TILE * channels)


def _terms(spec: CaseSpec, output: str, device: torch.device) -> torch.Tensor:
    """Int64 (tokens,): the keys each row sees (``out``, ``lse``, ``dq``), or the rows that see each key times
    the query heads of a group (``dk``, ``dv``): how many terms the token's sums have."""
    first, last = spec.visible_ranges(device)
    if _LAYOUT[output][0] == "rows":
        return (last - first + 1).clamp(min=0)
    first_row, last_row = rows_seeing_keys(first, last, spec.seqlen_k)
    return (spec.heads_q // spec.heads_kv) * (last_row - first_row + 1).clamp(min=0)


#: Fewest terms of a judged sum.  Below it the model's noise is a sample of a few roundings, too small to
#: describe another order's (a sum of 3 terms may be exact in one order and not in another), and the
#: worst-case bound is sharp: its accumulation term ``gamma_{2n}`` is at most ``256 u_a``, ``u / 32`` for
#: float16 and ``u / 256`` for bfloat16.
FEWEST_TERMS = 128


def _own_rounding(spec: CaseSpec, output: str, expected: torch.Tensor) -> torch.Tensor:
    """The element's own last rounding: half an ulp in ``T``; for ``lse`` float32's ulp plus ``u_f (1 + ln n_i)``."""
    if output != "lse":
        return ulp(expected, spec.torch_dtype) / 2
    first, last = spec.visible_ranges(expected.device)
    keys = (last - first + 1).clamp(min=1).to(torch.float64)
    u_f = 4 * accumulation_unit(spec.torch_dtype)
    finite = torch.where(torch.isfinite(expected), expected, 0.0)
    return ulp(finite, torch.float32) + u_f * (1 + torch.log(keys))[:, None]


#: The premise's margin: the exponentials' argument error at most ``u / PREMISE_MARGIN``.
PREMISE_MARGIN = 8


def flush_matters(dtype: torch.dtype) -> bool:
    """Whether float32's flushing (``eta_a``, docs/error-model.md, "Underflow in the float32 accumulation") can
    outweigh the rounding to ``dtype``: ``dtype`` resolves below float32's smallest normal (bfloat16, whose
    underflow unit is 2^-134; float16's own, 2^-25, dominates any flush)."""
    return underflow_unit(dtype) < flush_unit(dtype)


#: The outputs computed from ``dS = P (dP - D)``, whose premise also asks float32 to resolve ``dP - D``.
DS_OUTPUTS = ("dq", "dk")


def premise(spec: CaseSpec, output: str, model: dict[str, torch.Tensor], expected: torch.Tensor | None = None,
            flush_share: torch.Tensor | None = None) -> torch.Tensor:
    """Bool, broadcastable to (batch, head, token, channel): where the verdicts judge (module docstring): tokens
    whose sums have at least :data:`FEWEST_TERMS` terms, and rows whose exponentials' argument error is small
    next to ``u`` and, for :data:`DS_OUTPUTS`, whose ``dP - D`` float32 resolves to ``u`` (for ``dk``, ``dv``:
    every row of the (batch, kv head)); given the golden ``expected`` and the bound's ``flush_share`` (where
    :func:`flush_matters`), only the elements where that share is at most ``u / 8`` of ``|x*|``.

    ``model`` holds the model kernel's ``logit_max`` (``M_i``) and, for :data:`DS_OUTPUTS`, ``ds_signal`` and
    ``ds_magnitude`` (:func:`verify.model_kernel.model_attention`), each (batch, heads_q, seqlen_q).
    """
    dtype = spec.torch_dtype
    logit_max = model["logit_max"]
    device = logit_max.device
    u_a, u = accumulation_unit(dtype), unit_roundoff(dtype)
    rows = u_a * (2 * logit_max.to(torch.float64) + 1) <= u / PREMISE_MARGIN
    if output in DS_OUTPUTS:
        signal = model["ds_signal"].to(device, torch.float64)
        rows &= u_a * model["ds_magnitude"].to(device, torch.float64) <= u / PREMISE_MARGIN * signal
    long_sums = (_terms(spec, output, device) >= FEWEST_TERMS)[None, None, :, None]
    if _LAYOUT[output][0] == "rows":
        judged = rows[..., None] & long_sums
    else:
        group = spec.heads_q // spec.heads_kv
        judged = rows.unflatten(1, (spec.heads_kv, group)).flatten(2).all(-1)[:, :, None, None] & long_sums
    if expected is None or flush_share is None:
        return judged
    golden = _canonical(output, expected.to(device, torch.float64)).abs()
    return judged & (_canonical(output, flush_share.to(device, torch.float64)) <= u / PREMISE_MARGIN * golden)


@dataclasses.dataclass(frozen=True)
class Noise:
    """One output's errors in noise units, (batch, head, token, channel) float64 (:func:`noise_units`)."""

    #: The kernel's ``|error| / unit``, and the model's.
    r: torch.Tensor
    r_model: torch.Tensor
    unit: torch.Tensor
    #: For the outputs of :data:`BIAS_OUTPUTS` (else None): the signed errors in the golden's direction,
    #: ``(actual - golden) sign(golden) / unit``, the kernel's (0 where ``r`` is infinite) and the model's.
    lean: torch.Tensor | None = None
    lean_model: torch.Tensor | None = None


def noise_units(spec: CaseSpec, output: str, actual: torch.Tensor, expected: torch.Tensor,
                model: torch.Tensor, bound: torch.Tensor) -> Noise:
    """The kernel's error and the model's in noise units, and the unit.

    ``bound`` is the output's worst-case bound (:func:`verify.error_model.first_order_bounds`): it carries
    each element's own scale into its tile's noise (module docstring).

    ``r`` is 0 where the golden is not finite (the worst-case verdict judges
    those elements) and ``+inf`` where the kernel is not finite but the golden
    is.  Where the model is not finite but the golden is (it overflowed ``T``)
    its tile's noise is infinite and ``r`` 0 there.  The premise is not applied here (:func:`judge`).
    """
    expected = _canonical(output, expected.to(torch.float64))
    actual = _canonical(output, actual.to(expected.device, torch.float64))
    model = _canonical(output, model.to(expected.device, torch.float64))
    finite = torch.isfinite(expected)
    bound = _canonical(output, bound.to(expected.device, torch.float64))
    bound = torch.where(finite, bound, 1.0)
    model_error = torch.where(finite, (model - expected).abs(), 0.0).nan_to_num(nan=math.inf)
    tokens = expected.shape[2]

    def per_tile(values: torch.Tensor) -> torch.Tensor:
        """The maximum of ``values`` over each element's tile (:func:`_unit_tile`), at each element."""
        maxima = _tiles(values).amax(-1)
        if tokens > TILE and tokens % TILE:
            maxima[:, :, -1] = values[:, :, -TILE:].amax((-2, -1))
        return maxima.repeat_interleave(TILE, dim=2)[:, :, :tokens, None]

    noise = torch.maximum(per_tile(model_error), bound * per_tile(model_error / bound))
    unit = noise + _own_rounding(spec, output, expected)
    error = torch.where(finite, (actual - expected).abs(), 0.0).nan_to_num(nan=math.inf)
    error = torch.where(finite & ~torch.isfinite(actual), math.inf, error)
    r = torch.where(torch.isinf(unit), 0.0, torch.where(error == 0, 0.0, error / unit))
    r_model = torch.where(torch.isinf(unit), 0.0, model_error / unit)
    if output not in BIAS_OUTPUTS:
        return Noise(r, r_model, unit)
    direction = torch.where(finite & torch.isfinite(unit), torch.sign(expected), 0.0)
    lean = torch.where(torch.isinf(r), 0.0, torch.nan_to_num((actual - expected) * direction / unit))
    lean_model = torch.nan_to_num((model - expected) * direction / unit, posinf=0.0, neginf=0.0)
    return Noise(r, r_model, unit, lean, lean_model)


def _token_span(output: str, tokens: range) -> str:
    noun = "keys" if _LAYOUT[output][0] == "keys" else "rows"
    if len(tokens) == 1:
        return f"{noun[:-1]} {tokens.start}"
    return f"{noun} {tokens.start}-{tokens.stop - 1}"


def _head_noun(output: str) -> str:
    return "kv head" if _LAYOUT[output][0] == "keys" else "head"


def _original_index(output: str, b: int, h: int, t: int, c: int) -> list[int]:
    """The index into ``output`` of canonical position (batch, head, token, channel)."""
    return [b, h, t] if _LAYOUT[output][1] is None else [b, t, h, c]


def statistical(output: str, r: torch.Tensor, unit: torch.Tensor, first_batch: int = 0) -> dict[str, Any]:
    """The statistical verdict's record: ``score`` (largest ``r`` over :data:`STATISTICAL_THRESHOLD`;
    above 1 fails), the element, its ``r`` and noise unit, and the tile the unit comes from (``r`` holding the
    batches from ``first_batch`` on)."""
    flat = r.reshape(-1)
    at = int(torch.argmax(flat)) if flat.numel() else 0
    worst = float(flat[at]) if flat.numel() else 0.0
    b, h, t, c = (int(i) for i in torch.unravel_index(torch.tensor(at), r.shape)) if flat.numel() else (0, 0, 0, 0)
    tile = _unit_tile(t, r.shape[2])
    return {
        "score": worst / STATISTICAL_THRESHOLD,
        "threshold": STATISTICAL_THRESHOLD,
        "r": worst,
        "path": tensor_path(output, _original_index(output, first_batch + b, h, t, c)),
        "unit": float(unit[b, h, t, c]) if flat.numel() else 0.0,
        "tile": f"{_token_span(output, tile)} of batch {first_batch + b}, {_head_noun(output)} {h}",
    }


def _unit_tile(token: int, tokens: int) -> range:
    """The tokens whose model errors make ``token``'s noise unit: its tile of :data:`TILE`, or for a shorter
    last tile the last ``TILE`` tokens, so that every unit is the largest of ``TILE`` model errors where there
    are as many (the statistical verdict's threshold is a ratio to such a largest error)."""
    start = token - token % TILE
    if start + TILE > tokens:
        start = max(0, tokens - TILE)
    return range(start, min(start + TILE, tokens))


def _group_rms(squares: torch.Tensor, weight: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(RMS, present)`` of ``r`` over ``dims`` counting only active elements; ``present`` marks groups with at
    least :data:`MIN_GROUP_ELEMENTS` of them."""
    count = weight.expand_as(squares).sum(dims)
    total = (squares * weight).sum(dims)
    return torch.sqrt(total / count.clamp(min=1)), count >= MIN_GROUP_ELEMENTS


def local(output: str, r: torch.Tensor, r_model: torch.Tensor, judged: torch.Tensor,
          first_batch: int = 0) -> dict[str, Any] | None:
    """The local verdict's record for the most out-of-line group (``score`` above 1 fails), with the most
    out-of-line group of every kind that fails (``flagged``, kind to name); None when no group is judged.

    A group's kernel RMS of ``r`` against the model's own (``r_model``, the model's error in the same units)
    over the same group, counting the elements ``judged`` (:func:`premise`; it leaves out rows that see no
    key and keys no row sees, which are exact): out of line above ``LOCAL_RATIO x max(model RMS,
    LOCAL_FLOOR)``, among the groups of at least :data:`MIN_GROUP_ELEMENTS` judged elements.  Kinds: ``row``
    (one token of one batch and head, every channel), ``tile`` (:data:`TILE` tokens), ``head`` and ``batch``.
    """
    batch, heads, tokens, channels = r.shape
    weight = judged.to(torch.float64)
    padded_weight = _tiles(weight.expand(*weight.shape[:2], tokens, channels))
    squares, model_squares = r.square(), r_model.square()
    best: dict[str, Any] | None = None
    flagged: dict[str, str] = {}
    for kind in ("row", "tile", "head", "batch"):
        rms, present = _group_rms_of(kind, squares, weight, padded_weight)
        if not bool(present.any()):
            continue
        model_rms, _ = _group_rms_of(kind, model_squares, weight, padded_weight)
        limit = LOCAL_RATIO * model_rms.clamp(min=LOCAL_FLOOR)
        scores = torch.where(present, rms / limit, 0.0)
        at = int(torch.argmax(scores.reshape(-1)))
        score = float(scores.reshape(-1)[at])
        index = [int(i) for i in torch.unravel_index(torch.tensor(at), scores.shape)]
        name = _group_name(output, kind, [first_batch + index[0], *index[1:]], tokens)
        if score > 1:
            flagged[kind] = name
        if best is None or score > best["score"]:
            best = {"score": score, "kind": kind, "group": name, "rms": float(rms.reshape(-1)[at]),
                    "model_rms": float(model_rms.reshape(-1)[at]), "ratio": LOCAL_RATIO, "floor": LOCAL_FLOOR}
    if best is not None:
        best["flagged"] = flagged
    return best


def _group_rms_of(kind: str, squares: torch.Tensor, weight: torch.Tensor,
                  padded_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_group_rms` over the groups of ``kind``: each row, tile, head or batch."""
    if kind == "tile":
        return _group_rms(_tiles(squares), padded_weight, (-1,))
    dims = {"row": (3,), "head": (2, 3), "batch": (1, 2, 3)}[kind]
    return _group_rms(squares, weight, dims)


def _group_name(output: str, kind: str, index: list[int], tokens: int) -> str:
    """``rows 131008-131071 of batch 0, head 0`` and the like, for a group of ``kind`` at ``index``."""
    if kind == "batch":
        return f"batch {index[0]}"
    where = f"batch {index[0]}, {_head_noun(output)} {index[1]}"
    if kind == "head":
        return f"{_head_noun(output)} {index[1]} of batch {index[0]}"
    if kind == "row":
        return f"{_token_span(output, range(index[2], index[2] + 1))} of {where}"
    start = index[2] * TILE
    return f"{_token_span(output, range(start, min(start + TILE, tokens)))} of {where}"


def _self_normalized(rows: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum / sqrt(sum of squares), any nonzero)`` of ``rows`` over ``dims``; 0 where every row is 0."""
    total, squares = rows.sum(dims), rows.square().sum(dims)
    return torch.where(squares > 0, total / squares.sqrt().clamp(min=1e-300), 0.0), squares > 0


def bias(output: str, lean: torch.Tensor, lean_model: torch.Tensor, judged: torch.Tensor,
         scale_errors: torch.Tensor, u: float, first_batch: int = 0) -> dict[str, Any] | None:
    """The bias verdict's record for the group whose errors lean one way the most (``score`` above 1 fails);
    None when no group is under its premise.

    Groups: each ``head`` (of one batch) and each ``batch``, over the elements ``judged``.  A row's signed errors
    (``lean``, :class:`Noise`) sum to one term; a group leans when its terms' self-normalized sum exceeds
    :data:`BIAS_Z` and its mean ``lean`` exceeds ``BIAS_RATIO x max(|model's mean|, BIAS_FLOOR)``: a head or a
    batch scaled by ``1 + eps``, or offset by a constant, where rounding to nearest errs both ways.  Its premise
    is that the rows' errors are independent: the model's row scale errors ``scale_errors`` (batch, head,
    token; :func:`verify.model_kernel.model_attention`) are not all 0 and have a self-normalized sum of at most
    :data:`PREMISE_Z` over the group, which ties, plateaus and repeated rows (every row rounding ``P~`` alike)
    break, unless their mean is below ``PREMISE_MEAN u`` (``u``: the unit roundoff of ``T``).  The score is the
    smaller of ``|z| / BIAS_Z`` and the mean's ratio to its limit.
    """
    weight = judged.to(torch.float64)
    rows, model_rows = (lean * weight).sum(-1), (lean_model * weight).sum(-1)
    count = weight.expand_as(lean).sum(-1)
    judged_rows = judged.expand(*lean.shape[:3], 1)[..., 0]
    alpha = torch.where(judged_rows, scale_errors.to(lean.device, torch.float64), 0.0)
    best: dict[str, Any] | None = None
    judged_groups = 0
    for kind, dims in (("head", (2,)), ("batch", (1, 2))):
        elements = count.sum(dims)
        z_alpha, varies = _self_normalized(alpha, dims)
        rows_counted = judged_rows.expand_as(alpha).sum(dims).clamp(min=1)
        common = (alpha.sum(dims) / rows_counted).abs() < PREMISE_MEAN * u
        qualified = (elements > 0) & varies & ((z_alpha.abs() <= PREMISE_Z) | common)
        judged_groups += int(qualified.sum())
        z, _ = _self_normalized(rows, dims)
        mean, model_mean = rows.sum(dims) / elements.clamp(min=1), model_rows.sum(dims) / elements.clamp(min=1)
        limit = (BIAS_RATIO * model_mean.abs()).clamp(min=BIAS_FLOOR)
        scores = torch.where(qualified, torch.minimum(z.abs() / BIAS_Z, mean.abs() / limit), -1.0)
        at = int(torch.argmax(scores.reshape(-1)))
        top = float(scores.reshape(-1)[at])
        if top < 0 or (best is not None and top <= best["score"]):
            continue
        index = [int(i) for i in torch.unravel_index(torch.tensor(at), scores.shape)]
        best = {"score": top, "kind": kind,
                "group": _group_name(output, kind, [first_batch + index[0], *index[1:]], lean.shape[2]),
                "mean": float(mean.reshape(-1)[at]),
                "model_mean": float(model_mean.reshape(-1)[at]), "z": float(z.reshape(-1)[at]),
                "z_threshold": BIAS_Z, "ratio": BIAS_RATIO, "floor": BIAS_FLOOR}
    if best is not None:
        best["groups_judged"] = judged_groups
    return best


#: Elements of an output the verdicts judge at once, in whole batches (at least one): every group lies within
#: one batch, and the verdicts hold about 14 float64 arrays of the elements judged (``verify.memory``).
JUDGE_ELEMENTS = 2**26


def batches_per_part(elements_per_batch: int) -> int:
    """Batches of an output judged at once: as many as :data:`JUDGE_ELEMENTS` holds, at least one."""
    return max(1, JUDGE_ELEMENTS // max(1, elements_per_batch))


def judge(spec: CaseSpec, output: str, actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor,
          model: dict[str, torch.Tensor], flush_share: torch.Tensor | None = None) -> dict[str, dict[str, Any] | None]:
    """The ``statistical``, ``local`` and ``bias`` records of one output against the model kernel's outputs
    ``model`` (:func:`verify.model_kernel.model_attention`), where the premise holds (module docstring); the
    local record is None when no element is judged, the bias record for outputs outside :data:`BIAS_OUTPUTS`
    and where no group is under its premise.

    The output is judged :func:`batches_per_part` batches at a time (every tensor here is batch-first), and the
    records of the parts merged (:func:`_merged`).  The statistical record's ``judged`` is the share of the
    output's elements under the premise.  ``flush_share`` (where :func:`flush_matters`) is the share of
    ``bound`` for float32 flushing (:func:`verify.error_model.bounds_and_flush_shares`, eq. 12):
    elements where it exceeds ``u / 8`` of ``|x*|`` are left to the worst-case verdict.
    """
    step = batches_per_part(actual[0].numel())
    parts = []
    for first in range(0, actual.shape[0], step):
        batches = slice(first, first + step)
        names = (output, "logit_max", "scale_errors") + (("ds_signal", "ds_magnitude") if output in DS_OUTPUTS else ())
        part_model = {name: model[name][batches] for name in names}
        part_flush = None if flush_share is None else flush_share[batches]
        records = _judge_batches(spec, output, actual[batches], expected[batches], bound[batches], part_model, first,
                                 part_flush)
        parts.append((records, actual[batches].numel()))
    return _merged(parts)


def _judge_batches(spec: CaseSpec, output: str, actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor,
                   model: dict[str, torch.Tensor], first_batch: int,
                   flush_share: torch.Tensor | None) -> dict[str, dict[str, Any] | None]:
    """:func:`judge` on the batches from ``first_batch`` on that the tensors hold."""
    noise = noise_units(spec, output, actual, expected, model[output], bound)
    row_model = {name: tensor.to(noise.r.device) for name, tensor in model.items() if name != output}
    judged = premise(spec, output, row_model, expected, flush_share)
    r = torch.where(judged, noise.r, 0.0)
    record = statistical(output, r, noise.unit, first_batch)
    record["judged"] = float(judged.expand_as(r).to(torch.float64).mean()) if r.numel() else 1.0
    records = {"statistical": record, "local": local(output, r, noise.r_model, judged, first_batch), "bias": None}
    if noise.lean is not None and noise.lean_model is not None and bool(judged.any()):
        # the bias verdict weighs whole rows: those every element of which is judged
        records["bias"] = bias(output, noise.lean, noise.lean_model, judged.all(-1, keepdim=True), model["scale_errors"],
                               unit_roundoff(spec.torch_dtype), first_batch)
    return records


def _merged(parts: list[tuple[dict[str, dict[str, Any] | None], int]]) -> dict[str, dict[str, Any] | None]:
    """One output's records from those of its parts (each with its number of elements): each verdict's highest
    score, with the statistical share judged over all elements, the local verdict's failing groups of every part
    (for a kind that several parts flag, the group of the highest-scoring part) and the bias verdict's groups
    judged summed."""
    def records_of(name: str) -> list[dict[str, Any]]:
        return [record for record in (part[name] for part, _ in parts) if record is not None]

    def best(name: str) -> dict[str, Any] | None:
        records = records_of(name)
        return dict(max(records, key=lambda record: record["score"])) if records else None

    statistical_record, local_record, bias_record = best("statistical"), best("local"), best("bias")
    assert statistical_record is not None
    elements = sum(count for _, count in parts)
    statistical_record["judged"] = sum(part["statistical"]["judged"] * count for part, count in parts
                                       if part["statistical"] is not None) / max(1, elements)
    if local_record is not None:
        flagged: dict[str, str] = {}
        for record in sorted(records_of("local"), key=lambda record: record["score"]):
            flagged.update(record["flagged"])
        local_record["flagged"] = flagged
    if bias_record is not None:
        bias_record["groups_judged"] = sum(record["groups_judged"] for record in records_of("bias"))
    return {"statistical": statistical_record, "local": local_record, "bias": bias_record}
