"""Bundled attention kernels and adapters, all implementing the contract in
:mod:`fa2_verify.core.contract`.  Importing this package is cheap: no kernel module is
imported until the registry (:mod:`fa2_verify.verify.registry`) asks for it."""
