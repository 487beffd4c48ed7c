"""First-order rounding bounds of a correct FlashAttention-2 kernel, per output element.

The derivation is in docs/error-model.md; this module implements its
equations (numbered as there) and nothing else.  The model kernel follows
Dao 2023, "FlashAttention-2": Algorithm 1 (forward) computes
``S = scale * Q K^T`` with float32 accumulation, ``P~ = exp(S - m)`` in
float32, rounds ``P~`` to the input dtype for ``P~ V``, accumulates in float32,
rescales by ``exp(m_old - m_new)``, divides by ``l`` and rounds ``O`` to the
dtype; ``LSE = m + log l`` in float32.  Algorithm 2 (backward) recomputes
``P = exp(S - LSE)`` from the stored float32 LSE, forms ``dV = P^T dO``
(``P`` rounded to the dtype), ``dP = dO V^T``, ``D = rowsum(dO * O)`` from the
*rounded* output, ``dS = P * (dP - D)`` (with ``P`` in float32 or, as PyTorch's
memory-efficient kernel does, rounded to the dtype) rounded to the dtype, and
``dQ = scale * dS K``, ``dK = scale * dS^T Q``, all accumulated in float32.

Every magnitude in the bounds (``sum_j P_ij |V_jc|`` and the like) is a
matmul of absolute values, evaluated in float64 from the golden: ``P`` is
recomputed as ``exp(S - LSE*)`` with the golden LSE.  The evaluation runs on
the case's device, one block of query rows at a time over only the keys those
rows see (:func:`_blocks`) and for all the query heads of one kv head at once,
so no (seqlen_q x seqlen_k) tensor is formed and the inputs are converted to
float64 a block at a time.  A correct kernel keeps
``|actual - expected| / bound <= THRESHOLDS[output]``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from fa2_verify.core.contract import visible_ranges
from fa2_verify.core.case import Case
from fa2_verify.core.errors import UsageError

#: Normalized-error threshold per output (docs/error-model.md, "Thresholds").
THRESHOLDS: Mapping[str, float] = {"out": 1.0, "lse": 1.0, "dq": 1.0, "dk": 1.0, "dv": 1.0}

#: Allowance for the products of rounding errors that first-order bounds drop,
#: in units of the dtype's ``u`` (docs/error-model.md, "Second-order terms").
SECOND_ORDER_UNITS = 4

#: Elements of the (rows x keys) float64 work matrices evaluated at once, per
#: device type: 8 MiB per matrix on the CPU (cache-sized), 256 MiB on a GPU (a
#: few GiB for the dozen alive at once), so that a 131072-key row needs no more.
WORK_ELEMENTS: Mapping[str, int] = {"cpu": 1 << 20, "cuda": 1 << 25}


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u = 2^-p`` of a dtype: float16 2^-11, bfloat16 2^-8, float32 2^-24, float64 2^-53."""
    return torch.finfo(dtype).eps / 2


def accumulation_unit(dtype: torch.dtype) -> float:
    """``u_a``: float32's 2^-24 for 16- and 32-bit inputs (float32 accumulation), 2^-53 for float64."""
    return unit_roundoff(torch.float64 if dtype == torch.float64 else torch.float32)


def lse_storage_unit(dtype: torch.dtype) -> float:
    """``u_L``: the rounding of LSE into the contract's float32, beyond the accumulation's own.

    Zero when the LSE is computed in float32 (it is stored as is); float32's
    2^-24 for float64 inputs, whose float64 LSE the contract rounds to float32.
    """
    float32_unit = unit_roundoff(torch.float32)
    return float32_unit if accumulation_unit(dtype) < float32_unit else 0.0


def underflow_unit(dtype: torch.dtype) -> float:
    """``eta``: the largest absolute error of rounding into ``dtype`` in its subnormal range.

    Half the smallest subnormal (float16 2^-25, bfloat16 2^-134, float32
    2^-150); for float64 the smallest subnormal 2^-1074, since half of it is
    not a float64 number.
    """
    info = torch.finfo(dtype)
    smallest_subnormal = info.smallest_normal * info.eps
    return max(smallest_subnormal / 2, math.ulp(0.0))


def flush_unit(dtype: torch.dtype) -> float:
    """``eta_a``: the largest absolute error of one accumulation-dtype operation near zero.

    For float32 accumulation (16- and 32-bit inputs) float32's smallest normal
    2^-126: GPUs flush subnormal float32 results to zero in ``ex2.approx.ftz``
    and in the float32 atomic add (PTX ``atom.add.f32`` flushes subnormal
    inputs and results), an error below 2^-126 each time.  For float64
    accumulation, float64's underflow unit (its atomics and arithmetic keep
    subnormals).
    """
    if dtype == torch.float64:
        return underflow_unit(torch.float64)
    return torch.finfo(torch.float32).smallest_normal


def _gamma(n: torch.Tensor | float, unit: float) -> torch.Tensor:
    """``gamma_n = n u / (1 - n u)`` (Higham, Accuracy and Stability, Lemma 3.1); needs ``n u < 1``."""
    nu = torch.as_tensor(n, dtype=torch.float64) * unit
    if nu.numel() and float(nu.max()) >= 1.0:
        raise UsageError(
            f"the error model needs n*u < 1 for its accumulation lengths n, got n*u = {float(nu.max())}: "
            "use shorter sequences"
        )
    return nu / (1 - nu)


def work_elements(device: torch.device | str) -> int:
    """:data:`WORK_ELEMENTS` of ``device``'s type (a GPU's for any accelerator)."""
    return WORK_ELEMENTS.get(torch.device(device).type, WORK_ELEMENTS["cuda"])


def _blocks(first: torch.Tensor, last: torch.Tensor, seqlen_k: int, work: int) -> list[tuple[slice, slice]]:
    """Blocks of query rows, each with the span of keys its rows see, of at most ``work`` (rows x keys) elements.

    Query ``i`` sees keys ``first[i]..last[i]`` (:func:`core.contract.visible_ranges`);
    a block's key span runs from the smallest ``first`` to the largest ``last``
    of its rows that see a key (empty when none does), so a causal or
    sliding-window mask skips the keys no row of the block sees, and no
    (seqlen_q x seqlen_k) tensor is ever formed.
    """
    rows_per_block = max(1, work // max(seqlen_k, 1))
    first, last = first.cpu(), last.cpu()
    blocks = []
    for start in range(0, len(first), rows_per_block):
        rows = slice(start, min(len(first), start + rows_per_block))
        nonempty = first[rows] <= last[rows]
        keys = slice(0, 0)
        if bool(nonempty.any()):
            keys = slice(int(first[rows][nonempty].min()), int(last[rows][nonempty].max()) + 1)
        blocks.append((rows, keys))
    return blocks


def _largest_finite(expected: torch.Tensor) -> float:
    """``max |expected|`` over its finite elements (0 if none), a chunk at a time on its device."""
    flat = expected.detach().reshape(-1)
    step = work_elements(flat.device)
    largest = 0.0
    for start in range(0, flat.numel(), step):
        chunk = flat[start : start + step].to(torch.float64).abs()
        largest = max(largest, float(torch.where(torch.isfinite(chunk), chunk, 0.0).max()))
    return largest


def first_order_bounds(case: Case, golden: Any) -> dict[str, torch.Tensor]:
    """Per-element bounds (float64, on the case's device) for ``out``, ``lse`` and, with a backward, ``dq``, ``dk``, ``dv``.

    ``golden`` is a ``golden.GoldenResult`` for ``case`` (``out``, ``lse``,
    ``delta``, ``dq``, ``dk``, ``dv``, ``certified_bound``).  Equation numbers
    refer to docs/error-model.md:

    * (1) logit error   ``Delta_ij = gamma_{d+2} A_ij + u_a (|S_ij| + M_i) + u_f``
    * (2) output        ``B^O_ic = u (|O_ic| + sum_j P_ij |V_jc|) + gamma_{2n_i} (sum_j P_ij |V_jc| + |O_ic|)
      + u_a |O_ic| + sum_j P_ij Delta_ij (|V_jc| + |O_ic|) + eta + (eta + eta_a) sum_{j visible} |V_jc|
      + 3 n_i eta_a``
    * (3) LSE           ``B^L_i = sum_j P_ij Delta_ij + gamma_{2n_i} + u_f (1 + ln n_i) + 3 u_a (|LSE_i| + M_i)
      + u_L |LSE_i|``
    * (4) backward P    ``E_ij = Delta_ij + B^L_i + u_a (|S_ij| + |LSE_i|)``
    * (5) D             ``B^D_i = sum_c |dO_ic| B^O_ic + gamma_d sum_c |dO_ic| |O_ic|``
    * (6) dS            ``B^dS_ij = P_ij (E_ij |dP_ij - D_i| + gamma_d sum_c |dO_ic| |V_jc| + B^D_i)
      + (2 u + 2 u_a) |dS_ij| + (eta + (eta + eta_a) |dP_ij - D_i| + eta_a (2d + 2)) [j visible from i]``
    * (7) dV            ``B^dV_jc = sum_(h,i) (P_ij (E_ij + u) + (eta + eta_a) [visible]) |dO_ic|
      + (gamma_{N_j+G} + u_G) sum_(h,i) P_ij |dO_ic| + u |dV_jc| + eta_G + 3 (N_j + G) eta_a [N_j > 0]``,
      ``u_G = u`` and ``eta_G = eta + G eta [N_j > 0]`` if ``G > 1``, else 0 and ``eta``
    * (8) dQ            ``B^dQ_ic = scale sum_j B^dS_ij |K_jc| + gamma_{n_i+2} scale sum_j |dS_ij| |K_jc|
      + u |dQ_ic| + eta + 3 (n_i + 2) max(1, scale) eta_a [n_i > 0]``
    * (9) dK            ``B^dK_jc = scale sum_(h,i) B^dS_ij |Q_ic| + (gamma_{N_j+G+2} + u_G) scale sum_(h,i) |dS_ij| |Q_ic|
      + u |dK_jc| + eta_G + 3 (N_j + G + 2) max(1, scale) eta_a [N_j > 0]``
    * (10) second order each bound is multiplied by ``1 + 4u``.
    * (11) golden       each bound gains ``certified_bound[name] * max|expected|``.
    """
    spec = case.spec
    dtype = spec.torch_dtype
    u = unit_roundoff(dtype)
    u_a = accumulation_unit(dtype)
    u_f = 4 * u_a
    u_lse = lse_storage_unit(dtype)
    eta = underflow_unit(dtype)
    eta_lse = underflow_unit(torch.float32)
    eta_a = flush_unit(dtype)
    scale = spec.scale

    def gamma(n):
        return _gamma(n, u_a)

    device = case.q.device
    batch, seqlen_q, heads_q, head_dim = case.q.shape
    seqlen_k, heads_kv = case.k.shape[1], case.k.shape[2]
    group = heads_q // heads_kv
    backward = golden.dq is not None

    def on_device(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(device, torch.float64)

    first, last = visible_ranges(seqlen_q, seqlen_k, causal=spec.causal, window_size=spec.window_size, device=device)
    n_row = (last - first + 1).clamp(min=0).to(torch.float64)
    n_col = torch.zeros(seqlen_k, dtype=torch.float64, device=device)
    out, lse = on_device(golden.out), on_device(golden.lse)
    if backward:
        delta = on_device(golden.delta) if golden.delta is not None else None
        dq_expected = on_device(golden.dq)

    bound_out = torch.empty_like(out)
    bound_lse = torch.empty_like(lse)
    if backward:
        bound_dq = torch.empty_like(out)
        dv_error = torch.zeros(batch, seqlen_k, heads_kv, head_dim, dtype=torch.float64, device=device)
        dv_mass = torch.zeros_like(dv_error)
        dk_error = torch.zeros_like(dv_error)
        dk_mass = torch.zeros_like(dv_error)

    # the query heads of one kv head share its keys: a block holds all of them
    blocks = _blocks(first, last, seqlen_k, max(1, work_elements(device) // group))
    for b in range(batch):
        for g in range(heads_kv):
            heads = slice(g * group, (g + 1) * group)
            for rows, keys in blocks:
                key_index = torch.arange(keys.start, keys.stop, device=device)
                vis = (key_index >= first[rows, None]) & (key_index <= last[rows, None])
                seen = vis.to(torch.float64)
                if b == 0 and g == 0:
                    n_col[keys] += seen.sum(0)
                n = n_row[rows]
                nonempty = n > 0
                k_rows, v_rows = on_device(case.k[b, keys, g]), on_device(case.v[b, keys, g])
                k_abs, v_abs = k_rows.abs(), v_rows.abs()
                # (group, rows, head_dim) and (group, rows) from here on
                q_rows = on_device(case.q[b, rows, heads]).transpose(0, 1)
                o_abs = out[b, rows, heads].transpose(0, 1).abs()
                lse_rows = torch.where(nonempty, lse[b, heads, rows], 0.0)
                logits = scale * (q_rows @ k_rows.T)
                logits_abs = logits.abs()
                magnitude = scale * (q_rows.abs() @ k_abs.T)
                # M_i, with a zero column so that a row of no visible key has M_i = 0
                row_max = torch.nn.functional.pad(torch.where(vis, logits_abs, 0.0), (0, 1)).amax(-1, keepdim=True)
                p = torch.where(vis, torch.exp(logits - lse_rows[..., None]), 0.0)
                # (1)
                delta_logit = gamma(head_dim + 2) * magnitude + u_a * (logits_abs + row_max) + u_f
                p_delta = p * delta_logit
                p_delta_sum = p_delta.sum(-1, keepdim=True)
                pv = p @ v_abs
                # (2)
                b_out = (
                    u * (o_abs + pv)
                    + gamma(2 * n)[:, None] * (pv + o_abs)
                    + u_a * o_abs
                    + p_delta @ v_abs
                    + p_delta_sum * o_abs
                    + eta
                    + (eta + eta_a) * (seen @ v_abs)
                    + 3 * n[:, None] * eta_a
                )
                bound_out[b, rows, heads] = b_out.transpose(0, 1)
                # (3)
                b_lse = (
                    p_delta_sum[..., 0]
                    + gamma(2 * n)
                    + u_f * (1 + torch.log(n.clamp(min=1)))
                    + 3 * u_a * (lse_rows.abs() + row_max[..., 0])
                    + u_lse * lse_rows.abs()
                )
                bound_lse[b, heads, rows] = torch.where(nonempty, b_lse, eta_lse)
                if not backward:
                    continue
                dout_rows = on_device(case.dout[b, rows, heads]).transpose(0, 1)
                dout_abs = dout_rows.abs()
                # (4)
                p_error = delta_logit + b_lse[..., None] + u_a * (logits_abs + lse_rows.abs()[..., None])
                dp = dout_rows @ v_rows.T
                # (5)
                b_delta = (dout_abs * b_out).sum(-1) + gamma(head_dim) * (dout_abs * o_abs).sum(-1)
                if delta is None:
                    d_rows = (dout_rows * out[b, rows, heads].transpose(0, 1)).sum(-1)
                else:
                    d_rows = delta[b, heads, rows]
                centered = (dp - d_rows[..., None]).abs()
                ds_abs = p * centered
                # (6)
                b_ds = (
                    p * (p_error * centered + gamma(head_dim) * (dout_abs @ v_abs.T) + b_delta[..., None])
                    + (2 * u + 2 * u_a) * ds_abs
                    + (eta + (eta + eta_a) * centered + eta_a * (2 * head_dim + 2)) * seen
                )
                # (8)
                bound_dq[b, rows, heads] = (
                    scale * (b_ds @ k_abs)
                    + gamma(n + 2)[:, None] * scale * (ds_abs @ k_abs)
                    + u * dq_expected[b, rows, heads].transpose(0, 1).abs()
                    + eta
                    + 3 * ((n + 2) * (n > 0))[:, None] * max(1.0, scale) * eta_a
                ).transpose(0, 1)
                q_abs = q_rows.abs()
                dv_error[b, keys, g] += ((p * (p_error + u) + (eta + eta_a) * seen).mT @ dout_abs).sum(0)
                dv_mass[b, keys, g] += (p.mT @ dout_abs).sum(0)
                dk_error[b, keys, g] += (b_ds.mT @ q_abs).sum(0)
                dk_mass[b, keys, g] += (ds_abs.mT @ q_abs).sum(0)

    bounds = {"out": bound_out, "lse": bound_lse}
    if backward:
        n_key = (group * n_col)[None, :, None, None]
        # per-head partials of dK and dV may be rounded to T before the group sum (flash-attn 2)
        u_group = u if group > 1 else 0.0
        seen_key = (n_key > 0).to(torch.float64)
        eta_group = eta + (group if group > 1 else 0) * eta * seen_key
        bounds["dq"] = bound_dq
        # (7)
        bounds["dv"] = (
            dv_error
            + (gamma(n_key + group) + u_group) * dv_mass
            + u * on_device(golden.dv).abs()
            + eta_group
            + 3 * (n_key + group) * seen_key * eta_a
        )
        # (9)
        bounds["dk"] = (
            scale * dk_error
            + (gamma(n_key + group + 2) + u_group) * scale * dk_mass
            + u * on_device(golden.dk).abs()
            + eta_group
            + 3 * (n_key + group + 2) * seen_key * max(1.0, scale) * eta_a
        )
    for name, bound in bounds.items():
        # (10)
        bound *= 1 + SECOND_ORDER_UNITS * u
        # (11)
        certified = float(golden.certified_bound.get(name, 0.0))
        if certified:
            bound += certified * _largest_finite(getattr(golden, name))
    return bounds
