"""Checking a kernel: poisoned calls, the golden comparison, the error model, metrics and results.

What a check leaves behind (reports, baselines, the gate) is :mod:`records`.
Importing it is cheap.
"""
