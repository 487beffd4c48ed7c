"""The project's own tests: the checker checked.  A package, so that test
kernels are loadable as ``tests.mutants:NAME``."""
