"""The kernel benchmark, ``fa2-verify bench`` (also ``python -m fa2_verify.bench``): see :mod:`bench.run`.

Its correctness parts go through :mod:`verify.check`, the product's one
verification path; it has no checker of its own.
"""
