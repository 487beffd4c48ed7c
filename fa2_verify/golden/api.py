"""``golden.compute``: the high-precision expected outputs of one attention case."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import cast

import torch

from fa2_verify.golden import cache, certify, fast, mp
from fa2_verify.golden.inputs import HeadMajorInputs, fingerprint, prepare, to_contract
from fa2_verify.golden.options import AUTO_FALLBACK_MAX_WORK, GoldenOptions
from fa2_verify.core.contract import BOTTOM_RIGHT, effective_window
from fa2_verify.core.errors import GoldenError, UsageError

OUTPUTS = ("out", "lse", "dq", "dk", "dv")

#: The largest ``certified_bound`` a golden of each method may claim: mpmath is exact, and the fast path is
#: certified to :data:`golden.certify.LIMIT` (2**-40 relative) or refused.  Nothing larger is accepted, from
#: the cache or elsewhere, so no golden widens the error model's bounds (docs/error-model.md, (11)) by more
#: than a fresh computation could.
MAX_CERTIFIED_BOUND = {"mpmath": 0.0, "fast": certify.LIMIT}


@dataclasses.dataclass(frozen=True)
class GoldenResult:
    """Expected outputs, float64 tensors on the golden's device, never rounded to the kernel's dtype.

    The device is the inputs' CUDA device when ``q`` is on CUDA, else the CPU
    (:func:`golden.inputs.golden_device`).

    ``out``, ``dq``: q's shape; ``dk``, ``dv``: k's shape; ``lse``, ``delta``:
    (batch, heads_q, seqlen_q), ``lse = -inf`` on rows that see no key.
    ``delta = rowsum(dout * out)``.  The backward fields are ``None`` when no
    ``dout`` was given.  ``method`` is ``"mpmath"`` or ``"fast"``;
    ``certified_bound[name]`` is, for the fast path, the largest
    ``|fast - mpmath|`` on the sampled rows over the largest ``|mpmath| + M``
    there, ``M`` being the magnitude of the terms the element sums
    (:mod:`golden.certify`); it is 0.0 for mpmath.  It never exceeds
    :data:`MAX_CERTIFIED_BOUND` (:func:`require_certified_bound`).
    """

    out: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor | None
    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None
    method: str
    certified_bound: dict[str, float]


def compute(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor | None = None,
    *,
    softmax_scale: float,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    alignment: str = BOTTOM_RIGHT,
    options: GoldenOptions = GoldenOptions(),
) -> GoldenResult:
    """The golden of one case, taking the kernel's inputs exactly.

    With ``S = softmax_scale * q k^T`` over the visible keys (causal/window
    mask aligned as ``alignment`` says, bottom-right unless ``"top_left"``,
    :func:`core.contract.visible_mask`) and
    query head ``h`` reading kv head ``h // (heads_q // heads_kv)``
    (Dao 2023, "FlashAttention-2", Algorithm 1 forward, Algorithm 2 backward):

        LSE = log rowsum(exp S),  P = exp(S - LSE),  out = P v,
        D = rowsum(dout o out),   dP = dout v^T,     dS = P o (dP - D),
        dq = scale dS k,          dk = scale dS^T q, dv = P^T dout,

    ``dk``/``dv`` summed over the query heads that share a kv head.  A row that
    sees no key has ``out = 0``, ``dq = 0``, ``lse = -inf``.  ``q``, ``k``, ``v``,
    ``dout`` are contract-layout tensors of any float dtype and device.
    ``options.method`` picks mpmath (:mod:`golden.mp`) or the certified fast path
    (:mod:`golden.fast`, :mod:`golden.certify`); ``"auto"`` falls back to mpmath
    when the fast path fails certification on a case of at most
    ``AUTO_FALLBACK_MAX_WORK``; results are read from and
    written to the cache (:mod:`golden.cache`) when ``options.resolved_cache_dir()``
    names one and the outputs fit its limit (:func:`golden.cache.fits`).
    """
    if not isinstance(options, GoldenOptions):
        raise UsageError(f"options={options!r} is not a GoldenOptions: pass golden.GoldenOptions(...)")
    problem = prepare(
        q, k, v, dout, softmax_scale=softmax_scale, causal=causal, window_size=window_size, alignment=alignment
    )
    method = options.resolved_method(problem.work)
    shapes = _shapes(problem)
    cache_dir = options.resolved_cache_dir()
    if cache_dir is not None and not cache.fits(shapes, problem.device.type):
        cache_dir = None
    entry_key = _key(problem, options, method) if cache_dir is not None else ""
    names = {name for name in OUTPUTS if name in shapes}
    check_meta = lambda meta: _cached_meta_problem(meta, names)
    stored = cache.load(cache_dir, entry_key, shapes, check_meta) if cache_dir is not None else None
    if stored is not None:
        arrays, meta = stored
        tensors = {name: torch.from_numpy(array).to(problem.device) for name, array in arrays.items()}
        return _result(tensors, meta["method"], meta["certified_bound"])
    if method == "mpmath":
        tensors, bounds = _mpmath(problem, options)
    else:
        served = fast.attention(problem)
        try:
            bounds = certify.certify(
                problem, served, rows=options.certify_rows, precision_bits=options.precision_bits,
                seed=fingerprint(problem),
            )
            tensors = {name: getattr(served, name) for name in shapes}
        except GoldenError:
            if options.method != "auto" or problem.work > AUTO_FALLBACK_MAX_WORK:
                raise
            method = "mpmath"
            tensors, bounds = _mpmath(problem, options)
    require_certified_bound(bounds, method)
    if cache_dir is not None:
        arrays = {name: tensor.cpu().numpy() for name, tensor in tensors.items()}
        cache.store(cache_dir, entry_key, arrays, {"method": method, "certified_bound": bounds})
    return _result(tensors, method, bounds)


def certified_bound_problem(bounds: Mapping[str, object], method: str = "fast") -> str | None:
    """What makes ``bounds`` a ``certified_bound`` no golden of ``method`` can claim, or ``None``.

    Each value must be a number (not a bool or a string) from 0 to ``MAX_CERTIFIED_BOUND[method]``: a
    negative, NaN or infinite one is refused, as is one above the cap.
    """
    cap = MAX_CERTIFIED_BOUND[method]
    for name, value in bounds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= cap:
            return f"certified_bound[{name!r}]={value!r:.40} is not a number from 0 to {cap:.3g} (method {method!r})"
    return None


def require_certified_bound(bounds: Mapping[str, object], method: str = "fast") -> None:
    """Raise ``GoldenError`` where :func:`certified_bound_problem` finds one: a golden that fails its guarantee."""
    problem = certified_bound_problem(bounds, method)
    if problem is not None:
        raise GoldenError(
            f"the golden's {problem}: it fails its own guarantee; compute this case with GoldenOptions(method='mpmath')"
        )


def _cached_meta_problem(meta: object, names: set[str]) -> str | None:
    """What makes a cache entry's ``meta`` one that ``compute`` could not have written for outputs ``names``."""
    if not isinstance(meta, dict) or set(meta) != {"method", "certified_bound"}:
        return "its meta is not a JSON object of method and certified_bound"
    method, bounds = meta["method"], meta["certified_bound"]
    if not isinstance(method, str) or method not in MAX_CERTIFIED_BOUND:
        return f"its method {method!r:.40} is none of {sorted(MAX_CERTIFIED_BOUND)}"
    if not isinstance(bounds, dict) or set(bounds) != names:
        return f"its certified_bound is not a JSON object of {sorted(names)}"
    return certified_bound_problem(bounds, method)


def _mpmath(problem: HeadMajorInputs, options: GoldenOptions) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Every output in mpmath (:mod:`golden.mp`), as head-major tensors on the problem's device."""
    arrays = {name: a for name, a in mp.attention(problem, options.precision_bits).items() if a is not None}
    tensors = {name: torch.from_numpy(array).to(problem.device) for name, array in arrays.items()}
    return tensors, {name: 0.0 for name in OUTPUTS if name in arrays}


def _key(problem: HeadMajorInputs, options: GoldenOptions, method: str) -> str:
    """The cache key: a sha256 of the inputs and options."""
    tensors = {name: problem.host(name) if getattr(problem, name) is not None else None for name in ("q", "k", "v", "dout")}
    dtypes = dict(zip(("q", "k", "v", "dout"), problem.dtypes))
    settings = {
        "softmax_scale": problem.scale.hex(),
        "window": list(effective_window(problem.causal, problem.window_size)),
        "precision_bits": options.precision_bits,
        "method": method,
        "certify_rows": options.certify_rows if method == "fast" else None,
    }
    if problem.alignment != BOTTOM_RIGHT:  # keys of bottom-right cases stay those cached before alignments existed
        settings["alignment"] = problem.alignment
    return cache.key({name: (dtypes[name], t) if t is not None else None for name, t in tensors.items()}, settings)


def _shapes(problem: HeadMajorInputs) -> dict[str, tuple[int, ...]]:
    rows = problem.q.shape[:3]
    shapes: dict[str, tuple[int, ...]] = {"out": problem.q.shape, "lse": rows}
    if problem.dout is not None:
        shapes.update(delta=rows, dq=problem.q.shape, dk=problem.k.shape, dv=problem.v.shape)
    return shapes


def _result(tensors: dict[str, torch.Tensor], method: str, bounds: dict[str, float]) -> GoldenResult:
    def tensor(name: str) -> torch.Tensor | None:
        if name not in tensors:
            return None
        value = tensors[name]
        return to_contract(value) if value.dim() == 4 else value.contiguous()

    return GoldenResult(
        out=cast(torch.Tensor, tensor("out")),  # every method computes out and lse
        lse=cast(torch.Tensor, tensor("lse")),
        delta=tensor("delta"),
        dq=tensor("dq"),
        dk=tensor("dk"),
        dv=tensor("dv"),
        method=method,
        certified_bound={name: float(bounds[name]) for name in OUTPUTS if name in bounds},
    )
