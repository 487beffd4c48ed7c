"""Benchmarks and the device-side checks that accompany them (not part of the installed package)."""
