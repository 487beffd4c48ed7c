"""The size guard: a case's memory, estimated from its spec before anything is allocated, and its time.

Every entry that builds cases calls :func:`require_fits` first: ``run``,
``baseline`` and ``gate`` through :func:`verify.check.run_cases`, ``repro``,
and the property suite (``properties.verdicts.introduce``).  A case larger
than the memory free on its device (or in host RAM) is refused in one line
that gives the estimate, where it goes, and the memory free, instead of a
traceback or a kernel error after minutes of work; so is a case whose
golden and comparison would run longer than a limit
(:mod:`verify.golden_time`, ``--max-golden-seconds``).  :func:`estimate` is the
one model of a case's memory: the GPU scale set (:mod:`app.cases.scale`)
is sized by it and the ``scale`` property profile's per-example budget
(``properties.cases.fit_budget``) cuts cases by it.

The estimate follows :func:`verify.check.check_case` stage by stage and, for
each stage, adds the buffers alive at its peak (including what earlier stages
hold); the answer is the largest stage.  With ``s`` the dtype's size in bytes,
``Q = batch*seqlen_q*heads_q*head_dim`` and ``K = batch*seqlen_k*heads_kv*head_dim``
elements, ``R = batch*heads_q*seqlen_q`` rows and
``P = batch*heads_q*seqlen_q*seqlen_k`` scores:

* *inputs* (:func:`core.case.make_case`): the float64 draws ``8 (2Q + 2K)``
  with the generator's temporaries (:func:`core.values.draw_bytes`), on the
  case's device unless larger than ``core.values.DEVICE_DRAW_BYTES``, 20 GiB (then on
  the host), then the inputs ``s (2Q + 2K)`` on the device;
* *kernel* (device): the outputs and their clones, ``2 (s (2Q + 2K) + 4R)``,
  the copies of ``out`` and ``lse`` handed to the backward, and an FA2
  backward's float32 dQ accumulator and ``D`` rows, ``4 (Q + R)`` (Dao 2023,
  Algorithm 2 line 15) (the inputs a call must leave unchanged are checked by
  a digest on the device, :mod:`core.digest`, not copied);
* *golden* (device, :mod:`golden.fast`): float64 inputs and outputs, each in
  two layouts, one row block of at most ``BLOCK_ELEMENTS[device]`` scores (at
  least one row; the mask is kept as key ranges), or for short sequences one
  chunk of (batch, kv head) pairs of as many elements (:func:`golden.fast.pairs_per_chunk`); on the host, the outputs'
  copy for the golden cache and, where mpmath may serve the case, its mpf
  weights (``2 P / batch`` of them); the outputs stay on the device;
* *error model* (device, :mod:`verify.error_model`): float64 copies of the
  inputs, the bounds, the dK/dV accumulators and temporaries, one block of about
  ``WORK_ELEMENTS[device]`` scores (at least one row; the mask is kept as
  key ranges), or one chunk of (batch, kv head) pairs of as many elements
  (:func:`verify.error_model.pairs_per_chunk`);
* *naive attention* (device, :mod:`verify.lowprec`, the flash-attn ratio):
  its outputs, K and V of one batch repeated over the query heads, the float32
  dK/dV sums, and one row block of about ``WORK_ELEMENTS[device]`` scores per
  query head in the dtype, with their gradients;
* *model kernel* (device, :mod:`verify.model_kernel`, 16-bit cases only): its
  outputs and float32 dK/dV sums, its rows' ``logit_max`` and scale errors
  (and ``ds_signal``, ``ds_magnitude`` with a backward),
  K and V of one batch repeated over the query heads in float32, and one row
  block of float32 scores like the naive attention's;
* *comparison* (device, :func:`verify.metrics.compare`): float64 work arrays
  of one chunk of ``CHUNK_ELEMENTS`` elements; for a 16-bit case, beside the
  model's outputs, the statistical, local and bias verdicts of one output at a
  time (:mod:`verify.noise_verdicts`), float64 arrays of as many whole batches
  of it as ``noise_verdicts.JUDGE_ELEMENTS`` holds (at least one).

Nothing is ``P``-sized: the golden, the error model, the naive attention and
the comparison work in row blocks or chunks, so a 128k-token case
costs them its inputs, outputs and bounds, not a ``seqlen_q x seqlen_k``
matrix.

Of the kernel's own workspace only what every FA2 backward needs is counted
(the float32 dQ accumulator and ``D``); a kernel that needs more is the
kernel's business.  On the
CPU the device is host RAM, and both are one budget.  The counts of
simultaneous copies (``*_COPIES``) were read from the code and compared with
the resident-memory peaks of each stage run alone on the CPU (forked, so
noisy: docs/design.md, "Cases and their size").  When a stage changes how it
works in blocks or where it runs, update its stage here with it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import torch

from fa2_verify.core import values
from fa2_verify.core.case import CaseSpec
from fa2_verify.core.errors import CaseTooLarge
from fa2_verify.golden.fast import BLOCK_ELEMENTS, pairs_per_chunk
from fa2_verify.golden.options import AUTO_FALLBACK_MAX_WORK, GoldenOptions
from fa2_verify.verify import golden_time, noise_verdicts
from fa2_verify.verify.error_model import pairs_per_chunk as error_model_pairs, work_elements
from fa2_verify.verify.metrics import CHUNK_ELEMENTS

FLOAT64 = 8
FLOAT32 = 4

#: Float64 temporaries per element of a golden row block (:mod:`golden.fast`:
#: the score pair, logits, exponentials, P, dP pair, shifted dP, dS, and the
#: products of :func:`golden.eft.dd_matmul`; measured 8 to 9 with tracemalloc).
GOLDEN_BLOCK_COPIES = 12

#: Bytes of one mpmath number at 113 bits with its list slot (measured: 232 + 8).
MPF_BYTES = 256

#: Float64 temporaries per element of an error-model chunk (:mod:`verify.error_model`:
#: logits and their absolute value, magnitudes, P, Delta, P Delta, P's error,
#: dP, |dP - D|, |dS|, dS's bound, the flush shares' ``F^dS`` and the temporaries of the expressions forming
#: them; the peak resident memory measured up to 34 with the allocator's reuse, before ``F^dS``).
ERROR_MODEL_CHUNK_COPIES = 37

#: Float64 arrays of dK's size the error model holds besides the bounds: the
#: four dK/dV accumulators, the flush shares' two, and the temporaries of the final dK/dV expressions
#: (docs/error-model.md, eqs. 7, 9 and 12).
ERROR_MODEL_KEY_COPIES = 10

#: Score blocks alive at once in the naive attention, in units of one block in
#: the dtype (:mod:`verify.lowprec`: the scores, scaled and masked, the softmax
#: and its masked copy, the mask, dP and dS, and float32 copies of P and dS for
#: the dK/dV sums).
LOWPREC_SCORE_COPIES = 14

#: Score blocks alive at once in the model kernel, in float32 (:mod:`verify.model_kernel`: the logits, masked,
#: their exponentials and ``fl_T`` copy, the visibility mask, and the backward's ``P``, ``dP``, ``dS``, and the
#: premise's weighted ``|dP - D|``).
MODEL_SCORE_COPIES = 11

#: Float64 arrays of an output's size alive while the noise verdicts judge it (:func:`verify.noise_verdicts.judge`:
#: the golden, the kernel's and the model's outputs canonical, the errors, units, ``r``, leans and group sums;
#: 13.3 measured on the CPU for ``out``, besides the golden and the bound).
NOISE_VERDICT_COPIES = 14

#: Float64 arrays of a comparison chunk's size alive while an output is compared
#: (:func:`verify.metrics.compare`, in chunks of ``CHUNK_ELEMENTS``: actual,
#: error, normalized, ULPs, relative, magnitudes, the naive output's errors,
#: and the quantile selection's work; 25 measured on the CPU).
COMPARE_COPIES = 28


@dataclasses.dataclass(frozen=True)
class Stage:
    """Bytes alive at one stage's peak: on the case's device, and in host RAM besides."""

    name: str
    device: int
    host: int


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The stages of one case, and their peaks."""

    stages: tuple[Stage, ...]

    @property
    def device(self) -> int:
        return max(stage.device for stage in self.stages)

    @property
    def host(self) -> int:
        return max(stage.host for stage in self.stages)

    @property
    def combined(self) -> int:
        """The peak when device and host are one memory (the CPU)."""
        return max(stage.device + stage.host for stage in self.stages)

    def largest(self, on_cpu: bool) -> Stage:
        return max(self.stages, key=lambda stage: stage.device + stage.host if on_cpu else stage.device)


def _block(limit: int, spec: CaseSpec) -> int:
    """Scores in one row block: ``max(1, limit // seqlen_k)`` rows (at most ``seqlen_q``) of ``seqlen_k`` keys."""
    return min(max(1, limit // max(spec.seqlen_k, 1)), spec.seqlen_q) * spec.seqlen_k


def estimate(
    spec: CaseSpec, device: str | torch.device = "cpu", golden_options: GoldenOptions | None = None
) -> Estimate:
    """The memory of :func:`verify.check.check_case` on ``spec`` on ``device`` (the module docstring has the terms)."""
    options = golden_options or GoldenOptions()
    size = spec.torch_dtype.itemsize
    queries = spec.batch * spec.seqlen_q * spec.heads_q * spec.head_dim
    keys = spec.batch * spec.seqlen_k * spec.heads_kv * spec.head_dim
    rows = spec.batch * spec.heads_q * spec.seqlen_q
    scores = rows * spec.seqlen_k
    gradients = spec.backward

    inputs = size * (2 * queries + 2 * keys)
    outputs = size * queries + 4 * rows + (size * (queries + 2 * keys) if gradients else 0)
    golden_inputs = FLOAT64 * (queries * (2 if gradients else 1) + 2 * keys)
    golden_outputs = FLOAT64 * (queries + 2 * rows + ((queries + 2 * keys) if gradients else 0))
    bounds = golden_outputs
    held_device = inputs + outputs
    workspace = FLOAT32 * (queries + rows) if gradients else 0
    handed = size * queries + 4 * rows if gradients else 0

    pair_elements = spec.seqlen_q * max(spec.seqlen_k, spec.head_dim)
    golden_pairs = min(spec.batch * spec.heads_kv, pairs_per_chunk(spec.seqlen_q, spec.seqlen_k, spec.head_dim, device))
    golden_budget = BLOCK_ELEMENTS[torch.device(device).type]
    # a chunk of pairs holds at most the budget; a pair larger than it is split into row blocks of at most the
    # budget's scores (golden.fast.blocks: rows x the keys they see), or one row
    golden_rows_block = min(spec.seqlen_q * spec.seqlen_k, max(golden_budget, spec.seqlen_k))
    golden_chunk = max(golden_rows_block, min(golden_pairs * pair_elements, golden_budget))
    golden_block = GOLDEN_BLOCK_COPIES * FLOAT64 * golden_chunk
    # dK and dV as double-doubles, and the keys' side of Q K^T and dO V^T split once (golden.eft.Columns: each
    # b0 and rb, and the keys negated when the scale is)
    golden_rows = FLOAT64 * 6 * rows + 9 * FLOAT64 * spec.seqlen_k * spec.head_dim
    # contract <-> head-major layouts (golden.inputs, golden.api): each input is converted on its own (its
    # contract-layout float64 copy is freed once the head-major one exists), and every output is held in
    # both layouts while the result is built, after the inputs' conversion is over
    conversion = max(FLOAT64 * max(queries, keys), 2 * golden_outputs)
    golden_work = golden_inputs + conversion + golden_block + golden_rows
    work = scores * spec.head_dim
    golden_host = golden_outputs
    if options.method == "mpmath" or (options.method == "auto" and work <= AUTO_FALLBACK_MAX_WORK):
        golden_host += MPF_BYTES * (2 * scores // spec.batch + (golden_inputs + golden_outputs) // FLOAT64)

    group = spec.heads_q // spec.heads_kv
    error_pairs = error_model_pairs(spec.batch * spec.heads_kv, group, spec.seqlen_q, spec.seqlen_k, spec.head_dim,
                                    work_elements(device))
    error_chunk = min(error_pairs * group * pair_elements, work_elements(device))
    chunk = ERROR_MODEL_CHUNK_COPIES * FLOAT64 * max(_block(work_elements(device), spec), error_chunk)
    key_work = ERROR_MODEL_KEY_COPIES * FLOAT64 * keys if gradients else 0
    # the error model converts its inputs to float64 one block of rows at a time (inside ``chunk``)
    error_model_work = bounds + key_work + chunk

    naive_outputs = outputs + (FLOAT32 * 2 * keys if gradients else 0)
    repeated_keys = spec.seqlen_k * spec.heads_q * spec.head_dim
    # the scores of one batch's block for all query heads, or of a chunk of batches within the work budget
    # (verify.lowprec.batch_chunks)
    batch_block = spec.heads_q * _block(work_elements(device) // max(spec.heads_q, 1), spec)
    naive_block = max(batch_block, min(spec.batch * batch_block, work_elements(device)))
    naive_work = size * (LOWPREC_SCORE_COPIES * naive_block + 2 * repeated_keys)
    largest_output = max(queries, keys if gradients else 0, rows)
    compare_work = COMPARE_COPIES * FLOAT64 * min(largest_output, CHUNK_ELEMENTS)
    judged = spec.torch_dtype in noise_verdicts.DTYPES
    # the rows' logit_max and scale errors, and with a backward ds_signal and ds_magnitude
    model_rows = FLOAT32 * rows * (4 if gradients else 2)
    model_outputs = (outputs + model_rows + (FLOAT32 * 2 * keys if gradients else 0)) if judged else 0
    model_work = FLOAT32 * (MODEL_SCORE_COPIES * naive_block + 2 * repeated_keys) if judged else 0
    per_batch = largest_output // max(1, spec.batch)
    judged_at_once = min(largest_output, per_batch * noise_verdicts.batches_per_part(per_batch))
    noise_work = NOISE_VERDICT_COPIES * FLOAT64 * judged_at_once if judged else 0
    drawn = values.draw_bytes(spec)
    drawn_on_device = values.draw_device(spec, device).type == "cuda"
    # bfloat16: the bounds' shares for float32 flushing, made in the error model's pass (noise_verdicts.flush_matters)
    flush_shares = bounds if judged and noise_verdicts.flush_matters(spec.torch_dtype) else 0

    return Estimate(
        (
            Stage("inputs", inputs + (drawn if drawn_on_device else 0), 0 if drawn_on_device else drawn),
            Stage("kernel", inputs + 2 * outputs + handed + workspace, 0),
            Stage("golden", held_device + golden_work, golden_host),
            Stage("error model", held_device + golden_outputs + error_model_work + flush_shares, 0),
            Stage("naive attention", held_device + golden_outputs + bounds + flush_shares + naive_outputs + naive_work, 0),
            Stage("model kernel", held_device + golden_outputs + bounds + flush_shares + naive_outputs + model_outputs
                  + model_work, 0),
            Stage("comparison", held_device + golden_outputs + bounds + flush_shares + naive_outputs + model_outputs
                  + max(compare_work, noise_work), 0),
        )
    )


def _meminfo_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (Linux), else ``None``."""
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


#: Device memory a process holds outside PyTorch's caching allocator, kept out of the processes' shares of a
#: GPU (:func:`process_share`): its CUDA context with the kernels' modules and the libraries' handles.  Not
#: measured per process; three `scale` workers capped with it ran that whole profile on one H100 without
#: running out of memory (docs/benchmarks.md, "The `scale` property profile").
CONTEXT_BYTES = 2 * 2**30

#: The share of each CUDA device's memory this process keeps to (:func:`keep_to_share`), by device index.
_shares: dict[int, int] = {}


def process_share(total: int, processes: int) -> int:
    """Bytes each of ``processes`` processes sharing a device of ``total`` bytes may allocate: an equal part of
    what their contexts leave, ``(total - processes * CONTEXT_BYTES) / processes`` (0 when they leave nothing)."""
    return max(0, (total - processes * CONTEXT_BYTES) // processes)


def _cuda_index(device: torch.device) -> int:
    """The index of CUDA ``device``: its own, else the current device's."""
    return device.index if device.index is not None else torch.cuda.current_device()


def keep_to_share(device: str | torch.device, processes: int) -> int:
    """Cap this process's caching allocator on CUDA ``device`` at :func:`process_share` of its memory, so that
    ``processes`` processes sharing it each keep to their part (the allocator frees its cached blocks before it
    would exceed the cap, ``torch.cuda.set_per_process_memory_fraction``); :func:`free_memory` then counts
    only this share.  Return the share in bytes."""
    device = torch.device(device)
    index = _cuda_index(device)
    total = torch.cuda.get_device_properties(index).total_memory
    share = process_share(total, processes)
    torch.cuda.set_per_process_memory_fraction(share / total, index)
    _shares[index] = share
    return share


def free_memory(device: str | torch.device) -> int:
    """Bytes that a case may still take on ``device``.

    CPU: ``MemAvailable`` (free memory plus reclaimable caches), else free
    physical pages.  CUDA: ``torch.cuda.mem_get_info``'s free memory plus what
    PyTorch's caching allocator holds reserved but unused, and no more than
    what this process's share leaves (:func:`keep_to_share`), if it has one.
    """
    device = torch.device(device)
    if device.type == "cuda":
        index = _cuda_index(device)
        free, _ = torch.cuda.mem_get_info(index)
        allocated = torch.cuda.memory_allocated(index)
        room = free + torch.cuda.memory_reserved(index) - allocated
        return min(room, _shares[index] - allocated) if index in _shares else room
    available = _meminfo_available()
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return available


def _device_label(device: torch.device) -> str:
    """``cuda:0``, with this process's share of it when it keeps to one (:func:`keep_to_share`)."""
    index = _cuda_index(device)
    if index not in _shares:
        return str(device)
    return f"{device}, of which this process may use {_bytes(_shares[index])} (fewer processes per GPU get more)"


def _bytes(count: float) -> str:
    """``3.2 GiB``-style size."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    index = 0
    while count >= 1024 and index < len(units) - 1:
        count /= 1024
        index += 1
    return f"{count:.4g} {units[index]}"


def require_fits(
    spec: CaseSpec,
    device: str | torch.device,
    golden_options: GoldenOptions | None = None,
    max_golden_seconds: float | None = None,
) -> None:
    """Raise :class:`CaseTooLarge` when ``spec`` needs more memory than ``device`` (or the host) has free, or
    more golden and comparison time (:func:`verify.golden_time.estimate_seconds`) than ``max_golden_seconds``
    (:data:`verify.golden_time.DEFAULT_MAX_SECONDS` when ``None``)."""
    device = torch.device(device)
    needed = estimate(spec, device, golden_options)
    label = spec.name or "the case"
    shape = (
        f"batch={spec.batch}, seqlen_q={spec.seqlen_q}, seqlen_k={spec.seqlen_k}, heads_q={spec.heads_q}, "
        f"heads_kv={spec.heads_kv}, head_dim={spec.head_dim}, {spec.dtype}"
    )
    fix = "use a smaller batch, sequence length, head count or head dim"
    if device.type == "cpu":
        checks = [("cpu", needed.combined, free_memory("cpu"), needed.largest(on_cpu=True).name)]
    else:
        checks = [
            (_device_label(device), needed.device, free_memory(device), needed.largest(on_cpu=False).name),
            ("host RAM", needed.host, free_memory("cpu"), max(needed.stages, key=lambda stage: stage.host).name),
        ]
    for where, amount, free, stage in checks:
        if amount > free:
            raise CaseTooLarge(
                f"{label} ({shape}) needs about {_bytes(amount)} on {where} (at its {stage} stage), "
                f"{_bytes(free)} is free: {fix}"
            )
    limit = golden_time.DEFAULT_MAX_SECONDS if max_golden_seconds is None else max_golden_seconds
    seconds = golden_time.estimate_seconds(spec, device)
    if seconds > limit:
        raise CaseTooLarge(
            f"{label} ({shape}{', forward and backward' if spec.backward else ', forward'}) needs about "
            f"{seconds:.3g} s of golden and comparison on {device.type} ({golden_time.work_units(spec):.3g} units "
            f"of work at {golden_time.RATES[device.type]:.3g}/s), over the limit of {limit:g} s: {fix}, or raise "
            "--max-golden-seconds (--fa2-max-golden-seconds in the property suite)"
        )
