"""Statistics the benchmarks share: Spearman's rank correlation (no SciPy needed)."""

from __future__ import annotations

import statistics

__all__ = ["ranks", "spearman"]


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties averaged."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of two equally long lists."""
    ra, rb = ranks(a), ranks(b)
    mean_a, mean_b = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(ra, rb, strict=True))
    var = (sum((x - mean_a) ** 2 for x in ra) * sum((y - mean_b) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")
