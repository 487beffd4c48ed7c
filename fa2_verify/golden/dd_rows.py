"""Reference rows in double-double on the device: the certification's independent evaluation of sampled rows.

The formulas are those of :mod:`golden.mp` and :mod:`golden.rows` (Dao 2023,
"FlashAttention-2", Algorithms 1 and 2); every dot product with an input is an
exact fixed-point product rounded once to a double-double
(:func:`golden.fixed.matmul`), every other step double-double arithmetic
(:mod:`golden.dd`).  Many rows are evaluated at once, as matrices:

* :func:`query_rows`: ``R`` query rows of one kv head over a span of keys,
  ``visible`` (R, n) saying which keys each row sees, give ``out``, ``lse``,
  and with ``dout``, ``delta = dout . out``, the offset ``D - dP_pivot`` and
  ``dq``, ``dP - D`` taken around each row's own pivot (its largest score) as
  in :mod:`golden.fast`, step 4;
* :func:`key_rows`: ``R`` key rows of one kv head give ``dk`` and ``dv``,
  summed over the query heads of the group and the queries that see each key,
  from those queries' ``LSE`` and offset as the fast path served them (sound
  because both are certified on the query rows: :mod:`golden.certify`).

Each value comes with the magnitude ``M`` of the terms it sums (as
:class:`golden.rows.Row` defines them: the scale the certification measures
errors against) and the ``slack`` of its fixed-point products.  The rows'
accuracy, about ``2**-90`` of ``M``, is measured against mpmath on every
case (:func:`golden.certify.certify`).
"""

from __future__ import annotations

import dataclasses

import torch

from fa2_verify.golden import dd, fixed


@dataclasses.dataclass(frozen=True)
class Reference:
    """Per output name: the double-double value, its magnitude ``M`` and its fixed-point slack (absolute), all
    with the rows as the leading dimension."""

    values: dict[str, dd.DD]
    magnitudes: dict[str, torch.Tensor]
    slack: dict[str, torch.Tensor]


def query_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor | None, visible: torch.Tensor, scale: float
) -> Reference:
    """``q``, ``dout`` (..., R, d); ``k``, ``v`` (..., n, d); ``visible`` (..., R, n), every row seeing at least one
    key; leading dimensions a batch of kv heads."""
    scores, _ = _product(q, k.mT)
    peak = scores[0] if scale >= 0 else -scores[0]
    pivot = peak.masked_fill(~visible, -torch.inf).argmax(dim=-1, keepdim=True)
    top = (scores[0].gather(-1, pivot), scores[1].gather(-1, pivot))
    x = dd.scaled(dd.sub(scores, top), scale)
    e = _masked(dd.exp(_masked(x, visible)), visible)
    ell = dd.total(e)
    lse = dd.add(dd.scaled((top[0][..., 0], top[1][..., 0]), scale), dd.log(ell))
    p = dd.div(e, (ell[0][..., None], ell[1][..., None]))
    out, out_slack = _product(p, v)
    values = {"out": out, "lse": lse}
    magnitudes = {
        "out": p[0] @ v.abs(),
        "lse": abs(scale) * scores[0].abs().masked_fill(~visible, 0.0).amax(dim=-1),
    }
    slack = {"out": out_slack, "lse": torch.zeros_like(lse[0])}
    if dout is None:
        return Reference(values, magnitudes, slack)
    dp, _ = _product(dout, v.mT)
    anchor = (dp[0].gather(-1, pivot), dp[1].gather(-1, pivot))
    shifted = _masked(dd.sub(dp, anchor), visible)
    offset = dd.total(dd.mul(p, shifted))
    ds = dd.mul(p, dd.sub(shifted, (offset[0][..., None], offset[1][..., None])))
    dq, dq_slack = _product(ds, k)
    out_value = dd.value(out)
    delta = dd.add(fixed.exact_dot(dout, out[0]), fixed.exact_dot(dout, out[1]))
    values.update(delta=delta, offset=offset, dq=dd.scaled(dq, scale))
    magnitudes.update(
        delta=(dout * out_value).abs().sum(-1),
        offset=(p[0] * dd.value(shifted).abs()).sum(-1),
        dq=abs(scale) * (dd.value(ds).abs() @ k.abs()),
    )
    slack.update(delta=torch.zeros_like(offset[0]), offset=torch.zeros_like(offset[0]), dq=abs(scale) * dq_slack)
    return Reference(values, magnitudes, slack)


@dataclasses.dataclass(frozen=True)
class QueryHead:
    """One query head's share of a key row: the queries that may see the keys, ``(m, d)`` ``q`` and ``dout``, their
    served ``lse`` (a double-double), the served offsets ``D - dP_pivot`` with each query's ``pivot_v`` (the value
    row of its pivot key, (m, d)), and ``visible`` (m, R): which of the keys each query sees; each may carry leading
    batch dimensions."""

    q: torch.Tensor
    dout: torch.Tensor
    lse: dd.DD
    offset: torch.Tensor
    pivot_v: torch.Tensor
    visible: torch.Tensor


def key_rows(k: torch.Tensor, v: torch.Tensor, heads: list[QueryHead], scale: float) -> Reference:
    """``dk``, ``dv`` of ``R`` keys of one kv head: ``k``, ``v`` (..., R, d), summed over ``heads`` (whose tensors
    carry the same leading dimensions, a batch of kv heads)."""
    dk = dv = (torch.zeros_like(k), torch.zeros_like(k))
    dk_magnitude, dv_magnitude = torch.zeros_like(k), torch.zeros_like(k)
    dk_slack, dv_slack = torch.zeros_like(k), torch.zeros_like(k)
    for head in heads:
        scores, _ = _product(head.q, k.mT)  # (m, R)
        lse = (head.lse[0][..., None], head.lse[1][..., None])
        x = dd.sub(dd.scaled(scores, scale), lse)
        p = _masked(dd.exp(_masked(x, head.visible)), head.visible)
        # dP and its anchors dO_i . v_p(i) as the same fixed-point products, the value rows split into the same
        # limbs: where key j is query i's pivot, dP_ij - anchor_i is exactly 0, as in the fast path
        count = fixed.exact_limbs(v, head.pivot_v)
        dout = fixed.fixed(head.dout, axis=-1)
        dp, _ = fixed.matmul(dout, fixed.fixed(v.mT, axis=-2, count=count))
        anchor, _ = fixed.matmul(fixed.fixed(head.dout[..., None, :], axis=-1),
                                 fixed.fixed(head.pivot_v[..., :, None], axis=-2, count=count))
        anchor = (anchor[0][..., 0], anchor[1][..., 0])  # (..., m, 1)
        shifted = dd.sub(dd.sub(dp, anchor), dd.of(head.offset[..., None]))
        ds = _masked(dd.mul(p, shifted), head.visible)
        p_t, ds_t = (p[0].mT, p[1].mT), (ds[0].mT, ds[1].mT)
        dv_part, dv_part_slack = _product(p_t, head.dout)
        dk_part, dk_part_slack = _product(ds_t, head.q)
        dv, dk = dd.add(dv, dv_part), dd.add(dk, dk_part)
        dv_slack, dk_slack = dv_slack + dv_part_slack, dk_slack + dk_part_slack
        dv_magnitude = dv_magnitude + p_t[0] @ head.dout.abs()
        dk_magnitude = dk_magnitude + abs(scale) * (dd.value(ds_t).abs() @ head.q.abs())
    return Reference(
        {"dk": dd.scaled(dk, scale), "dv": dv},
        {"dk": dk_magnitude, "dv": dv_magnitude},
        {"dk": abs(scale) * dk_slack, "dv": dv_slack},
    )


def _product(a: torch.Tensor | dd.DD, b: torch.Tensor) -> tuple[dd.DD, torch.Tensor]:
    """``a @ b`` (a: rows to contract along the last axis) by :func:`golden.fixed.matmul`."""
    return fixed.matmul(fixed.fixed(a, axis=-1), fixed.fixed(b, axis=-2))


def _masked(x: dd.DD, visible: torch.Tensor) -> dd.DD:
    """``x`` with the hidden entries 0 (both parts)."""
    return x[0].masked_fill(~visible, 0.0), x[1].masked_fill(~visible, 0.0)
