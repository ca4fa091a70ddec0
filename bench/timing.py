"""Wall-clock helpers shared by the benchmarks (run as `python bench/<name>.py`, which puts bench/ on the path)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def best_time(fn: Callable[[], object], repeats: int = 1) -> tuple[float, object]:
    """Smallest wall time over `repeats` calls, and the last result."""
    best, result = float("inf"), None
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 0) -> float:
    """Median wall time of `repeats` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
