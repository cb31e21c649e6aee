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
