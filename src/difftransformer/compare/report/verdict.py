"""The verdict rule: when a difference between DIFF and its baseline counts as a result.

One rule for every measure of a comparison, stated in the report:

- "not measurable here" when both models sit at chance level (within the measure's margin of it): a tie at chance
  says nothing about the architecture;
- "within sampling noise" when the measure carries sampling intervals (an accuracy or a share, measured on a finite
  number of queries, questions or sequences) and the difference of the means is no larger than the sampling noise
  of that difference: another draw of the same number of items could erase it, however many seeds agree;
- "one seed: spread unknown" with fewer than two seeds per model;
- "agrees" / "opposite" (with the paper's direction) when the difference of the means exceeds
  ``SPREAD_MULTIPLE`` times the seed spread (pooled sample standard deviation of the two models across seeds);
- "not resolved" otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from difftransformer.stats import Interval, half_width, mean, mean_interval, spread

SPREAD_MULTIPLE = 2.0

AGREES = "agrees"
OPPOSITE = "opposite"
NOT_RESOLVED = "not resolved"
ONE_SEED = "one seed: spread unknown"
AT_CHANCE = "not measurable here"
WITHIN_NOISE = "within sampling noise"

RULE = (
    f"Verdict rule: with at least two seeds per model, a difference counts when the two means differ by more than "
    f"{SPREAD_MULTIPLE:g} times the seed spread (the pooled sample standard deviation of both models across "
    f"seeds); it then 'agrees' or is 'opposite' to the paper's direction, and is 'not resolved' otherwise. With "
    f"one seed the spread is unknown and no verdict is given. Where both models sit at chance level the task "
    f"measures nothing at this scale: 'not measurable here'. Every accuracy and share carries its 95% sampling "
    f"interval in brackets (Wilson over the queries, numbers or questions asked for an accuracy, a bootstrap over "
    f"sequences for an attention share; for a mean over seeds, the square root of the summed squared half-widths "
    f"over their count); a difference no larger than the two means' half-widths added in quadrature is 'within "
    f"sampling noise', whatever the seed spread: one seed's difference inside its own sampling noise is never "
    f"called a result."
)


@dataclass(frozen=True)
class Verdict:
    """The outcome of comparing DIFF's values with the baseline's on one measure."""

    word: str
    difference: float
    spread: float | None
    noise: float | None = None

    def __str__(self) -> str:
        return self.word


def pooled_spread(first: Sequence[float], second: Sequence[float]) -> float | None:
    """Pooled sample standard deviation of two groups of per-seed values; None with fewer than two in either."""
    if len(first) < 2 or len(second) < 2:
        return None
    return math.sqrt((spread(first) ** 2 + spread(second) ** 2) / 2)


def sampling_noise(
    diff: Sequence[float],
    diff_intervals: Sequence[Interval | None] | None,
    baseline: Sequence[float] | None = None,
    baseline_intervals: Sequence[Interval | None] | None = None,
) -> float | None:
    """The 95% sampling noise of the difference of the two means: the half-widths of the means' intervals
    (:func:`~difftransformer.stats.mean_interval`) added in quadrature; against a fixed reference (``baseline``
    None) DIFF's alone. None when an interval is unknown (results recorded before intervals were)."""
    first = mean_interval(diff, diff_intervals) if diff_intervals is not None else None
    if first is None:
        return None
    if baseline is None:
        return half_width(first)
    second = mean_interval(baseline, baseline_intervals) if baseline_intervals is not None else None
    return None if second is None else (half_width(first) ** 2 + half_width(second) ** 2) ** 0.5


def judge(
    diff: Sequence[float],
    baseline: Sequence[float] | float,
    *,
    higher_is_better: bool,
    at_chance: bool = False,
    diff_intervals: Sequence[Interval | None] | None = None,
    baseline_intervals: Sequence[Interval | None] | None = None,
) -> Verdict:
    """Apply the verdict rule to DIFF's per-seed ``diff`` values against the baseline's per-seed values, or
    against a fixed reference number (e.g. 1.0 for "DIFF needs this share of the baseline's parameters").
    ``at_chance``: both models sit at chance level on this measure in every run. ``diff_intervals`` and
    ``baseline_intervals``: each run's 95% sampling interval of its value, where the measure has them."""
    reference = isinstance(baseline, (int, float))
    if not diff or (not reference and not baseline):
        raise ValueError("judge needs at least one value for each model")
    mean_base = float(baseline) if reference else mean(baseline)
    difference = mean(diff) - mean_base
    if reference:
        deviation = spread(diff) if len(diff) >= 2 else None
        noise = sampling_noise(diff, diff_intervals)
    else:
        deviation = pooled_spread(diff, baseline)
        noise = sampling_noise(diff, diff_intervals, baseline, baseline_intervals)
    if at_chance:
        return Verdict(AT_CHANCE, difference, deviation, noise)
    if noise is not None and abs(difference) <= noise:
        return Verdict(WITHIN_NOISE, difference, deviation, noise)
    if deviation is None:
        return Verdict(ONE_SEED, difference, None, noise)
    if abs(difference) > SPREAD_MULTIPLE * deviation:
        diff_better = difference > 0 if higher_is_better else difference < 0
        return Verdict(AGREES if diff_better else OPPOSITE, difference, deviation, noise)
    return Verdict(NOT_RESOLVED, difference, deviation, noise)
