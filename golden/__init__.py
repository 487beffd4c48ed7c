"""mpmath high-precision golden attention (forward and backward), its certified fast path and cache."""
