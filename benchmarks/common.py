"""Helpers shared by the benchmark scripts (run them as `python benchmarks/<name>.py`)."""

from dantinox.accounting.roofline import best_of  # noqa: F401  (fastest of n timed calls after a compiling one)
