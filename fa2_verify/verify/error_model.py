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
rows see (:func:`row_blocks`) and for all the query heads of one kv head at once,
so no (seqlen_q x seqlen_k) tensor is formed and the inputs are converted to
float64 a block at a time.  Only the columns of a block that some of its rows
do not see are masked (:class:`core.row_blocks.BlockMask`), and each
equation's sums over keys are one matrix product of their summed weights (docs/error-model.md,
"The error model at scale"); on CUDA the elementwise work between those products runs in the Triton passes of
:mod:`verify.bound_weights`.  When one (batch, kv head) pair is smaller than
the work budget, a chunk of consecutive pairs (:func:`pairs_per_chunk`) is
evaluated at once, every per-pair tensor gaining a leading pair dimension, so
that many short sequences cost a few tensor operations rather than a Python
loop over pairs.  A correct kernel keeps
``|actual - expected| / bound <= THRESHOLDS[output]``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch

from fa2_verify.core import row_blocks as core_blocks
from fa2_verify.core import triton_passes
from fa2_verify.core.case import Case
from fa2_verify.core.errors import KernelLoadError, UsageError
from fa2_verify.golden.api import require_certified_bound

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


def _is_count(value: Any, least: int) -> bool:
    """``value`` is an int (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _size_problem(value: Any) -> str | None:
    """Why ``value`` is not a declared size (a positive int, or ``[from_seqlen_q, size]`` pairs with
    increasing ``from_seqlen_q``, the first 0, each a non-bool int); None if it is one."""
    if _is_count(value, 1):
        return None
    if isinstance(value, bool):
        return "is a bool, not a positive int"
    if not isinstance(value, (list, tuple)):
        return "is not a positive int or a list of [from_seqlen_q, size] pairs"
    if not value:
        return "is an empty list of [from_seqlen_q, size] pairs"
    if not all(isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in value):
        return "holds an item that is not a [from_seqlen_q, size] pair"
    if not all(_is_count(start, 0) and _is_count(size, 1) for start, size in value):
        return "holds a pair that is not [int >= 0, int >= 1]"
    starts = [start for start, _ in value]
    if starts[0] != 0 or any(a >= b for a, b in zip(starts, starts[1:])):
        return "has from_seqlen_q values that do not rise from 0"
    return None


def _size_by_seqlen_q(value: Any, seqlen_q: int) -> int:
    """A declared block size for ``seqlen_q`` (valid by :func:`_size_problem`): the int, or the last pair that applies."""
    if _is_count(value, 1):
        return value
    return [size for start, size in value if start <= seqlen_q][-1]


@dataclasses.dataclass(frozen=True)
class PartialSums:
    """Where a kernel stores gradient partial sums in the input dtype (docs/error-model.md, eqs. 7b to 9b).

    ``dkv_rows``: dK and dV are accumulated in a ``T`` buffer, rounded after
    the contribution of each block of ``dkv_rows`` query rows (blocks start at
    multiples of it) of each query head, heads in increasing order within their
    group (PyTorch's CPU flash backward: ``q_split_size``).  ``dq_keys``: dQ is
    rounded after each block of ``dq_keys`` keys (``kv_split_size``).
    ``out_splits``: the forward splits the keys into at most this many splits
    and stores each split's normalized output in ``T`` before combining them by
    their LSEs (flash-decoding, split-KV; eq. 2b).  None: the FlashAttention-2
    model, float32 accumulators across all blocks (Dao 2023, Algorithm 1, line
    10; Algorithm 2, lines 13 to 15).
    """

    dkv_rows: int | None = None
    dq_keys: int | None = None
    out_splits: int | None = None

    #: The kernel ``config()`` key: ``{device type: {"dkv_rows": size, "dq_keys": size, "out_splits": count}}``,
    #: each an int or a list of ``[from_seqlen_q, value]`` pairs (the kernel picks it by seqlen_q).
    CONFIG_KEY = "partial_sums"

    @classmethod
    def validate(cls, config: Mapping[str, Any]) -> None:
        """A one-line :class:`KernelLoadError` naming the first field of ``config``'s declaration
        (:data:`CONFIG_KEY`) that is not ``{device type: {field: size}}``: a device type other than cpu or
        cuda, a field other than ``dkv_rows``, ``dq_keys``, ``out_splits``, a size that is not a positive int
        (bools and floats are not) or a table of ``[from_seqlen_q, size]`` pairs from 0 in increasing order."""
        declared = config.get(cls.CONFIG_KEY, {})
        problem = cls._problem(declared, f"config()[{cls.CONFIG_KEY!r}]")
        if problem is not None:
            raise KernelLoadError(
                f"config()[{cls.CONFIG_KEY!r}]={declared!r} is not a mapping of device type (cpu, cuda) to "
                "{'dkv_rows': size, 'dq_keys': size, 'out_splits': count}, each a positive int or a list of "
                f"[from_seqlen_q, size] pairs from 0 in increasing order: {problem}"
            )

    @classmethod
    def _problem(cls, declared: Any, path: str) -> str | None:
        """The first field of ``declared`` (at ``path``) that :meth:`validate` refuses, and why; None if none."""
        if not isinstance(declared, Mapping):
            return f"{path} is {type(declared).__name__}, not a mapping"
        fields = [field.name for field in dataclasses.fields(cls)]
        for device_type, blocks in declared.items():
            where = f"{path}[{device_type!r}]"
            if device_type not in ("cpu", "cuda"):
                return f"{where}: {device_type!r} is not a device type"
            if not isinstance(blocks, Mapping):
                return f"{where}={blocks!r} is not a mapping of field to size"
            for name, size in blocks.items():
                if name not in fields:
                    return f"{where}[{name!r}] is not a field (use {', '.join(fields)})"
                if _size_problem(size) is not None:
                    return f"{where}[{name!r}]={size!r} {_size_problem(size)}"
        return None

    @classmethod
    def of(cls, config: Mapping[str, Any], device: torch.device | str, seqlen_q: int) -> "PartialSums":
        """The partial sums a kernel's ``config()`` declares for ``device``'s type at ``seqlen_q`` (none: FA2's);
        a declaration :meth:`validate` refuses is its one-line :class:`KernelLoadError`."""
        cls.validate(config)
        blocks = config.get(cls.CONFIG_KEY, {}).get(torch.device(device).type, {})
        return cls(**{name: _size_by_seqlen_q(size, seqlen_q) for name, size in blocks.items()})


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


def pairs_per_chunk(pairs: int, group: int, seqlen_q: int, seqlen_k: int, head_dim: int, work: int,
                    per_pair: bool = False) -> int:
    """(batch, kv head) pairs evaluated at once: as many as keep ``pairs x group x seqlen_q x max(seqlen_k,
    head_dim)`` within ``work`` (the (rows x head_dim) tensors outgrow the (rows x keys) ones when keys are
    fewer than head_dim), at least 1 and at most ``pairs``; 1 when ``per_pair`` (the partial-sum bookkeeping of
    :class:`_QueryBlockPartials` is per pair).  More than one pair only when all of one pair's scores fit ``work``.
    """
    if per_pair:
        return 1
    return max(1, min(pairs, work // (group * max(seqlen_q, 1) * max(seqlen_k, head_dim, 1))))


def row_blocks(first: torch.Tensor, last: torch.Tensor, work: int, head_dim: int) -> list[tuple[slice, slice]]:
    """Blocks of query rows covering every row, each with the span of keys its rows see, in increasing order.

    Query ``i`` sees keys ``first[i]..last[i]`` (:func:`core.contract.visible_ranges`).
    Each run of rows that see a key (:func:`core.row_blocks.runs`) is planned by :func:`core.row_blocks.plan`:
    at most ``work`` elements ``rows x max(keys, head_dim)`` a block, grown while its cost per visible score
    falls, so a causal or sliding-window mask skips the keys no row of a block sees, a narrow window takes few
    blocks and no (seqlen_q x seqlen_k) tensor is ever formed.  A block over keys therefore holds only rows that
    see one; the rows that see none come in blocks of ``work // head_dim`` rows over no key.
    """
    first_host, last_host = first.cpu().numpy(), last.cpu().numpy()
    overhead = core_blocks.overhead_elements(first.device)
    step = max(1, work // max(head_dim, 1))
    blocks = []
    for run, sees in core_blocks.runs(first_host, last_host):
        if not sees:
            blocks += [(slice(start, min(run.stop, start + step)), slice(0, 0))
                       for start in range(run.start, run.stop, step)]
            continue
        for rows in core_blocks.plan(first_host[run.start:run.stop], last_host[run.start:run.stop], work, overhead,
                                     head_dim):
            start, stop = run.start + rows.start, run.start + rows.stop
            blocks.append((slice(start, stop), slice(int(first_host[start]), int(last_host[stop - 1]) + 1)))
    return blocks


def masked_row_blocks(
    first: torch.Tensor, last: torch.Tensor, work: int, head_dim: int
) -> list[tuple[slice, slice, core_blocks.BlockMask]]:
    """:func:`row_blocks`, each with its mask on the column bands some of its rows do not see
    (:class:`core.row_blocks.BlockMask`), built once for every pass over the blocks."""
    first_host, last_host = first.cpu(), last.cpu()
    return [(rows, keys, core_blocks.BlockMask.of(rows, keys, first, last, first_host, last_host))
            for rows, keys in row_blocks(first, last, work, head_dim)]


def rows_seeing_keys(first: torch.Tensor, last: torch.Tensor, seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first_row, last_row)``, int64 (seqlen_k,): the queries that see key ``j`` are ``first_row[j]..last_row[j]``.

    ``first`` and ``last`` of :func:`core.contract.visible_ranges` never
    decrease with ``i``, so the rows with ``first[i] <= j`` are a prefix, those
    with ``last[i] >= j`` a suffix, and the rows that see ``j`` the interval
    between (empty, ``first_row > last_row``, for a key no row sees).
    """
    key_index = torch.arange(seqlen_k, device=first.device)
    return torch.searchsorted(last, key_index), torch.searchsorted(first, key_index, right=True) - 1


class _QueryBlockPartials:
    """``sum |S|`` over the intermediate roundings of dV's and dK's partial sums ``S`` for one kv head (eqs. 7b, 9b).

    The kernel adds the contributions ``P_ij dO_ic`` (``dS_ij Q_ic``) of head
    ``h`` of the group and query block ``b`` (``partials.dkv_rows`` rows) to a
    ``T`` buffer and rounds it, heads in increasing order and blocks in
    increasing order within a head.  A rounding is exact unless the block holds
    a query that sees key ``j``; the last one, of head ``G - 1``, is (7)'s
    ``u |dV_jc|``.  Call :meth:`add` on the query rows in increasing order, then
    :meth:`finish`.  With ``T_h`` the contribution of head ``h`` and ``S^h_b``
    head ``h``'s own partial sum after block ``b``, the partial sum there is
    ``sum_(h'<h) T_h' + S^h_b``, bounded by ``sum_(h'<h) |T_h'| + |S^h_b|``.
    """

    def __init__(
        self, block: int, group: int, seqlen_k: int, head_dim: int, first: torch.Tensor, last: torch.Tensor
    ) -> None:
        seqlen_q, device = len(first), first.device
        first_row, last_row = rows_seeing_keys(first, last, seqlen_k)
        self.block, self.seqlen_q = block, seqlen_q
        #: b_j, the block of the last query that sees key j; R_j, the blocks with a query that sees it
        self.last_block = last_row.div(block, rounding_mode="floor")
        self.blocks = (self.last_block - first_row.div(block, rounding_mode="floor") + 1).clamp(min=0)
        self.last_head = (torch.arange(group, device=device) == group - 1)[:, None]
        self.later_heads = torch.arange(group - 1, -1, -1, device=device)[:, None]
        self.dv = torch.zeros(group, seqlen_k, head_dim, dtype=torch.float64, device=device)
        self.dk = torch.zeros_like(self.dv)
        self.dv_rounded = torch.zeros(seqlen_k, head_dim, dtype=torch.float64, device=device)
        self.dk_rounded = torch.zeros_like(self.dv_rounded)

    def roundings(self) -> torch.Tensor:
        """``G R_j - 1``, float64 (seqlen_k,): the intermediate roundings of key ``j``'s partial sums (0 if none)."""
        return (self.later_heads.numel() * self.blocks - 1).clamp(min=0).to(torch.float64)

    def add(self, rows: slice, keys: slice, p: torch.Tensor, ds: torch.Tensor, dout: torch.Tensor, q: torch.Tensor):
        """Rows ``rows`` (all heads of the group: ``p``, ``ds`` signed (G, rows, keys); ``dout``, ``q`` (G, rows, d))."""
        start = rows.start
        while start < rows.stop:
            block = start // self.block
            stop = min(rows.stop, (block + 1) * self.block)
            local = slice(start - rows.start, stop - rows.start)
            self.dv[:, keys] += p[:, local].mT @ dout[:, local]
            self.dk[:, keys] += ds[:, local].mT @ q[:, local]
            if stop % self.block == 0 or stop == self.seqlen_q:
                rounded = (block <= self.last_block - self.last_head.to(self.last_block.dtype))[..., None]
                self.dv_rounded += (rounded * self.dv.abs()).sum(0)
                self.dk_rounded += (rounded * self.dk.abs()).sum(0)
            start = stop

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``sum |S|`` for dV and dK, (seqlen_k, d): the heads' own partial sums plus ``|T_h|`` once per later rounding."""
        later = (self.later_heads * self.blocks - 1).clamp(min=0).to(torch.float64)[..., None]
        return self.dv_rounded + (later * self.dv.abs()).sum(0), self.dk_rounded + (later * self.dk.abs()).sum(0)


def _key_block_partials(ds: torch.Tensor, k_rows: torch.Tensor, keys: slice, last: torch.Tensor, block: int):
    """``sum |S|`` over the intermediate roundings of dQ's partial sums ``S = sum_(j < end of key block) dS_ij K_jc`` (eq. 8b).

    ``ds`` signed (..., G, rows, keys) over the key span ``keys``, ``k_rows`` (..., keys, d),
    ``last`` the last key each row sees; the kernel rounds after each block of
    ``block`` keys, and the rounding after row ``i``'s last block is (8)'s ``u |dQ_ic|``.
    Before a row's first visible block its partial sum is 0.  Without ``scale``.
    """
    last_block = last.div(block, rounding_mode="floor")[:, None]
    partial = torch.zeros(*ds.shape[:-1], k_rows.shape[-1], dtype=torch.float64, device=ds.device)
    rounded = torch.zeros_like(partial)
    for start in range(keys.start - keys.start % block, keys.stop, block):
        local = slice(max(start, keys.start) - keys.start, min(start + block, keys.stop) - keys.start)
        partial += ds[..., local] @ k_rows[..., local, :]
        rounded += (start // block < last_block) * partial.abs()
    return rounded


def _fuses_weights(requested: bool | None, device: torch.device, partials: PartialSums) -> bool:
    """Whether :func:`bounds_and_flush_shares` takes :mod:`verify.bound_weights`' passes: as ``requested``, by
    default on CUDA where Triton compiles them (not interpreting, :func:`verify.bound_weights.compiles`); never
    with declared partial sums, whose terms need the signed ``dS`` of the torch evaluation."""
    if partials != PartialSums():
        if requested:
            raise ValueError("the fused weights serve FA2's partial sums only; declared partial sums need torch")
        return False
    if requested is not None:
        return requested
    if not triton_passes.serve_by_default(device):
        return False
    from fa2_verify.verify import bound_weights

    return bound_weights.compiles(device)


def _largest_finite(expected: torch.Tensor) -> float:
    """``max |expected|`` over its finite elements (0 if none), a chunk at a time on its device."""
    flat = expected.detach().reshape(-1)
    step = work_elements(flat.device)
    largest = 0.0
    for start in range(0, flat.numel(), step):
        chunk = flat[start : start + step].to(torch.float64).abs()
        largest = max(largest, float(torch.where(torch.isfinite(chunk), chunk, 0.0).max()))
    return largest


def _scores(rows: torch.Tensor, keys: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """``add + rows @ keys^T``, (C, G, R, K), of ``rows`` (C, G, R, d) and ``keys`` (C, K, d): one product of the
    G query heads' rows stacked, ``add`` (C, G, R, 1) summed in its epilogue."""
    pairs, heads, count, _ = rows.shape
    stacked = rows.reshape(pairs, heads * count, -1)
    if add is None:
        product = stacked @ keys.mT
    else:
        product = torch.baddbmm(add.expand(pairs, heads, count, 1).reshape(pairs, heads * count, 1), stacked, keys.mT)
    return product.view(pairs, heads, count, -1)


def _rows_times(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``sum_j weights_ij values_jc``, (C, G, R, d), of ``weights`` (C, G, R, K) and ``values`` (C, K, d)."""
    pairs, heads, count, _ = weights.shape
    return (weights.reshape(pairs, heads * count, -1) @ values).view(pairs, heads, count, -1)


def _keys_times(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``sum_(h,i) weights_hij values_hic``, (C, K, d), of ``weights`` (C, G, R, K) and ``values`` (C, G, R, d):
    the sum over the G heads inside the product."""
    pairs, heads, count, _ = weights.shape
    return weights.reshape(pairs, heads * count, -1).mT @ values.reshape(pairs, heads * count, -1)


def first_order_bounds(case: Case, golden: Any, partials: PartialSums = PartialSums()) -> dict[str, torch.Tensor]:
    """Per-element bounds (float64, on the case's device) for ``out``, ``lse`` and, with a backward, ``dq``, ``dk``,
    ``dv``: :func:`bounds_and_flush_shares` without the shares."""
    return bounds_and_flush_shares(case, golden, partials, flush_shares=False)[0]


def bounds_and_flush_shares(
    case: Case, golden: Any, partials: PartialSums = PartialSums(), *, flush_shares: bool = True,
    fused_weights: bool | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per-element bounds (float64, on the case's device) for ``out``, ``lse`` and, with a backward, ``dq``, ``dk``,
    ``dv``, and with ``flush_shares`` each bound's share for float32's flushing (else an empty dict).

    The share (12) is the bound with every unit but ``eta_a`` set to 0 and no
    golden term (11): each term of a first-order bound is proportional to one
    unit, so it is what the bound allows a kernel that flushes float32
    subnormals (:func:`verify.noise_verdicts.judge`).  It is evaluated in the
    same pass over the blocks as the bounds, from the same weights ``P`` and
    ``|dP - D|``; no partial-sum term (2b, 7b to 9b) carries ``eta_a``.

    Each block's elementwise work between its products runs in torch, or with
    ``fused_weights`` in the three Triton passes of :mod:`verify.bound_weights`
    (the default on CUDA with Triton, when no partial sums are declared).

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
    * (7b) dV partials  with ``partials.dkv_rows``, (7) gains ``u sum_(h,b) |S^dV_hb,jc| + eta (G R_j - 1)`` over
      the ``G R_j - 1`` intermediate roundings of the partial sums, ``R_j`` the row blocks with a query that
      sees key ``j`` (:class:`_QueryBlockPartials`)
    * (8b) dQ partials  with ``partials.dq_keys``, (8) gains ``u scale sum_b |S^dQ_b,ic| + eta (C_i - 1)``,
      ``C_i`` the key blocks row ``i`` sees (:func:`_key_block_partials`)
    * (9b) dK partials  as (7b), ``u scale sum_(h,b) |S^dK_hb,jc| + eta (G R_j - 1)``
    * (2b) split-KV     with ``partials.out_splits`` = S > 1, (2) gains ``(u + u_w + 2 gamma_(S_i) + u_a) sum_j P_ij |V_jc|
      + eta``, ``u_w = u_f + u_a (2 M_i + 2 ln n_i + 1)`` the error of a split's float32 weight,
      ``S_i = min(S, n_i)`` the splits row ``i``'s keys can fill
    * (10) second order each bound is multiplied by ``1 + 4u``.
    * (11) golden       each bound gains ``certified_bound[name] * max|expected|``, ``certified_bound`` at most
      ``golden.api.MAX_CERTIFIED_BOUND["fast"]`` (2**-40), else ``GoldenError``.
    * (12) flush shares ``F^O_ic = eta_a sum_(j visible) |V_jc| + 3 n_i eta_a``, ``F^L_i = 0``,
      ``F^dS_ij = (P_ij sum_c |dO_ic| F^O_ic + eta_a |dP_ij - D_i|) [j visible from i]``,
      ``F^dQ_ic = scale (sum_j F^dS_ij |K_jc| + eta_a (2d + 2) sum_(j visible) |K_jc|) + 3 (n_i + 2) max(1, scale) eta_a [n_i > 0]``,
      ``F^dV_jc = eta_a sum_((h,i) sees j) |dO_ic| + 3 (N_j + G) eta_a [N_j > 0]``,
      ``F^dK_jc = scale (sum_(h,i) F^dS_ij |Q_ic| + eta_a (2d + 2) sum_((h,i) sees j) |Q_ic|) + 3 (N_j + G + 2) max(1, scale) eta_a [N_j > 0]``
    """
    require_certified_bound(dict(golden.certified_bound))
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
    out_splits = partials.out_splits or 1

    def on_device(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(device, torch.float64)

    first, last = spec.visible_ranges(device)
    n_row = (last - first + 1).clamp(min=0).to(torch.float64)
    first_row, last_row = rows_seeing_keys(first, last, seqlen_k)
    n_key = group * (last_row - first_row + 1).clamp(min=0).to(torch.float64)
    # every gamma once, per row or per key (each checks n u < 1 on the host: no sync inside the block loop)
    gamma_logit, gamma_out, log_n = gamma(head_dim + 2), gamma(2 * n_row), torch.log(n_row.clamp(min=1))
    filled = gamma(n_row.clamp(max=out_splits))
    # per-head partials of dK and dV may be rounded to T before the group sum (flash-attn 2)
    u_group = u if group > 1 else 0.0
    out, lse = on_device(golden.out), on_device(golden.lse)
    if backward:
        gamma_head, gamma_dq = gamma(head_dim), gamma(n_row + 2)
        gamma_dv, gamma_dk = gamma(n_key + group), gamma(n_key + group + 2)
        delta = on_device(golden.delta) if golden.delta is not None else None
        dq_expected = on_device(golden.dq)
        # (6)'s eta terms: the one in |dP - D| masked with the rest of dS's bound, the constant summed by keys
        # (12)'s share of that constant, eta_a (2d + 2)
        eta_a_ds = eta_a * (2 * head_dim + 2)
        eta_centered, eta_ds = eta + eta_a, eta + eta_a_ds

    bound_out = torch.empty_like(out)
    bound_lse = torch.empty_like(lse)
    if backward:
        bound_dq = torch.empty_like(out)
        dv_error = torch.zeros(batch, seqlen_k, heads_kv, head_dim, dtype=torch.float64, device=device)
        dk_error = torch.zeros_like(dv_error)
        dv_partial = torch.zeros_like(dv_error)
        dk_partial = torch.zeros_like(dv_error)
    if flush_shares:
        flush_out = torch.empty_like(out)
        if backward:
            flush_dq, flush_dv, flush_dk = torch.empty_like(out), torch.zeros_like(dv_error), torch.zeros_like(dv_error)

    # the query heads of one kv head share its keys: a block holds all of them; with a leading pair dimension C,
    # a chunk of consecutive (batch, kv head) pairs p = b * heads_kv + g is evaluated at once
    work = max(1, work_elements(device) // group)
    blocks = masked_row_blocks(first, last, work, head_dim)
    dkv_rows = partials.dkv_rows if backward else None
    per_pair = dkv_rows is not None
    signed_ds = backward and (per_pair or partials.dq_keys is not None)
    fused = _fuses_weights(fused_weights, device, partials)
    if fused:
        from fa2_verify.verify import bound_weights
    chunk = pairs_per_chunk(batch * heads_kv, group, seqlen_q, seqlen_k, head_dim, work * group, per_pair)

    def by_pair(tensor: torch.Tensor, axis: int) -> torch.Tensor:
        """``tensor`` with its heads axis ``axis`` split into (kv head, group)."""
        return tensor.unflatten(axis, (heads_kv, group))

    q_pairs = by_pair(case.q, 2)
    out_pairs, bound_out_pairs = by_pair(out, 2), by_pair(bound_out, 2)
    flush_out_pairs = by_pair(flush_out, 2) if flush_shares else None
    flush_dq_pairs = by_pair(flush_dq, 2) if flush_shares and backward else None
    lse_pairs, bound_lse_pairs = by_pair(lse, 1), by_pair(bound_lse, 1)
    if backward:
        dq_pairs, bound_dq_pairs = by_pair(dq_expected, 2), by_pair(bound_dq, 2)
        dout_pairs = by_pair(case.dout, 2)
        delta_pairs = by_pair(delta, 1) if delta is not None else None
    query_partials = None
    for start in range(0, batch * heads_kv, chunk):
        pair = torch.arange(start, min(start + chunk, batch * heads_kv), device=device)
        b, g = pair.div(heads_kv, rounding_mode="floor"), pair % heads_kv
        if dkv_rows is not None:
            query_partials = _QueryBlockPartials(dkv_rows, group, seqlen_k, head_dim, first, last)
        for rows, keys, mask in blocks:
            n = n_row[rows]
            nonempty = n > 0
            # (C, keys, head_dim)
            k_rows, v_rows = on_device(case.k[b, keys, g]), on_device(case.v[b, keys, g])
            k_abs, v_abs = k_rows.abs(), v_rows.abs()
            # (C, group, rows, head_dim) and (C, group, rows) from here on; the (C, group, rows, keys) work
            # matrices are updated in place where their old value is not needed again
            q_rows = on_device(q_pairs[b, rows, g]).transpose(1, 2)
            o_abs = out_pairs[b, rows, g].transpose(1, 2).abs()
            lse_rows = torch.where(nonempty, lse_pairs[b, g][..., rows], 0.0)
            logits = _scores(scale * q_rows, k_rows)
            # (2): its three sums over keys, u sum_j P_ij |V_jc| and the like, P_ij Delta_ij |V_jc| and
            # sum_(j visible) |V_jc|, as one product with P_ij's coefficients and one sum over the visible keys
            pv_coefficient = u + gamma_out[rows][..., None]
            if fused:
                magnitudes = _scores(gamma_logit * scale * q_rows.abs(), k_abs)
                pv_weights, row_max, p_delta_sum = bound_weights.forward(
                    logits, magnitudes, first[rows], last[rows], keys.start, lse_rows, pv_coefficient[:, 0], u_a, u_f)
            else:
                logits_abs = logits.abs()
                # M_i (0 for a row of no visible key)
                row_max = mask.row_max(logits_abs)
                # (1): gamma_{d+2} A_ij + u_a M_i + u_f in one product, then u_a |S_ij|
                delta_logit = _scores(gamma_logit * scale * q_rows.abs(), k_abs, u_a * row_max + u_f)
                delta_logit.add_(logits_abs, alpha=u_a)
                p = mask.mask_(logits.sub_(lse_rows[..., None]).exp_())
                del logits
                p_delta = p * delta_logit
                p_delta_sum = p_delta.sum(-1, keepdim=True)
                if out_splits > 1:
                    # (2b)
                    weight_error = u_f + u_a * (2 * row_max + 2 * log_n[rows][..., None] + 1)
                    pv_coefficient = pv_coefficient + (u + weight_error + 2 * filled[rows][..., None] + u_a)
                pv_weights = p_delta.addcmul_(p, pv_coefficient)
                del p_delta
            visible_v = mask.key_sums(v_abs)[:, None]
            # the accumulation's flushes, in the bound and in its flush share (12)
            out_flushes = 3 * n[..., None] * eta_a
            b_out = (
                _rows_times(pv_weights, v_abs)
                + (u + gamma_out[rows][..., None] + u_a + p_delta_sum) * o_abs
                + (eta + eta_a) * visible_v
                + (2 * eta if out_splits > 1 else eta)
                + out_flushes
            )
            del pv_weights
            bound_out_pairs[b, rows, g] = b_out.transpose(1, 2)
            if flush_shares:
                # (12)
                assert flush_out_pairs is not None
                f_out = eta_a * visible_v + out_flushes
                flush_out_pairs[b, rows, g] = f_out.transpose(1, 2)
            # (3)
            b_lse = (
                p_delta_sum[..., 0]
                + gamma_out[rows]
                + u_f * (1 + log_n[rows])
                + 3 * u_a * (lse_rows.abs() + row_max[..., 0])
                + u_lse * lse_rows.abs()
            )
            bound_lse_pairs[b, g, :, rows] = torch.where(nonempty, b_lse, eta_lse)
            if not backward:
                continue
            dout_rows = on_device(dout_pairs[b, rows, g]).transpose(1, 2)
            dout_abs, q_abs = dout_rows.abs(), q_rows.abs()
            # (4)'s part constant along a row
            row_error = b_lse + u_a * lse_rows.abs()
            # (5)
            b_delta = (dout_abs * b_out).sum(-1) + gamma_head * (dout_abs * o_abs).sum(-1)
            if delta_pairs is None:
                d_rows = (dout_rows * out_pairs[b, rows, g].transpose(1, 2)).sum(-1)
            else:
                d_rows = delta_pairs[b, g][..., rows]
            # the units of (8)'s, (7)'s and (9)'s |dS_ij| and P_ij terms; (12)'s sum_c |dO_ic| F^O_ic
            dq_units = 2 * u + 2 * u_a + gamma_dq[rows]
            dv_units = u + u_group + gamma_dv[keys]
            dk_units = 2 * u + 2 * u_a + u_group + gamma_dk[keys]
            flush_row = (dout_abs * f_out).sum(-1) if flush_shares else None
            # the weights of (7), (12), (8) and (9), each used by its products below; torch frees |S| before it forms
            # dP - D, and forms each weight only once the one before is used, so that no more (rows x keys)
            # matrices live at once than it needs
            if fused:
                # dP - D and (6)'s gamma_d sum_c |dO_ic| |V_jc| + B^D_i, D_i and B^D_i added in the products' epilogues
                centered = _scores(dout_rows, v_rows, -d_rows[..., None])
                gradient = _scores(gamma_head * dout_abs, v_abs, b_delta[..., None])
                weights = bound_weights.backward(
                    logits, magnitudes, centered, gradient, first[rows], last[rows], keys.start,
                    {"lse": lse_rows, "row_max": row_max[..., 0], "error": row_error, "dq_units": dq_units},
                    {"dv_units": dv_units, "dk_units": dk_units}, (u_a, u_f, eta_centered, eta_a), flush_row)
                del logits, magnitudes, centered, gradient
            else:
                # (4), in place of (1)
                p_error = delta_logit.add_(logits_abs, alpha=u_a).add_(row_error[..., None])
                del delta_logit, logits_abs
                # dP - D, D subtracted in the product's epilogue
                centered = _scores(dout_rows, v_rows, -d_rows[..., None])
                ds = p * centered if signed_ds else None
                centered.abs_()
                # (7): both sums of P_ij |dO_ic|, with (E_ij + u) and with (gamma_{N_j+G} + u_G), in one product
                weights = {"dv": (p_error + dv_units).mul_(p)}
            seeing_dout = mask.row_sums(dout_abs.sum(1), keys.stop - keys.start)
            dv_error[b, keys, g] += _keys_times(weights.pop("dv"), dout_abs) + (eta + eta_a) * seeing_dout
            seeing_q = mask.row_sums(q_abs.sum(1), keys.stop - keys.start)
            visible_k = mask.key_sums(k_abs)[:, None]
            # (8)'s flushes of the accumulation, in the bound and in its flush share (12)
            dq_flushes = 3 * ((n + 2) * (n > 0))[..., None] * max(1.0, scale) * eta_a
            if flush_shares:
                assert flush_dq_pairs is not None and flush_row is not None
                # (12), from |dP - D| before it becomes |dS|
                f_ds = (weights.pop("flush") if fused
                        else mask.mask_(torch.mul(p, flush_row[..., None]).add_(centered, alpha=eta_a)))
                flush_dq_pairs[b, rows, g] = (
                    scale * (_rows_times(f_ds, k_abs) + eta_a_ds * visible_k) + dq_flushes
                ).transpose(1, 2)
                flush_dk[b, keys, g] += _keys_times(f_ds, q_abs) + eta_a_ds * seeing_q
                flush_dv[b, keys, g] += eta_a * seeing_dout
                del f_ds
            if not fused:
                # (6) but for its (2u + 2u_a) |dS_ij| and eta + eta_a (2d + 2), added with (8)'s and (9)'s |dS_ij|
                b_ds = _scores(gamma_head * dout_abs, v_abs, b_delta[..., None]).addcmul_(p_error, centered).mul_(p)
                b_ds = mask.mask_(b_ds.add_(centered, alpha=eta_centered))
                del p_error
                ds_abs = centered.mul_(p)
                # (8): B^dS_ij and gamma_{n_i+2} |dS_ij| in one product; (9): B^dS_ij and (gamma_{N_j+G+2} + u_G)
                # |dS_ij| in one product, in place of dS's bound
                weights["dq"] = torch.addcmul(b_ds, ds_abs, dq_units[..., None])
                weights["dk"] = b_ds.addcmul_(ds_abs, dk_units)
                del b_ds, ds_abs, centered
            b_dq = (
                scale * (_rows_times(weights.pop("dq"), k_abs) + eta_ds * visible_k)
                + u * dq_pairs[b, rows, g].transpose(1, 2).abs()
                + eta
                + dq_flushes
            )
            if partials.dq_keys is not None:
                # (8b)
                assert ds is not None
                key_blocks = last[rows].div(partials.dq_keys, rounding_mode="floor") - first[rows].div(
                    partials.dq_keys, rounding_mode="floor"
                )
                b_dq = (
                    b_dq
                    + u * scale * _key_block_partials(ds, k_rows[:, None], keys, last[rows], partials.dq_keys)
                    + eta * (key_blocks * nonempty)[..., None]
                )
            bound_dq_pairs[b, rows, g] = b_dq.transpose(1, 2)
            dk_error[b, keys, g] += _keys_times(weights.pop("dk"), q_abs) + eta_ds * seeing_q
            if query_partials is not None:
                assert ds is not None
                query_partials.add(rows, keys, p[0], ds[0], dout_rows[0], q_rows[0])
        if query_partials is not None:
            dv_partial[b[0], :, g[0]], dk_partial[b[0], :, g[0]] = query_partials.finish()

    bounds = {"out": bound_out, "lse": bound_lse}
    shares = {"out": flush_out, "lse": torch.zeros_like(bound_lse)} if flush_shares else {}
    if backward:
        n_key = n_key[None, :, None, None]
        seen_key = (n_key > 0).to(torch.float64)
        eta_group = eta + (group if group > 1 else 0) * eta * seen_key
        # (7)'s and (9)'s flushes of the accumulation, in the bounds and in their flush shares (12)
        dv_flushes = 3 * (n_key + group) * seen_key * eta_a
        dk_flushes = 3 * (n_key + group + 2) * seen_key * max(1.0, scale) * eta_a
        bounds["dq"] = bound_dq
        # (7b), (9b): eta for each intermediate rounding of the partial sums (the same count for every kv head)
        partial_roundings = 0.0 if query_partials is None else query_partials.roundings()[None, :, None, None]
        # (7)
        bounds["dv"] = (
            dv_error
            + u * on_device(golden.dv).abs()
            + eta_group
            + dv_flushes
            + u * dv_partial
            + eta * partial_roundings
        )
        # (9)
        bounds["dk"] = (
            scale * dk_error
            + u * on_device(golden.dk).abs()
            + eta_group
            + dk_flushes
            + u * scale * dk_partial
            + eta * partial_roundings
        )
        if flush_shares:
            # (12)
            shares["dq"] = flush_dq
            shares["dv"] = flush_dv + dv_flushes
            shares["dk"] = scale * flush_dk + dk_flushes
    for name, bound in bounds.items():
        # (10)
        bound *= 1 + SECOND_ORDER_UNITS * u
        # (11)
        certified = float(golden.certified_bound.get(name, 0.0))
        if certified:
            bound += certified * _largest_finite(getattr(golden, name))
    return bounds, shares
