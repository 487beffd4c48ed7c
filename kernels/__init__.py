"""Bundled attention kernels and adapters, all implementing the contract in
:mod:`kernels.contract`.  Importing this package is cheap: no kernel module is
imported until the registry (:mod:`verify.registry`) asks for it."""
