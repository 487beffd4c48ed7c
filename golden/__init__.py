"""mpmath high-precision golden attention (forward and backward), its certified fast path and cache.

Public API: :class:`GoldenOptions`, :func:`compute`, :class:`GoldenResult`.
"""

from golden.api import GoldenResult, compute
from golden.options import GoldenOptions

__all__ = ["GoldenOptions", "GoldenResult", "compute"]
