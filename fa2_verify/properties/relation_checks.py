"""Checks of the metamorphic relations (:mod:`properties.relations`): the kernel against itself.

Both sides are kernel outputs, each within ``tau * B`` of its exact value, so
the tolerance is ``tau`` times the sum of both sides' first-order bounds.
"""

from __future__ import annotations

import dataclasses

import torch

from fa2_verify.properties import relations
from fa2_verify.properties.session import Suite
from fa2_verify.properties.verdicts import bounds_of, call_kernel, compare, conclude, introduce
from fa2_verify.verify import error_model
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import GRADIENTS
from fa2_verify.core.layouts import in_layout


def keys_permuted(suite: Suite, spec: CaseSpec, output: str) -> None:
    """``output(Q, PK, PV) = output(Q, K, V)`` for an unmasked case and a key permutation P."""
    statement = f"{output}(q, k[perm], v[perm]) = {output}(q, k, v)"
    introduce(suite, spec)
    case = suite.case(spec)
    permuted, _ = relations.permute_keys(case)
    runs = call_kernel(suite, spec, output, case, permuted, backward=False)
    tolerance = 2 * bounds_of(suite, case)[output]
    conclude(suite, spec, statement, [compare(output, runs[0][output], runs[1][output], tolerance)])


def scores_shifted(suite: Suite, spec: CaseSpec, output: str) -> None:
    """``O(S + t) = O(S)`` and ``LSE(S + t) = LSE(S) + t`` for a per-row shift ``t``."""
    statement = "out(S + t) = out(S)" if output == "out" else "lse(S + t) = lse(S) + t"
    introduce(suite, spec)
    base, shifted, shift = relations.shift_scores(suite.case(spec))
    runs = call_kernel(suite, spec, output, base, shifted, backward=False)
    tolerance = bounds_of(suite, base)[output] + bounds_of(suite, shifted)[output]
    first = runs[0][output]
    if output == "lse":
        # Adding t in float64 rounds once more: u_64 |lse + t| beyond both runs' bounds.
        first = first.to(tolerance.device, torch.float64) + shift.to(tolerance.device)
        tolerance = tolerance + error_model.unit_roundoff(torch.float64) * first.abs()
    conclude(suite, spec, statement, [compare(output, first, runs[1][output], tolerance)])


def independent(suite: Suite, spec: CaseSpec, *, batch: int | None = None, head: int | None = None) -> None:
    """``out[b]`` (or query head ``h``) unchanged when every other batch element (every other head) changes."""
    axis = f"batch {batch}" if batch is not None else f"query head {head}"
    statement = f"out of {axis} is independent of the other inputs"
    introduce(suite, spec)
    case = suite.case(spec)
    other = suite.case(dataclasses.replace(spec, seed=(spec.seed + 1) % 2**32))
    mixed = relations.replace_except(case, other, batch=batch, head=head)
    runs = call_kernel(suite, spec, "out", case, mixed, backward=False)
    if batch is not None:
        kept = (slice(batch, batch + 1), slice(None), slice(None))
    else:
        assert head is not None, "independent keeps a batch element or a query head"
        kept = (slice(None), slice(None), slice(head, head + 1))
    tolerance = 2 * bounds_of(suite, case)["out"][kept]
    conclude(suite, spec, statement, [compare("out", runs[0].out[kept], runs[1].out[kept], tolerance)])


def gqa_as_mha(suite: Suite, spec: CaseSpec, outputs: tuple[str, ...]) -> None:
    """GQA equals MHA with K, V repeated over each group: same out; dk, dv are the group sums of MHA's.

    The MHA gradients of a group are summed in float64 and rounded once to
    the dtype, which adds at most ``u |sum_h dk_h| <= u sum_h |dk_h|`` beyond
    the summed MHA bounds; the tolerance includes that term.
    """
    statement = "gqa(q, k, v) = mha(q, repeat(k), repeat(v))"
    introduce(suite, spec)
    case = suite.case(spec)
    mha = relations.repeat_kv(case)
    runs = call_kernel(suite, spec, outputs[0], case, mha)
    group = spec.heads_q // spec.heads_kv
    gqa_bounds, mha_bounds = bounds_of(suite, case), bounds_of(suite, mha)
    comparisons = []
    for output in outputs:
        second = runs[1][output]
        if output == "out":
            tolerance = gqa_bounds[output] + mha_bounds[output]
        else:
            magnitude = relations.group_sum(second.to(gqa_bounds[output].device, torch.float64).abs(), group)
            second = relations.group_sum(second.to(torch.float64), group).to(second.dtype)
            rounding = error_model.unit_roundoff(spec.torch_dtype) * magnitude
            tolerance = gqa_bounds[output] + relations.group_sum(mha_bounds[output], group) + rounding
        comparisons.append(compare(output, runs[0][output], second, tolerance))
    conclude(suite, spec, statement, comparisons)


def causal_as_window(suite: Suite, spec: CaseSpec) -> None:
    """``causal=True, window=(left, w)`` equals ``causal=False, window=(left, 0)``."""
    left = spec.window_size[0]
    statement = f"out(causal, window=({left}, *)) = out(window=({left}, 0))"
    introduce(suite, spec)
    case = suite.case(spec)
    windowed = dataclasses.replace(case, spec=dataclasses.replace(spec, causal=False, window_size=(left, 0)))
    runs = call_kernel(suite, spec, "out", case, windowed, backward=False)
    tolerance = 2 * bounds_of(suite, case)["out"]
    conclude(suite, spec, statement, [compare("out", runs[0].out, runs[1].out, tolerance)])


def causal_prefix(suite: Suite, spec: CaseSpec, rows: int) -> None:
    """The first ``rows`` rows of a causal output from the first queries and keys alone equal the full call's."""
    statement = f"out(q[:{rows}], k[:{rows}+sk-sq], v[:{rows}+sk-sq]) = out(q, k, v)[:{rows}]"
    introduce(suite, spec)
    case = suite.case(spec)
    runs = call_kernel(suite, spec, "out", case, relations.causal_prefix(case, rows), backward=False)
    tolerance = 2 * bounds_of(suite, case)["out"][:, :rows]
    conclude(suite, spec, statement, [compare("out", runs[0].out[:, :rows], runs[1].out, tolerance)])


def layout_invariant(suite: Suite, spec: CaseSpec, layout: str) -> None:
    """Every output the kernel provides is the same when q, k, v and dout (and backward's out) are views
    in ``layout`` as when they are contiguous; a layout that broadcasts K and V is compared with its own
    values made contiguous."""
    statement = f"outputs({layout} inputs) = outputs(contiguous inputs)"
    introduce(suite, spec)
    laid = in_layout(suite.case(spec), layout)
    case = in_layout(laid, "contiguous")
    runs = call_kernel(suite, spec, "out", case, laid)
    bounds = bounds_of(suite, case)
    names = [name for name in ("out", "lse", *GRADIENTS) if getattr(runs[0], name) is not None]
    conclude(suite, spec, statement, [compare(name, runs[0][name], runs[1][name], 2 * bounds[name]) for name in names])
