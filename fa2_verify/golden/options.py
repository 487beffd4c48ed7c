"""How the golden is computed: :class:`GoldenOptions` and the choice between its two methods.

``method="mpmath"`` evaluates every output in mpmath (:mod:`golden.mp`);
``method="fast"`` uses the float64 error-free path (:mod:`golden.fast`) and
certifies it on sampled rows against reference rows checked against mpmath (:mod:`golden.certify`);
``method="auto"`` takes mpmath while the case's work
``batch * heads_q * seqlen_q * seqlen_k * head_dim`` is at most
:data:`AUTO_MPMATH_MAX_WORK` and the fast path above it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

from fa2_verify.core.errors import UsageError

METHODS = ("auto", "mpmath", "fast")

#: Fewest bits accepted: the golden must carry more than float64's 53 bits so
#: that rounding its answer to float64 is the last and largest error it makes.
MIN_PRECISION_BITS = 64

#: Largest ``batch*heads_q*seqlen_q*seqlen_k*head_dim`` that ``method="auto"``
#: evaluates entirely in mpmath: about 0.2 s of forward and backward at 113 bits
#: on one CPU core (6 multiply-adds of ~0.7 us per unit of work).
AUTO_MPMATH_MAX_WORK = 2**15

#: Largest work that ``method="auto"`` recomputes in mpmath (about 30 s) when the
#: fast path fails its certification, e.g. on inputs scaled so small that
#: float64's relative accuracy no longer meets the limit; larger cases raise
#: :class:`~core.errors.GoldenError`, a harness error, never a kernel failure.
AUTO_FALLBACK_MAX_WORK = 2**22

#: Directory of the golden cache when ``GoldenOptions.cache_dir`` is None.
CACHE_ENV = "FA2_VERIFY_GOLDEN_CACHE"
#: The golden cache of the CLI and the pytest plugin, under their root, when ``$FA2_VERIFY_GOLDEN_CACHE`` is unset.
DEFAULT_CACHE_DIR = ".fa2-golden-cache"


def shared_cache_dir(root: pathlib.Path) -> pathlib.Path:
    """``$FA2_VERIFY_GOLDEN_CACHE`` if set and non-empty, else ``root / .fa2-golden-cache``: one cache per checkout."""
    chosen = os.environ.get(CACHE_ENV, "")
    return pathlib.Path(chosen) if chosen else root / DEFAULT_CACHE_DIR


@dataclasses.dataclass(frozen=True)
class GoldenOptions:
    """Options of :func:`golden.compute`.

    ``precision_bits``: mpmath working precision (at least 64; 113 is IEEE quad).
    ``method``: ``"auto"``, ``"mpmath"`` or ``"fast"`` (see the module docstring).
    ``certify_rows``: how many query rows, and as many key rows, drawn at random
    (besides the boundary rows), the fast path is checked on against the
    certification's reference rows (at least 1; :mod:`golden.certify`).
    ``cache_dir``: directory of the on-disk golden cache (:mod:`golden.cache`);
    ``None`` means the directory named by the environment variable
    ``FA2_VERIFY_GOLDEN_CACHE``, or no cache when it is unset or empty.
    """

    precision_bits: int = 113
    method: str = "auto"
    certify_rows: int = 32
    cache_dir: pathlib.Path | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.precision_bits) or self.precision_bits < MIN_PRECISION_BITS:
            raise UsageError(
                f"precision_bits={self.precision_bits!r} is too low or not an integer: "
                f"use an integer >= {MIN_PRECISION_BITS} (113 is the default)"
            )
        if self.method not in METHODS:
            raise UsageError(f"method={self.method!r} is not a golden method: use one of {', '.join(METHODS)}")
        if not _is_int(self.certify_rows) or self.certify_rows < 1:
            raise UsageError(
                f"certify_rows={self.certify_rows!r} is not a positive integer: "
                "the fast path is always certified, use certify_rows >= 1"
            )
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)) or not str(self.cache_dir):
                raise UsageError(f"cache_dir={self.cache_dir!r} is not a directory path: pass a pathlib.Path or None")
            object.__setattr__(self, "cache_dir", pathlib.Path(self.cache_dir))

    def resolved_cache_dir(self) -> pathlib.Path | None:
        """``cache_dir``, else ``$FA2_VERIFY_GOLDEN_CACHE`` when set and non-empty, else ``None``."""
        if self.cache_dir is not None:
            return self.cache_dir
        from_env = os.environ.get(CACHE_ENV, "")
        return pathlib.Path(from_env) if from_env else None

    def resolved_method(self, work: int) -> str:
        """``"mpmath"`` or ``"fast"``: the method that serves a case of ``work`` units."""
        if self.method != "auto":
            return self.method
        return "mpmath" if work <= AUTO_MPMATH_MAX_WORK else "fast"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
