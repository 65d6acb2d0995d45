"""Benchmarks and evaluation: the suite, the report, tuning efficiency, simulated tuning, timing tables, plots."""
