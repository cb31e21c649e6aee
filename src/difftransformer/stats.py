"""The statistics every report shares: the mean, and the spread across seeds that compare's verdict rule reads."""

from __future__ import annotations

from collections.abc import Sequence


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean of a non-empty sequence."""
    if len(values) == 0:
        raise ValueError("mean needs at least one value; got none")
    return sum(values) / len(values)


def spread(values: Sequence[float]) -> float:
    """The sample standard deviation (0 for fewer than two values): the spread across seeds in every report."""
    if len(values) < 2:
        return 0.0
    centre = mean(values)
    return (sum((v - centre) ** 2 for v in values) / (len(values) - 1)) ** 0.5


# Sampling intervals: how far a number measured on a finite sample (queries, sequences, questions) could move with
# another draw of that sample, at 95%. Reports show them beside each accuracy and share, and compare's verdict rule
# never counts a difference inside them.
Z_95 = 1.959963984540054  # the two-sided 95% quantile of the standard normal
Interval = tuple[float, float]


def wilson_interval(hits: int, trials: int) -> Interval:
    """The 95% Wilson score interval of an accuracy of ``hits`` out of ``trials`` (binomial), within [0, 1] and
    sensible at 0 and 1, where the normal approximation collapses to a point."""
    if trials < 1 or not 0 <= hits <= trials:
        raise ValueError(f"wilson_interval needs 0 <= hits <= trials and trials >= 1; got {hits} of {trials}")
    share, z2 = hits / trials, Z_95**2
    centre = (share + z2 / (2 * trials)) / (1 + z2 / trials)
    half = Z_95 * (share * (1 - share) / trials + z2 / (4 * trials**2)) ** 0.5 / (1 + z2 / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_interval(values: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> Interval | None:
    """The 95% percentile-bootstrap interval of the mean of ``values`` (one per sequence: resampling sequences,
    the unit that was drawn); None for fewer than two values, which say nothing about their spread. Seeded: the
    same values give the same interval."""
    if len(values) < 2:
        return None
    import numpy as np  # not at the top: the rest of this module is plain Python

    data = np.asarray(values, dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))
    means = data[draws].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def half_width(interval: Interval) -> float:
    """Half the width of ``interval``: its sampling noise as one number (a Wilson interval is asymmetric)."""
    return (interval[1] - interval[0]) / 2


def mean_interval(values: Sequence[float], intervals: Sequence[Interval | None]) -> Interval | None:
    """The 95% interval of the mean of independent estimates ``values`` (seeds, cells) with their own 95%
    ``intervals``: the mean plus or minus sqrt(sum of squared half-widths) / count. One value keeps its own
    interval; None when any interval is unknown."""
    if not values or len(values) != len(intervals) or any(i is None for i in intervals):
        return None
    if len(values) == 1:
        return intervals[0]
    half = sum(half_width(i) ** 2 for i in intervals) ** 0.5 / len(intervals)
    centre = mean(values)
    return centre - half, centre + half


# Student's t two-sided 95% quantiles for 1 to 10 degrees of freedom; beyond, the Cornish-Fisher expansion on Z_95
# to its second term (within 0.1% of the quantile from 11 on).
_T_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t_quantile_95(degrees: int) -> float:
    """The two-sided 95% quantile of Student's t with ``degrees`` (>= 1) degrees of freedom."""
    if degrees < 1:
        raise ValueError(f"t_quantile_95 needs at least 1 degree of freedom; got {degrees}")
    if degrees <= len(_T_95):
        return _T_95[degrees - 1]
    z = Z_95
    return z + (z**3 + z) / (4 * degrees) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * degrees**2)


def paired_interval(differences: Sequence[float]) -> Interval | None:
    """The 95% t interval of the mean of paired ``differences`` (one per seed: the same seed's two runs, so what
    the seed shares cancels); None for fewer than two, which say nothing about their spread."""
    if len(differences) < 2:
        return None
    half = t_quantile_95(len(differences) - 1) * spread(differences) / len(differences) ** 0.5
    centre = mean(differences)
    return centre - half, centre + half
