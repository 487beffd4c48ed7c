"""The run-to-run comparisons: bitwise equality, and the spread that atomic dQ accumulation may show
(docs/error-model.md, "Determinism of atomic dQ").

In FA2's backward (Dao 2023, Algorithm 2, line 15) each key block ``b``
computes its contribution ``c_b = scale * sum_{j in b} dS_ij K_jc`` to a row of
dQ and adds it to a float32 accumulator with an atomic add, in whatever order
the blocks finish.  The contributions are the same on every run; only the
order of the ``N_i`` additions changes.  Any order of summing ``N`` terms in
floating point returns ``sum_b c_b (1 + theta_b)`` with
``|theta_b| <= gamma_{N-1}`` (Higham, Accuracy and Stability, Eq. 4.4), so two
runs differ by at most ``2 gamma_{N_i - 1} sum_b |c_b|``, and

    sum_b |c_b| <= scale * sum_j |dS_ij| |K_jc| <= scale * sum_j P_ij (A_ij + D'_i) |K_jc| =: M_ic

with ``A_ij = sum_c |dO_ic| |V_jc|`` and ``D'_i = sum_c |dO_ic| |O_ic|``, which
bound ``|dP_ij|`` and ``|D_i|`` without relying on cancellation (the kernel's
rounded dS may be far from the exact one when dP - D cancels).  A factor
``1 + 1/8`` covers the kernel's own rounding of P, dP and D in those
magnitudes.  Rounding the accumulated dQ to a 16-bit output dtype can move two
different float32 sums by one more unit in the last place, so

    |dq_r - dq_s| <= 2 gamma_{N_i - 1} (1 + 1/8) M_ic + ulp_dtype(max_r |dq_r|)   (16-bit outputs)

and without the ulp term for float32 and float64 outputs.  The bound also
gains ``eta``, half the smallest subnormal: it stays positive where the spread
must be 0, and any nonzero difference of two dtype numbers exceeds it.  ``N_i`` is the
number of key blocks row ``i`` sees; when the kernel does not say its key tile
(``config()["block_k"]``), every visible key is counted as its own block,
which only loosens the bound.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fa2_verify.core.case import Case
from fa2_verify.properties import relations
from fa2_verify.verify.error_model import accumulation_unit, underflow_unit
from fa2_verify.verify.metrics import OutputComparison, ulp

def bitwise(name: str, first: torch.Tensor, again: torch.Tensor) -> OutputComparison:
    """Bitwise equality as a comparison with tolerance 1 and threshold 0: any difference mismatches.

    The tolerance lives on the outputs' device: :func:`relations.compare_runs`
    compares on the tolerance's device, and at scale a host copy of the outputs
    costs minutes.
    """
    tolerance = torch.ones(first.shape, dtype=torch.float64, device=first.device)
    return relations.compare_runs(name, first, again, tolerance, threshold=0.0)


#: Slack on the magnitudes in M for the kernel's rounding of P, dP and D.
MAGNITUDE_SLACK = 1 + 2**-3


def key_blocks(visible_keys: torch.Tensor, block_k: int | None) -> torch.Tensor:
    """``N_i``: key blocks a row with ``visible_keys`` contiguous keys touches (the keys themselves if unknown)."""
    if block_k is None:
        return visible_keys
    return torch.minimum(visible_keys, torch.ceil(visible_keys / block_k) + 1)


#: Scores per row block of :func:`dq_spread_bound` (device type -> elements),
#: as the golden's blocks: no seqlen_q x seqlen_k tensor for a whole head.
BLOCK_ELEMENTS = {"cpu": 2**20, "cuda": 2**25}


def dq_spread_bound(case: Case, golden: Any, dq_runs: list[torch.Tensor], *, block_k: int | None = None) -> torch.Tensor:
    """Per-element bound (float64, on the case's device) on ``|dq_r - dq_s|`` between backward calls (module docstring).

    ``golden`` provides ``out`` (float64, the exact O); ``dq_runs`` are the
    kernel's dq from repeated calls, used only for the final ulp term.  ``M``
    and the bound are computed in blocks of query rows over the visible range
    of each row (:func:`core.contract.visible_ranges`), query heads grouped
    over their shared key head: besides the bound, only float64 copies of K
    and V are whole, so memory stays bounded at any sequence length.
    """
    spec = case.spec
    dtype = spec.torch_dtype
    device = case.q.device
    batch, heads_kv, group = spec.batch, spec.heads_kv, spec.heads_q // spec.heads_kv
    k, values = (t.detach().to(device, torch.float64) for t in (case.k, case.v))
    keys, values = k.abs(), values.abs()
    first, last = spec.visible_ranges(device)
    visible_keys = (last - first + 1).clamp_min(0).to(torch.float64)
    terms = (key_blocks(visible_keys, block_k) - 1).clamp_min(0) * accumulation_unit(dtype)
    factor = (2 * terms / (1 - terms) * MAGNITUDE_SLACK).view(1, -1, 1, 1)
    bound = torch.empty(case.q.shape, dtype=torch.float64, device=device)
    rows = max(1, BLOCK_ELEMENTS[device.type] // (batch * spec.heads_q * max(spec.seqlen_k, 1)))
    key_index = torch.arange(spec.seqlen_k, device=device)
    for start in range(0, spec.seqlen_q, rows):
        block = slice(start, min(start + rows, spec.seqlen_q))
        q, dout, out = (t[:, block].detach().to(device, torch.float64) for t in (case.q, case.dout, golden.out))
        grouped = (batch, -1, heads_kv, group, spec.head_dim)
        visible = (key_index >= first[block, None]) & (key_index <= last[block, None])
        logits = spec.scale * torch.einsum("bihgc,bjhc->bhgij", q.reshape(grouped), k)
        logits = logits.masked_fill(~visible, -math.inf)
        row_max = logits.amax(dim=-1, keepdim=True).clamp_min(-1e300)
        weights = torch.exp(logits - row_max)
        p = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-300)
        dout_abs = dout.abs()
        dp_magnitude = torch.einsum("bihgc,bjhc->bhgij", dout_abs.reshape(grouped), values)
        d_magnitude = (dout_abs * out.abs()).sum(dim=-1).reshape(batch, -1, heads_kv, group)
        p = p * (dp_magnitude + d_magnitude.permute(0, 2, 3, 1).unsqueeze(-1))
        magnitude = spec.scale * torch.einsum("bhgij,bjhc->bihgc", p, keys).reshape(q.shape)
        bound[:, block] = factor[:, block] * magnitude + underflow_unit(dtype)
        if torch.finfo(dtype).bits == 16:
            largest = torch.zeros_like(magnitude)
            for run in dq_runs:
                largest = torch.maximum(largest, run[:, block].detach().to(device, torch.float64).abs())
            bound[:, block] += ulp(largest, dtype)
    return bound
