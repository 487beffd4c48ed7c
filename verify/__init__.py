"""fa2-verify: numerical-correctness verification for FlashAttention-2 kernels.

The service side: CLI, pytest plugin support, kernel registry, error metrics,
the error model, reports, baselines and the gate.  Importing it is cheap.
"""

__version__ = "0.1.0"
