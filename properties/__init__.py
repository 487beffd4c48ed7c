"""Hypothesis strategies and property tests run against a chosen kernel."""
