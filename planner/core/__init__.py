"""Foundations every layer shares: typed specs, units, input errors, parameter counts, memoisation."""
