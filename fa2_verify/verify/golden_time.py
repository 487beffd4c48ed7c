"""The time guard: a case's golden and comparison seconds, estimated from its spec before anything runs.

The memory guard (:func:`verify.memory.require_fits`) knows bytes, not
seconds: a case of 10^7 x 10^7 tokens with small heads fits in memory and
would keep the golden busy for weeks.  The golden (:mod:`golden.fast`) and
the comparison (the error model, the metrics) cost time in proportion to the
case's *work*, ``batch * heads_q * visible (query, key) pairs * head_dim``
(:func:`visible_pairs`), once for the forward and about twice more for the
backward (its dQ, dK, dV and dP products): :func:`work_units`.  The estimate
is ``work_units / RATES[device type]``; the size guard
(:func:`verify.memory.require_fits`) refuses a case whose estimate is over the
limit (``--max-golden-seconds``, the plugin's ``--fa2-max-golden-seconds``;
default :data:`DEFAULT_MAX_SECONDS`) in one line with the estimate.

The rates are measured constants, rounded up so that the estimate stays
below the true time on a faster host (the guard refuses only a case that
surely takes longer; the certification's mpmath rows and per-row costs are
left out, which also errs low):

* ``cpu``: golden plus comparison, forward and backward, of
  ``verify.check.check_case`` on this project's 2-vCPU AMD EPYC (one thread,
  load average 5): 1.8e8 units/s at (1, 2, 1024, 64) float16, 1.3e8 forward
  only, 1.0e8 at (1, 1, 512 x 2048, 128) bfloat16 causal; taken as 5e8.
* ``cuda``: the golden plus comparison of ``s16384-none-fp16`` (1, 16, 16384,
  128), forward and backward, took 2.96 + 2.84 s on an H100 (docs/benchmarks.md,
  "The scale set's six long cases"): 2.8e11 units/s; taken as 4e11.
"""

from __future__ import annotations

import argparse
import math

import torch

from fa2_verify.core.case import CaseSpec
from fa2_verify.core.contract import UNBOUNDED, effective_window

#: Work units per second of the golden and the comparison, per device type (module docstring).
RATES: dict[str, float] = {"cpu": 5e8, "cuda": 4e11}

#: Work of a forward and backward in units of the forward's work.
BACKWARD_FACTOR = 3

#: Default limit on the estimated golden and comparison seconds of one case.
DEFAULT_MAX_SECONDS = 600.0


def _clamped_sum(count: int, offset: int, low: int, high: int) -> int:
    """``sum(min(max(i + offset, low), high) for i in range(count))`` in closed form (``low <= high``)."""
    rising = min(max(low - offset, 0), count)  # first i with i + offset >= low
    flat = min(max(high - offset + 1, rising), count)  # first i with i + offset > high
    linear = (flat - rising) * offset + (flat - rising) * (rising + flat - 1) // 2
    return low * rising + linear + high * (count - flat)


def visible_pairs(spec: CaseSpec) -> int:
    """The (query, key) pairs the mask leaves visible in one (batch, head): ``seqlen_q * seqlen_k`` without a
    mask, counted row by row in closed form otherwise (bottom-right aligned: row ``i`` sees keys
    ``i + seqlen_k - seqlen_q - left`` to ``i + seqlen_k - seqlen_q + right``, clipped to the keys)."""
    rows, keys = spec.seqlen_q, spec.seqlen_k
    if not rows or not keys:
        return 0
    left, right = effective_window(spec.causal, spec.window_size)
    shift = keys - rows
    last = _clamped_sum(rows, shift + right, -1, keys - 1) if right != UNBOUNDED else rows * (keys - 1)
    first = _clamped_sum(rows, shift - left, 0, keys - 1) if left != UNBOUNDED else 0
    return last + rows - first


def work_units(spec: CaseSpec) -> int:
    """``batch * heads_q * visible_pairs * head_dim``, times :data:`BACKWARD_FACTOR` with a backward."""
    work = spec.batch * spec.heads_q * visible_pairs(spec) * spec.head_dim
    return work * (BACKWARD_FACTOR if spec.backward else 1)


def estimate_seconds(spec: CaseSpec, device: str | torch.device) -> float:
    """The golden and comparison seconds of ``spec`` on ``device`` (the module docstring has the model)."""
    return work_units(spec) / RATES[torch.device(device).type]


def positive_seconds(text: str) -> float:
    """A limit in seconds from the command line (``--max-golden-seconds``): a finite number > 0, else
    :class:`argparse.ArgumentTypeError` (argparse, and the plugin, print it as a one-line usage error)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value
