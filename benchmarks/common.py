"""Helpers shared by the benchmark scripts (run them as `python benchmarks/<name>.py`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import jax


def best_of(fn: Callable[[], object], repeats: int, warmup: bool = True) -> float:
    """Fastest of `repeats` timed calls, in seconds; one untimed call first compiles unless warmup=False."""
    if warmup:
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)
