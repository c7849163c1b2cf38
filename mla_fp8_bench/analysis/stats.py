"""The latency rule of ``gate`` and ``ab``, and ``calibrate``'s summary. A fresh process reads a case at one of
a few levels (FA3-FP8 s512 on an H200: 15.16 or 16.21 us) and a library change moves every level, so a side's
figure is the mean of its fastest mode; HEAD regresses when the ratio of the figures exceeds
``max(factor, 1 + k x se)``, ``se`` from each mode's relative robust standard deviation (1.4826 x MAD)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: Values within this fraction of a side's fastest value belong to its fastest mode.
MODE_WIDTH_REL = 0.02
#: k of the threshold ``max(factor, 1 + k x se)`` (``gate --noise-k``, ``ab --noise-k``).
DEFAULT_NOISE_K = 3.0
#: ``ab``'s factor: both sides measured in alternating processes on one machine.
DEFAULT_AB_FACTOR = 1.02


def fastest_mode(values: Sequence[float]) -> list[float]:
    lo = min(values)
    return [float(v) for v in values if v <= lo * (1 + MODE_WIDTH_REL)]


def mode_mean(values: Sequence[float]) -> float:
    """Mean of :func:`fastest_mode`, summed relative to its smallest value (no overflow near the float limit)."""
    mode = fastest_mode(values)
    return min(mode) * statistics.fmean(x / min(mode) for x in mode)


def robust_sd(values: Sequence[float]) -> float:
    """``1.4826 x MAD``: the standard deviation of normal data, insensitive to a few outlying values."""
    med = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - med) for v in values)


def latency_ratio(base: Sequence[float], head: Sequence[float], factor: float, k: float
                  ) -> tuple[float, float, float]:
    """``(ratio, threshold, se)`` of the latency rule for two non-empty lists of finite latencies > 0 (one
    value a side has ``se`` 0)."""
    modes = [fastest_mode(v) for v in (base, head)]
    se = math.sqrt(sum((robust_sd(m) / statistics.median(m)) ** 2 / len(m) for m in modes))
    return mode_mean(head) / mode_mean(base), max(factor, 1 + k * se), se


def summary(xs: Sequence[float]) -> dict[str, float]:
    """``n``, ``min``, ``median``, ``max``, ``mean``, ``std`` (sample; 0 for one value); ValueError when empty."""
    if not xs:
        raise ValueError("summary of an empty sequence")
    return {"n": len(xs), "min": min(xs), "median": statistics.median(xs), "max": max(xs),
            "mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}
