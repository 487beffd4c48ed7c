"""Metamorphic relations: input transformations whose effect on a correct kernel's outputs is known.

Each function here builds the related inputs; :mod:`properties.relation_checks` runs
the kernel on both sides and compares them with :func:`compare_runs`.  For a
relation ``f(x') = g(f(x))`` both sides are kernel outputs, each within
``tau * B`` of its exact value (B the first-order bound of
:mod:`verify.error_model`, tau its threshold), so a correct kernel keeps
``|f(x') - g(f(x))| <= tau * (B(x) + B(x'))`` by the triangle inequality;
that is the tolerance :func:`compare_runs` applies.

The relations (with ``S = scale * Q K^T`` and FA2 Algorithm 1 as the model):

* key permutation: ``O(Q, PK, PV) = O(Q, K, V)`` and the same LSE, unmasked;
* score shift: adding ``t_i`` to row ``i`` of ``S`` leaves ``O`` unchanged and
  gives ``LSE + t``;
* batch and head independence: an output slice depends only on its own batch
  element and (kv) head;
* GQA = MHA with K and V repeated over each group (and ``dK``, ``dV`` of GQA
  are the group sums of MHA's);
* ``causal=True, window=(left, *)`` equals ``window=(left, 0)``;
* causal prefix: the first ``m`` query rows computed from the first ``m``
  queries and ``m + seqlen_k - seqlen_q`` keys equal the full call's rows;
* layout: the same values in non-contiguous memory give the same outputs.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fa2_verify.verify import metrics
from fa2_verify.core.case import Case
from fa2_verify.core.contract import causal_prefix_keys
from fa2_verify.core.counter_rng import CounterRNG
from fa2_verify.verify.metrics import OutputComparison


#: Largest row shift, in units of ``scale * kappa`` (see :func:`shift_scores`).
MAX_SHIFT_STEPS = 16


def _rng(case: Case, salt: int) -> CounterRNG:
    """A generator seeded from the case, so a relation's randomness is reproducible from the spec."""
    return CounterRNG((case.spec.seed * 1_000_003 + salt) % 2**63, case.q.device)


def permute_keys(case: Case) -> tuple[Case, torch.Tensor]:
    """``(case with k and v permuted along seqlen_k, the permutation)``."""
    permutation = _rng(case, 1).permutation(case.spec.seqlen_k)
    return dataclasses.replace(case, k=case.k[:, permutation].contiguous(), v=case.v[:, permutation].contiguous()), permutation


def shift_scores(case: Case) -> tuple[Case, Case, torch.Tensor]:
    """``(base, shifted, t)``: ``S(shifted) = S(base) + t_i`` on every row ``i`` exactly.

    The last channel of every key is set to ``kappa = 2^ceil(log2(1/scale))``;
    in ``base`` the last channel of every query is 0, in ``shifted`` it is an
    integer ``delta_i`` in ``[-16, 16]``.  Both are exact in every dtype, so
    ``S(shifted)_ij - S(base)_ij = scale * kappa * delta_i = t_i`` with
    ``t`` of shape (batch, heads_q, seqlen_q), float64.
    """
    spec = case.spec
    kappa = 2.0 ** math.ceil(math.log2(1.0 / spec.scale))
    k = case.k.clone()
    k[..., -1] = kappa
    base_q = case.q.clone()
    base_q[..., -1] = 0
    delta = _rng(case, 2).integers(2 * MAX_SHIFT_STEPS + 1, (spec.batch, spec.seqlen_q, spec.heads_q)) - MAX_SHIFT_STEPS
    shifted_q = base_q.clone()
    shifted_q[..., -1] = delta.to(shifted_q.dtype)
    shift = (spec.scale * kappa * delta.to(torch.float64)).permute(0, 2, 1)
    return dataclasses.replace(case, q=base_q, k=k), dataclasses.replace(case, q=shifted_q, k=k), shift


def replace_except(case: Case, other: Case, *, batch: int | None = None, head: int | None = None) -> Case:
    """``case`` with every input taken from ``other`` except batch element ``batch``, or query head ``head``.

    Keeping query head ``h`` keeps its kv head ``h // (heads_q // heads_kv)`` too.
    """
    group = case.spec.heads_q // case.spec.heads_kv

    def mix(mine: torch.Tensor, theirs: torch.Tensor, query_heads: bool) -> torch.Tensor:
        keep = torch.zeros(mine.shape[0], 1, mine.shape[2], 1, dtype=torch.bool, device=mine.device)
        if batch is not None:
            keep[batch] = True
        else:
            assert head is not None, "replace_except keeps a batch element or a query head"
            keep[:, :, head if query_heads else head // group] = True
        return torch.where(keep, mine, theirs)

    return dataclasses.replace(
        case,
        q=mix(case.q, other.q, True),
        k=mix(case.k, other.k, False),
        v=mix(case.v, other.v, False),
        dout=mix(case.dout, other.dout, True),
    )


def repeat_kv(case: Case) -> Case:
    """The MHA case equal to GQA ``case``: K and V repeated over each group of query heads."""
    group = case.spec.heads_q // case.spec.heads_kv
    spec = dataclasses.replace(case.spec, heads_kv=case.spec.heads_q)
    return dataclasses.replace(
        case, spec=spec, k=case.k.repeat_interleave(group, dim=2), v=case.v.repeat_interleave(group, dim=2)
    )


def group_sum(tensor: torch.Tensor, group: int) -> torch.Tensor:
    """Sum an MHA gradient (…, heads_q, head_dim) over each group of query heads: the GQA gradient."""
    batch, seqlen, heads, head_dim = tensor.shape
    return tensor.reshape(batch, seqlen, heads // group, group, head_dim).sum(dim=3)


def causal_prefix(case: Case, rows: int) -> Case:
    """The first ``rows`` queries with the keys they see (:func:`core.contract.causal_prefix_keys`: the first
    ``rows + seqlen_k - seqlen_q`` bottom-right aligned, same diagonal)."""
    spec = case.spec
    keys = causal_prefix_keys(rows, spec.seqlen_q, spec.seqlen_k, spec.causal_alignment)
    prefix_spec = dataclasses.replace(spec, seqlen_q=rows, seqlen_k=keys)
    return Case(
        spec=prefix_spec,
        q=case.q[:, :rows].contiguous(),
        k=case.k[:, :keys].contiguous(),
        v=case.v[:, :keys].contiguous(),
        dout=case.dout[:, :rows].contiguous(),
    )


def compare_runs(
    output: str, first: torch.Tensor, second: torch.Tensor, tolerance: torch.Tensor, *, threshold: float
) -> OutputComparison:
    """Compare two kernel runs that a relation says agree: ``|second - first| / tolerance <= threshold``.

    ``first`` plays the golden's role in :func:`verify.metrics.compare`.  NaN
    never passes: a NaN in ``first`` becomes +inf there, which only an infinity
    in ``second`` could match, and ``second`` is set to NaN at those elements.
    Infinities must match (either sign, as the contract allows for ``lse``).
    """
    first64 = first.detach().to(tolerance.device, torch.float64)
    first_nan = torch.isnan(first64)
    expected = torch.where(first_nan, torch.full_like(first64, math.inf), first64)
    actual = second.detach().to(tolerance.device).masked_fill(first_nan, math.nan)
    return metrics.compare(output, actual, expected, tolerance, threshold=threshold)
