"""Statistics of the analysis layer: the one-sided Mann-Whitney U test and summary statistics.

The gate (:mod:`mla_fp8_bench.analysis.gate`) calls the U test on raw latency samples; calibrate
(:mod:`mla_fp8_bench.analysis.calibrate`) summarises error distributions over seeds with :func:`summary`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np


def _exact_mwu_upper(u: float, n1: int, n2: int) -> float:
    """P(U >= u) under H0 for sample sizes n1 (HEAD) and n2 (BASE), no ties (exact enumeration).

    ``row[j][k]``: rank arrangements of i HEAD and j BASE samples with U = k, built up over i: the
    largest element is either a HEAD sample (it beats all j BASE samples, U += j) or a BASE sample.
    """
    size = n1 * n2 + 1
    row = [np.eye(1, size)[0] for _ in range(n2 + 1)]  # i = 0: U = 0 for every j
    for _ in range(n1):
        new: list[np.ndarray] = []
        for j, prev in enumerate(row):
            acc = np.zeros(size)
            acc[j:] = prev[:size - j]
            new.append(acc + new[j - 1] if j else acc)
        row = new
    counts = row[n2]
    k = int(math.ceil(u - 1e-9))
    return float(counts[k:].sum() / counts.sum())


def mann_whitney_greater(head: Sequence[float] | np.ndarray, base: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """One-sided Mann-Whitney U test that ``head`` is stochastically larger than ``base``.

    Returns:
        ``(U, p)``: U counts pairs (h, b) with h > b (ties count 1/2); p is exact when there are no
        ties and both sizes are <= 12, else the normal approximation with tie and continuity
        corrections (Mann & Whitney 1947; tie correction as in Lehmann, *Nonparametrics*, 1975).

    Raises:
        ValueError: an empty sample.
    """
    h = np.asarray(head, dtype=np.float64)
    b = np.asarray(base, dtype=np.float64)
    n1, n2 = h.size, b.size
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney U needs at least one sample on each side")
    u = float((h[:, None] > b[None, :]).sum() + 0.5 * (h[:, None] == b[None, :]).sum())
    _, counts = np.unique(np.concatenate([h, b]), return_counts=True)
    ties = bool((counts > 1).any())
    if not ties and n1 <= 12 and n2 <= 12:
        return u, _exact_mwu_upper(u, n1, n2)
    n = n1 + n2
    mu = n1 * n2 / 2.0
    tie_term = float((counts ** 3 - counts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:
        return u, 1.0 if u <= mu else 0.0
    z = (u - mu - 0.5) / math.sqrt(var)
    return u, 0.5 * math.erfc(z / math.sqrt(2.0))


def min_attainable_p(n1: int, n2: int) -> float:
    """Smallest one-sided p the exact test can give: 1 / C(n1+n2, n1)."""
    return 1.0 / math.comb(n1 + n2, n1)


def summary(xs: Sequence[float]) -> dict[str, float]:
    """``n``, ``min``, ``median``, ``max``, ``mean``, ``std`` (sample standard deviation; 0 for one value).

    Raises:
        ValueError: an empty sequence.
    """
    if not xs:
        raise ValueError("summary of an empty sequence")
    return {"n": len(xs), "min": min(xs), "median": statistics.median(xs), "max": max(xs),
            "mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}
