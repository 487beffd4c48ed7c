"""Catalog of value generators: how the entries of q, k, v and dout are drawn.

Each generator is a plain, seeded function so that a case is reproducible from
its spec alone (the gate corpus stores only specs).  Hypothesis strategies in
:mod:`properties` choose a generator name and a seed; they never draw tensor
entries one by one.  Adversarial generators document the bug class they target.

A generator takes the case spec and a :class:`~core.counter_rng.CounterRNG`
and returns float64 tensors ``(q, k, v, dout)`` in contract layout on the
generator's device; the caller rounds them to the case dtype, so the golden
sees exactly what the kernel sees.  The values are the same bits on every
device: the full-size tensors are built on the device from the counter-based
draws with exact or single correctly rounded operations only (a sum over the
head dim in a fixed order, :func:`_channel_sum`; a power of two from its
bits, :func:`_power_of_two`), and whatever needs ``exp``, ``log``, a norm or
a sort, or a division by a number (CUDA multiplies by its reciprocal instead),
is computed on the host on per-row or per-head tensors and then moved.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch

from fa2_verify.core.counter_rng import CounterRNG

if TYPE_CHECKING:
    from fa2_verify.core.case import CaseSpec

#: Version of the values a spec names: 1, torch's CPU generator; 2, :class:`~core.counter_rng.CounterRNG`
#: on the case's device.  Part of the gate corpus's digest (:meth:`verify.corpus.Corpus.digest`).
VALUES_VERSION = 2

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
Generator = Callable[["CaseSpec", CounterRNG], Tensors]

GENERATORS: dict[str, Generator] = {}


def register(name: str) -> Callable[[Generator], Generator]:
    """Decorator adding a generator to :data:`GENERATORS` under ``name``."""

    def add(function: Generator) -> Generator:
        if name in GENERATORS:
            raise ValueError(f"value generator {name!r} is registered twice")
        GENERATORS[name] = function
        return function

    return add


def shapes(spec: "CaseSpec") -> tuple[tuple[int, ...], ...]:
    """Shapes of (q, k, v, dout) in contract layout."""
    q = (spec.batch, spec.seqlen_q, spec.heads_q, spec.head_dim)
    kv = (spec.batch, spec.seqlen_k, spec.heads_kv, spec.head_dim)
    return q, kv, kv, q


def _draw(spec: "CaseSpec", sample: Callable[[tuple[int, ...]], torch.Tensor]) -> Tensors:
    return tuple(sample(shape) for shape in shapes(spec))  # type: ignore[return-value]


@register("normal")
def normal(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Standard normal entries: the usual benign case."""
    return _draw(spec, rng.normal)


@register("uniform")
def uniform(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Uniform on [-1, 1): bounded logits, no outliers."""
    return _draw(spec, lambda shape: rng.uniform(shape, -1.0, 1.0))


#: Float64 temporaries of the size of the largest input that a value generator holds besides its four results
#: (noise, its product with a direction, the channel sums' padded copy, a ``where``'s operands).
GENERATOR_COPIES = 3

#: Largest float64 footprint of a case's draws (:func:`draw_bytes`) drawn on a CUDA device: a larger case is
#: drawn on the host, with the same values, so drawing never holds more of a GPU than this.  A quarter of an
#: 80 GB H100, the ``scale`` profile's budget per example (``properties.profiles.SCALE_MAX_BYTES``): its
#: examples draw on the device (the host's Philox is about 30 times slower than an H100's), and only cases
#: past it, such as the scale set's ``q-over-2^31`` (87 GiB), on the host.
DEVICE_DRAW_BYTES = 20 * 2**30


def draw_bytes(spec: "CaseSpec") -> int:
    """Bytes of float64 that drawing ``spec``'s values holds at once: the four inputs and the temporaries."""
    sizes = [math.prod(shape) for shape in shapes(spec)]
    return 8 * (sum(sizes) + GENERATOR_COPIES * max(sizes))


def draw_device(spec: "CaseSpec", device: str | torch.device) -> torch.device:
    """Where the values of a case on ``device`` are drawn: there, or on the host for a CUDA case whose draws
    exceed :data:`DEVICE_DRAW_BYTES` (the values do not depend on it)."""
    device = torch.device(device)
    return device if device.type != "cuda" or draw_bytes(spec) <= DEVICE_DRAW_BYTES else torch.device("cpu")


def generate(spec: "CaseSpec", device: str | torch.device = "cpu") -> Tensors:
    """Draw the float64 inputs of ``spec`` on ``device`` from its generator and seed (both validated by
    ``CaseSpec``); the same values on every device."""
    return GENERATORS[spec.generator](spec, CounterRNG(spec.seed, device))


# Scaled families and adversarial generators.
#
# The adversarial generators build scores with a designed structure: a unit
# direction ``u`` per (batch, kv head), queries ``q_i = a_i u + n_i`` and keys
# ``k_j = c_j u + m_j``, so that ``softmax_scale * q_i . k_j`` is close to
# ``softmax_scale * a_i * c_j`` (FA2 paper, Algorithm 1 line 8: S = Q K^T).
# Sizes are chosen from the case dtype (torch.finfo), so that every input and
# every exact output stays finite in that dtype: an overflow the golden does
# not have is then always the kernel's.

_FLOAT64 = torch.float64
_HOST = "cpu"


def _finfo(spec: "CaseSpec") -> torch.finfo:
    return torch.finfo(spec.torch_dtype)


def _channel_sum(values: torch.Tensor) -> torch.Tensor:
    """The sum over the last dim (kept, of size 1), pairwise in a fixed order: the same bits on every device."""
    width = 1 << max(values.shape[-1] - 1, 0).bit_length()
    values = torch.nn.functional.pad(values, (0, width - values.shape[-1]))
    while values.shape[-1] > 1:
        half = values.shape[-1] // 2
        values = values[..., :half] + values[..., half:]
    return values


def _power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """``2^exponent`` for integer-valued float64 ``exponent`` in [-1022, 1023], built from its bits (exact)."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(_FLOAT64)


def _directions(spec: "CaseSpec", rng: CounterRNG) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit vectors per (batch, kv head): ``(u_q, u_kv)`` broadcastable against q and k (normalized on the host)."""
    u = rng.normal((spec.batch, 1, spec.heads_kv, spec.head_dim), device=_HOST)
    u = (u / u.norm(dim=-1, keepdim=True).clamp_min(1e-300)).to(rng.device)
    return u.repeat_interleave(spec.heads_q // spec.heads_kv, dim=2), u


def _orthogonal_noise(shape: tuple[int, ...], u: torch.Tensor, rng: CounterRNG) -> torch.Tensor:
    """Standard normal noise with its component along ``u`` removed."""
    noise = rng.normal(shape)
    return noise - _channel_sum(noise * u) * u


def _scaled(base: Generator, factor: float, doc: str) -> Generator:
    def scaled(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
        return tuple(factor * tensor for tensor in base(spec, rng))  # type: ignore[return-value]

    scaled.__doc__ = doc
    return scaled


#: Powers of two the ``normal`` and ``uniform`` families are scaled by.  Small
#: factors make near-uniform softmax rows and tiny outputs; large ones make
#: peaked rows whose scores reach the hundreds.
SCALE_EXPONENTS: tuple[int, ...] = (-8, -4, 2, 3)

for _exponent in SCALE_EXPONENTS:
    for _base_name, _base in (("normal", normal), ("uniform", uniform)):
        register(f"{_base_name}-x2^{_exponent}")(
            _scaled(
                _base,
                2.0**_exponent,
                f"``{_base_name}`` times 2^{_exponent}: the same benign case at another magnitude "
                "(bug class: a hard-coded epsilon or clamp that is only right at unit scale).",
            )
        )


@register("exp-overflow")
def exp_overflow(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Scores whose row maximum lies in [60, 87], just below ln(float32 max) = 88.72.

    Bug class: exponentiating a score without subtracting the running row
    maximum first (FA2 Algorithm 1 line 9 computes exp(S - m)); exp(88.8)
    already overflows float32, and exp(11.1) overflows float16, so such a
    kernel returns inf or NaN here while the golden is finite.
    """
    u_q, u_kv = _directions(spec, rng)
    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    top = rng.uniform((spec.batch, spec.seqlen_q, spec.heads_q, 1), 60.0, 87.0, device=_HOST)
    row_gain = (top / spec.scale).sqrt().to(rng.device)
    key_fraction = rng.uniform((spec.batch, spec.seqlen_k, spec.heads_kv, 1), 0.5, 0.95)
    if spec.seqlen_k:
        peak = rng.integers(spec.seqlen_k, (spec.batch, 1, spec.heads_kv, 1))
        key_fraction.scatter_(1, peak, 1.0)
    key_gain = key_fraction * (87.0 / spec.scale) ** 0.5
    noise = 0.5 / (87.0 / spec.scale) ** 0.5
    q = row_gain * u_q + noise * _orthogonal_noise(q_shape, u_q, rng)
    k = key_gain * u_kv + noise * _orthogonal_noise(k_shape, u_kv, rng)
    v = rng.normal(v_shape)
    dout = rng.normal(dout_shape)
    return q, k, v, dout


@register("dtype-overflow")
def dtype_overflow(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Unscaled scores q.k up to 0.9 of float16's largest value (65504), keys well separated.

    Bug class: keeping S = Q K^T, or the scaled scores, in the input dtype
    before the softmax (FA2 keeps S in float32, Algorithm 1 line 8), or folding
    softmax_scale * log2(e) into q in float16.  Either overflows to inf on
    these inputs.  Keys are 16 to 32 apart in scaled score (less when a tiny
    scale and many keys would leave a key with under half the largest gain),
    far more than the rounding of q and k to float16 moves a score, so a
    correct float32 softmax is well conditioned despite the scores' size.
    """
    u_q, u_kv = _directions(spec, rng)
    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    ceiling = 0.9 * min(torch.finfo(torch.float16).max, _finfo(spec).max)
    row_gain = rng.uniform((spec.batch, spec.seqlen_q, spec.heads_q, 1), 0.5, 1.0) * ceiling**0.5
    rank = rng.uniform((spec.batch, spec.seqlen_k, spec.heads_kv, 1), device=_HOST).argsort(dim=1).to(rng.device)
    step = min(32.0 / (spec.scale * ceiling**0.5), ceiling**0.5 / (2 * max(spec.seqlen_k, 1)))
    key_gain = ceiling**0.5 - step * rank.to(_FLOAT64)
    q = row_gain * u_q
    k = key_gain * u_kv
    v = rng.normal(v_shape)
    dout = rng.normal(dout_shape)
    return q, k, v, dout


#: Binades of the running maximum's rise that ``rescale-storm`` draws, relative to the
#: score level: from 2^0 down to 2^-30, below float32's resolution 2^-24 (and far above
#: float64's 2^-53), so rises that a float32 kernel cannot even resolve occur too.
RESCALE_RISE_BINADES: tuple[int, int] = (-30, 0)


def _orthonormal_pair(spec: "CaseSpec", rng: CounterRNG) -> tuple[torch.Tensor, ...]:
    """``(a_q, a_kv, b_q, b_kv)``: orthonormal ``a``, ``b`` per (batch, kv head), the ``_q`` copies
    repeated over each group's query heads (broadcastable against q, the ``_kv`` ones against k)."""
    first = rng.normal((spec.batch, 1, spec.heads_kv, spec.head_dim), device=_HOST)
    second = rng.normal((spec.batch, 1, spec.heads_kv, spec.head_dim), device=_HOST)
    first = first / first.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    second = second - (second * first).sum(dim=-1, keepdim=True) * first
    second = second / second.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    first, second = first.to(rng.device), second.to(rng.device)
    group = spec.heads_q // spec.heads_kv
    return first.repeat_interleave(group, dim=2), first, second.repeat_interleave(group, dim=2), second


@register("rescale-storm")
def rescale_storm(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Scores rise with every key index, by amounts from ``|level|`` down to ``2^-30 |level|``.

    Row ``i`` scores key ``j`` as ``S_ij = L_i + R_i j / (seqlen_k - 1)``: a level
    ``|L_i|`` in [1, 40] of either sign, and a total rise ``R_i = 2^x |L_i|``
    with ``x`` uniform over :data:`RESCALE_RISE_BINADES` (queries
    ``q_i = (L_i a + R_i b) / scale``, keys ``k_j = a + (j / (seqlen_k - 1)) b``
    for orthonormal ``a``, ``b``).  Every step of the online softmax then finds
    a new maximum and must rescale its accumulators by exp(m_old - m_new) (FA2
    Algorithm 1 lines 9-10): by factors far below 1 on rows with large rises
    and within one rounding of 1 on rows whose rise is below the
    accumulator's resolution.  Bug class: a skipped, doubled or misplaced
    rescale, one applied to only one of the accumulators (O or l), or one
    skipped when the rise looks negligible (exp(-x) taken as 1 for small x),
    which is wrong by about x in every row where it happens.
    """
    a_q, a_kv, b_q, b_kv = _orthonormal_pair(spec, rng)
    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    ramp = (torch.arange(spec.seqlen_k, dtype=_FLOAT64) / max(spec.seqlen_k - 1, 1)).to(rng.device)
    k = a_kv + ramp.view(1, -1, 1, 1) * b_kv
    row_shape = (spec.batch, spec.seqlen_q, spec.heads_q, 1)
    sign = rng.integers(2, row_shape, device=_HOST).to(_FLOAT64) * 2 - 1
    level = sign * rng.uniform(row_shape, 1.0, 40.0, device=_HOST)
    rise = level.abs() * torch.exp2(rng.uniform(row_shape, *RESCALE_RISE_BINADES, device=_HOST))
    noise = _orthogonal_noise(q_shape, a_q, rng)
    noise = noise - _channel_sum(noise * b_q) * b_q
    q = (level / spec.scale).to(rng.device) * a_q + (rise / spec.scale).to(rng.device) * b_q + 0.25 * noise
    v = rng.normal(v_shape)
    dout = rng.normal(dout_shape)
    return q, k, v, dout


@register("exact-ties")
def exact_ties(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Many keys with bit-identical scores: keys repeat one or two rows of small integers.

    q and k hold integers in [-2, 2] (exact in every dtype), keys are copies of
    at most two distinct rows, and a quarter of the query rows are zero, which
    makes all their scores equal.  Bug class: max or argmax logic that treats
    equal scores specially (a strict comparison that skips the update, a
    tie-break that drops a key), and kernels that count keys instead of
    summing their weights.
    """
    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    q = (rng.integers(5, q_shape) - 2).to(_FLOAT64)
    q = q * ~rng.bernoulli(0.25, q_shape[:-1] + (1,))
    pool = (rng.integers(5, (spec.batch, 2, spec.heads_kv, spec.head_dim)) - 2).to(_FLOAT64)
    pick = rng.integers(2, (spec.batch, spec.seqlen_k, spec.heads_kv, 1))
    k = torch.gather(pool, 1, pick.expand(k_shape))
    v = rng.normal(v_shape)
    dout = rng.normal(dout_shape)
    return q, k, v, dout


@register("dominant-key")
def dominant_key(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """One key per (batch, kv head) scores 10 to 60 above every other key of the row.

    Softmax rows are then one-hot up to e^-10 .. e^-60, which underflows in
    float16.  The dominant key sits at a random position (often in a late key
    block, so the accumulated O must be rescaled to almost nothing).
    Bug class: a wrong rescale when the maximum jumps (FA2 Algorithm 1 line
    10), normalisation by a stale l, and backward cancellation in
    dS = P (dP - D) when P is nearly one-hot.
    """
    u_q, u_kv = _directions(spec, rng)
    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    q = u_q + 0.2 * _orthogonal_noise(q_shape, u_q, rng)
    k = 0.5 * rng.normal(k_shape)
    if spec.seqlen_k:
        gap = rng.uniform((spec.batch, 1, spec.heads_kv, 1), 10.0, 60.0, device=_HOST)
        position = rng.integers(spec.seqlen_k, (spec.batch, 1, spec.heads_kv, 1))
        k.scatter_(1, position.expand(-1, -1, -1, spec.head_dim), (gap / spec.scale).to(rng.device) * u_kv)
    v = rng.normal(v_shape)
    dout = rng.normal(dout_shape)
    return q, k, v, dout


@register("v-dynamic-range")
def v_dynamic_range(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """V entries ``±2^e`` with ``e`` spread over 2^20 (float16) or 2^80 (wider dtypes).

    The exponent range is kept small enough that dP = dO V^T and the exact
    gradients stay finite in the dtype.  Bug class: accumulating P V in the
    input dtype, normalising O by l before the sum is complete, or an error
    that is only visible relative to the large entries of V (FA2 Algorithm 1
    line 10, O = diag(e^(m_old - m_new)) O + P V).
    """
    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    low, high = (-14.0, 6.0) if _finfo(spec).max < 1e5 else (-40.0, 40.0)
    exponent = rng.uniform(v_shape, low, high).floor()
    sign = rng.integers(2, v_shape).to(_FLOAT64) * 2 - 1
    mantissa = rng.uniform(v_shape, 1.0, 2.0)
    v = sign * mantissa * _power_of_two(exponent)
    q = rng.normal(q_shape)
    k = rng.normal(k_shape)
    dout = rng.normal(dout_shape)
    return q, k, v, dout


@register("subnormals")
def subnormals(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Half of all q, k, v, dout entries are subnormal in the dtype, the rest normal.

    Some V rows are entirely subnormal, so whole output rows are tiny.
    Bug class: flushing subnormal float16 inputs or results to zero (FTZ/DAZ),
    which loses those rows and their gradients entirely, and scale factors
    computed from a row's magnitude that divide by zero.  (Below float32's
    smallest normal, 2^-126, the error model allows flushing, as GPU float32
    arithmetic does: docs/error-model.md, "Underflow in the float32
    accumulation".)
    """
    info = _finfo(spec)
    tiny = info.tiny

    def sample(shape: tuple[int, ...]) -> torch.Tensor:
        normal_entries = rng.normal(shape)
        subnormal_entries = rng.uniform(shape, -1.0, 1.0) * tiny
        use_subnormal = rng.bernoulli(0.5, shape)
        return torch.where(use_subnormal, subnormal_entries, normal_entries)

    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    v = sample(v_shape)
    tiny_rows = rng.bernoulli(0.25, v_shape[:-1] + (1,))
    v = torch.where(tiny_rows, rng.uniform(v_shape, -1.0, 1.0) * tiny, v)
    return sample(q_shape), sample(k_shape), v, sample(dout_shape)


@register("dp-cancellation")
def dp_cancellation(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """dO and V chosen so that dP_ij = dO_i . V_j is nearly the same for every key.

    V rows are a common vector ``w`` plus a relative perturbation of 2^-9 to
    2^-4, and dO rows are nearly parallel to ``w``; then D_i = rowsum(dO_i * O_i)
    = sum_j P_ij dP_ij matches every dP_ij to several digits and
    dS = P (dP - D) (FA2 Algorithm 2, lines 19-20) is a catastrophic
    cancellation.  Bug class: D computed in low precision, from a different O
    than the forward returned, or with the wrong sign or scale.
    """
    u_q, u_kv = _directions(spec, rng)
    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    common = 4.0 * u_kv
    spread = torch.exp2(rng.uniform((spec.batch, 1, spec.heads_kv, 1), -9.0, -4.0, device=_HOST)).to(rng.device)
    v = common + 4.0 * spread * rng.normal(v_shape)
    dout = 2.0 * u_q + 0.05 * _orthogonal_noise(dout_shape, u_q, rng)
    q = rng.normal(q_shape)
    k = rng.normal(k_shape)
    return q, k, v, dout


#: Binades of the score level that ``score-plateau`` draws: rows at -2^3 to -2^8, so that
#: both float16's exp underflow (below -17.3, float16's smallest subnormal 2^-24) and
#: float32's (below -87.3 normal, -103.3 subnormal) lie inside the range.
PLATEAU_LEVEL_BINADES: tuple[int, int] = (3, 8)

#: Standard deviation of the scores around their level in a ``score-plateau`` row with a spread:
#: small against the level, large enough that the keys' weights differ.
PLATEAU_SPREAD = 0.25


@register("score-plateau")
def score_plateau(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Every score of query row ``i`` lies at or near one negative level ``c_i = -2^x``, ``x`` uniform
    over :data:`PLATEAU_LEVEL_BINADES`.

    Queries ``q_i = (c_i / scale) a`` plus noise orthogonal to ``a``, keys ``k_j = a`` plus noise
    orthogonal to ``a``, per (batch, kv head).  Half of the (batch, kv head) pairs take a random unit
    ``a`` and key noise giving each row a spread of about :data:`PLATEAU_SPREAD`; the other half take a
    signed basis vector ``a`` (exact in every dtype) and no key noise, so that every score of a row is
    the same number: an exact tie at a low level.  Softmax does not change when a whole row shifts, so
    each row's weights stay nearly (or exactly) uniform whatever its level, and ``L_i`` is about
    ``c_i + ln(seqlen_k)``; only the reference point of the exponentials must follow.  FA2 Algorithm 1
    starts the running max at -inf (line 5) and exponentiates against it (line 9); Algorithm 2
    recomputes ``P = exp(S - L)`` (line 11).  Bug class: a running max started at 0, at a finite
    floor, or clamped (``exp(S - max(m, 0))`` underflows to 0 for a whole row once ``c_i`` is below
    -87 in float32, so ``l = 0`` and the row is NaN or 0); a backward that exponentiates scores
    without the row's LSE as reference; cuDNN's float16 backward, which returns NaN gradients for rows
    whose scores are all one value at -16 or lower (docs/targets.md).  Other generators reach such
    rows rarely: ``normal`` rows straddle 0, ``rescale-storm``'s levels stop at -40 and
    ``exact-ties``' scores are small integers.
    """
    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    group = spec.heads_q // spec.heads_kv
    pair_shape = (spec.batch, 1, spec.heads_kv, 1)
    random_a = _directions(spec, rng)[1]
    axis = rng.integers(spec.head_dim, pair_shape)
    sign = rng.integers(2, pair_shape).to(_FLOAT64) * 2 - 1
    basis_a = sign * torch.nn.functional.one_hot(axis, spec.head_dim).to(_FLOAT64).squeeze(-2)
    tied = rng.bernoulli(0.5, pair_shape)
    a_kv = torch.where(tied, basis_a, random_a)
    a_q = a_kv.repeat_interleave(group, dim=2)
    binades = rng.uniform((spec.batch, spec.seqlen_q, spec.heads_q, 1), *PLATEAU_LEVEL_BINADES, device=_HOST)
    level = -torch.exp2(binades)
    q = (level / spec.scale).to(rng.device) * a_q + _orthogonal_noise(q_shape, a_q, rng)
    k_noise = (~tied).to(_FLOAT64) * (PLATEAU_SPREAD / (spec.scale * spec.head_dim**0.5))
    k = a_kv + k_noise * _orthogonal_noise(k_shape, a_kv, rng)
    v = rng.normal(v_shape)
    dout = rng.normal(dout_shape)
    return q, k, v, dout


#: Key and row indices where kernels break: 16- and 17-bit index limits, the tile edges of 64 and 128.
INDEX_LIMITS: tuple[int, ...] = (1 << 16, (1 << 16) - 1, (1 << 16) + 1, (1 << 17) - 1, 1 << 17)
TILE_EDGES: tuple[int, ...] = (63, 64, 127, 128)
TILES: tuple[int, ...] = (64, 128)

#: How far a ``boundary-keys`` row's dominant score lies above ``ln(seqlen_k)``: the row's other keys
#: (standard normal scores, at most about 5 above 0 among 2^17 keys) then carry below ``e^-10`` of its weight.
BOUNDARY_MARGIN = 15.0


def _index_past(limit: int, length: int, batch: int, row_elements: int) -> list[int]:
    """The index, within its batch, of the first row whose element offset ``row * row_elements`` in the
    (batch * length)-row tensor reaches ``limit`` (none if the tensor ends first)."""
    first = -(-limit // row_elements)
    return [first % length] if first < batch * length else []


def boundary_indices(spec: "CaseSpec") -> tuple[list[int], list[int]]:
    """``(keys, rows)``: the key and query indices of ``spec`` that ``boundary-keys`` targets, most important first.

    Keys: the last key, the 16- and 17-bit limits (:data:`INDEX_LIMITS`), the key of the last batch whose
    element offset in k (over all batches) reaches 2^31, the first key of the last key tile (:data:`TILES`), the first key
    and the tile edges (:data:`TILE_EDGES`).  Rows: the last and the first row, the first row of the last
    query tile, the tile edges, the limits, and the row whose offset in q reaches 2^31 (in whichever batch).
    Only indices inside the sequence, each once.
    """
    def unique(indices: list[int], length: int) -> list[int]:
        return list(dict.fromkeys(index for index in indices if 0 <= index < length))

    keys = [spec.seqlen_k - 1, *INDEX_LIMITS]
    keys += _index_past(1 << 31, spec.seqlen_k, spec.batch, spec.heads_kv * spec.head_dim)
    keys += [(spec.seqlen_k - 1) // tile * tile for tile in TILES] + [0, *TILE_EDGES]
    rows = [spec.seqlen_q - 1, 0] + [(spec.seqlen_q - 1) // tile * tile for tile in TILES]
    rows += [*TILE_EDGES, *INDEX_LIMITS]
    rows += _index_past(1 << 31, spec.seqlen_q, spec.batch, spec.heads_q * spec.head_dim)
    return unique(keys, spec.seqlen_k), unique(rows, spec.seqlen_q)


def boundary_pairs(spec: "CaseSpec") -> list[tuple[int, int]]:
    """``(row, key)`` pairs of ``boundary-keys``: each row is dominated by the one key of its pair.

    Every boundary key (:func:`boundary_indices`) gets a row of its own that sees it under the case's
    mask, a boundary row if one is left, else the first row left that does; every boundary row left
    then gets the most important boundary key it sees.  At most ``head_dim // 2`` distinct keys (one
    feature channel each).
    """
    keys, rows = boundary_indices(spec)
    first, last = spec.visible_ranges("cpu")

    def sees(row: int, key: int) -> bool:
        return bool(first[row] <= key <= last[row])

    keys = keys[: spec.head_dim // 2]
    pairs: dict[int, int] = {}
    for key in keys:
        seeing = [row for row in rows if row not in pairs and sees(row, key)]
        seeing += [row for row in torch.nonzero((first <= key) & (last >= key)).flatten()[: len(pairs) + 1].tolist()
                   if row not in pairs]
        if seeing:
            pairs[seeing[0]] = key
    for row in rows:
        if row not in pairs:
            visible = [key for key in keys if sees(row, key)]
            if visible:
                pairs[row] = visible[0]
    return sorted(pairs.items())


@register("boundary-keys")
def boundary_keys(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Standard normal entries, except that each boundary row's softmax is one boundary key
    (:func:`boundary_pairs`): the last key, keys 2^16 - 1 to 2^17, a key whose offset passes 2^31,
    the first key of the last tile, in the last, first, tile-edge and offset-past-2^31 rows.

    Each paired key gets a feature channel of its own (the last ``head_dim // 2`` channels, zero in
    every other q and k): ``k_t`` is ``a`` on its channel and 0 elsewhere, row ``r`` paired with it
    keeps its normal q and adds ``a`` on that channel, so ``S_rt = scale a^2 = ln(seqlen_k) +``
    :data:`BOUNDARY_MARGIN` and the row's output is ``V_t`` to ``e^-10``.  Under ``normal`` values a
    key carries ``1/seqlen_k`` of its row's weight, so a kernel that never visits key 65,536, or
    leaves the last query tile stale, errs by ``1/65,537`` of a row's spread, below the rounding
    bound; here it errs by a whole ``|V_t - O_r|``.  Bug class: 16-bit key or block indices, 32-bit
    offsets that wrap, a last key tile or query tile not visited or not written (FA2 Algorithm 1,
    the loops of lines 3 and 6 and the write of line 12).
    """
    q, k, v, dout = normal(spec, rng)
    pairs = boundary_pairs(spec)
    if not pairs:
        return q, k, v, dout
    keys = list(dict.fromkeys(key for _, key in pairs))
    channel = {key: spec.head_dim - 1 - index for index, key in enumerate(keys)}
    channels = list(channel.values())
    q[..., channels] = 0.0
    k[..., channels] = 0.0
    logit = math.log(max(spec.seqlen_k, 2)) + BOUNDARY_MARGIN
    size = min(math.sqrt(logit / spec.scale), math.sqrt(_finfo(spec).max) / 4)
    for key in keys:
        k[:, key] = 0.0
        k[:, key, :, channel[key]] = size
    for row, key in pairs:
        q[:, row, :, channel[key]] = size
    return q, k, v, dout


#: Magnitudes of a ``far-below-zero`` row's level, drawn log-uniform: from just past -ln(float32 max) =
#: -88.7 (below it exp(-LSE) overflows float32) down to -10^6, far past the finite sentinels kernels
#: use for -inf (-1e4, -5e4).
FAR_LEVELS: tuple[float, float] = (90.0, 1e6)

#: Share of a ``far-below-zero`` case's rows at an ordinary level (uniform on -2 .. 2) instead.
FAR_ORDINARY_ROWS = 0.25

#: How much a ``far-below-zero`` level per unit of the key gain ``g`` leaves below the dtype's largest
#: value: ``|c| / g <= max / FAR_GRADIENT_HEADROOM``, so that ``dK = scale dS^T Q``, whose component
#: along the keys' direction is ``sum_i dS_ij c_i / g``, stays finite however many rows add to it.
FAR_GRADIENT_HEADROOM = 1024.0


def far_level_reach(spec: "CaseSpec") -> tuple[float, float]:
    """``(reach, g)``: the deepest level magnitude ``far-below-zero`` draws for ``spec`` and the key gain.

    Keys carry ``g`` (a power of two, at most half the dtype's largest value) along a basis vector,
    queries ``c / (scale g)`` (at most a quarter of it), so ``reach = min(10^6, scale g max / 4)``:
    float16 (``g = 2^14``) reaches -10^6 for ``softmax_scale >= 2^-8`` and ``2.7e8 scale`` below
    that; bfloat16, float32 and float64 (``g = 1``) always reach -10^6.
    """
    largest = _finfo(spec).max
    needed = FAR_GRADIENT_HEADROOM * FAR_LEVELS[1] / largest
    gain = min(2.0 ** math.ceil(math.log2(max(needed, 1.0))), 2.0 ** math.floor(math.log2(largest / 2)))
    return min(FAR_LEVELS[1], spec.scale * gain * largest / 4), gain


@register("far-below-zero")
def far_below_zero(spec: "CaseSpec", rng: CounterRNG) -> Tensors:
    """Three rows in four see every score at one level ``c_i`` from about -90 down to -10^6
    (:data:`FAR_LEVELS`, log-uniform, within :func:`far_level_reach`), the others an ordinary level.

    Per (batch, kv head) a signed basis vector ``a`` (exact in every dtype): keys ``k_j = g a`` plus,
    on half of the pairs, noise orthogonal to ``a`` giving each row a spread of about
    :data:`PLATEAU_SPREAD` (on the other half every score of a row is the same number), queries
    ``q_i = c_i / (scale g) a`` plus noise orthogonal to ``a``, as in cuDNN's and FlashInfer's
    reproductions (pytorch #196678, flashinfer #4267).  Ordinary rows (:data:`FAR_ORDINARY_ROWS`) sit
    at ``c_i`` uniform on [-2, 2] with eight times the spread.  In 16-bit dtypes the rounding of
    ``q_i`` moves a far row's scores by about ``2^-11 |c_i|`` (float16) or ``2^-8 |c_i|`` (bfloat16),
    so such rows are often dominated by one key; they stay far below zero.  Under a causal mask or a
    window beside ``seqlen_q > seqlen_k`` (:mod:`properties.masks`), rows that see one key or none sit
    next to them.  Bug class: a running max started at a finite "-inf" (FlashInfer's -5e4: a row
    whose scores all lie below it returns 0 and the sentinel as its LSE) or masked scores set to a
    finite value (-1e4, -5e4: a fully masked row gets a finite LSE, a masked key outweighs a visible
    one at -2e4); a backward whose ``exp(S - LSE)`` overflows once ``LSE < -ln(FLT_MAX) = -88.7``
    (cuDNN's unmasked key tail, ``exp(0 - LSE) = inf`` times a zero key gives NaN in dQ); FA2
    Algorithm 1 line 5 starts the running max at -inf and Algorithm 2 line 11 recomputes
    ``P = exp(S - L)``.  ``score-plateau`` stops at -256.
    """
    q_shape, k_shape, v_shape, dout_shape = shapes(spec)
    group = spec.heads_q // spec.heads_kv
    pair_shape = (spec.batch, 1, spec.heads_kv, 1)
    row_shape = (spec.batch, spec.seqlen_q, spec.heads_q, 1)
    reach, gain = far_level_reach(spec)
    axis = rng.integers(spec.head_dim, pair_shape)
    sign = rng.integers(2, pair_shape).to(_FLOAT64) * 2 - 1
    a_kv = sign * torch.nn.functional.one_hot(axis, spec.head_dim).to(_FLOAT64).squeeze(-2)
    a_q = a_kv.repeat_interleave(group, dim=2)
    high = math.log(reach)
    low = min(math.log(FAR_LEVELS[0]), high)
    far = -torch.exp(rng.uniform(row_shape, low, high, device=_HOST))
    ordinary = rng.bernoulli(FAR_ORDINARY_ROWS, row_shape, device=_HOST)
    level = torch.where(ordinary, rng.uniform(row_shape, -2.0, 2.0, device=_HOST), far)
    noise = torch.where(ordinary, 8.0, 1.0).to(rng.device)
    q = (level / (spec.scale * gain)).to(rng.device) * a_q + noise * _orthogonal_noise(q_shape, a_q, rng)
    spread = rng.bernoulli(0.5, pair_shape).to(_FLOAT64) * (PLATEAU_SPREAD / (spec.scale * spec.head_dim**0.5))
    k = gain * a_kv + spread * _orthogonal_noise(k_shape, a_kv, rng)
    v = rng.normal(v_shape)
    dout = rng.normal(dout_shape)
    return q, k, v, dout
