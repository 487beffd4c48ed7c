"""Checking a kernel: poisoned calls, the golden comparison, the error model and metrics, reports, baselines, the gate.

Importing it is cheap.
"""
