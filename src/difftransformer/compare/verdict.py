"""The verdict rule: when a difference between DIFF and its baseline counts as a result.

One rule for every measure of a comparison, stated in the report:

- "not measurable here" when both models sit at chance level (within the measure's margin of it): a tie at chance
  says nothing about the architecture;
- "one seed: spread unknown" with fewer than two seeds per model;
- "agrees" / "opposite" (with the paper's direction) when the difference of the means exceeds
  ``SPREAD_MULTIPLE`` times the seed spread (pooled sample standard deviation of the two models across seeds);
- "not resolved" otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from difftransformer.stats import mean, spread

SPREAD_MULTIPLE = 2.0

AGREES = "agrees"
OPPOSITE = "opposite"
NOT_RESOLVED = "not resolved"
ONE_SEED = "one seed: spread unknown"
AT_CHANCE = "not measurable here"

RULE = (
    f"Verdict rule: with at least two seeds per model, a difference counts when the two means differ by more than "
    f"{SPREAD_MULTIPLE:g} times the seed spread (the pooled sample standard deviation of both models across "
    f"seeds); it then 'agrees' or is 'opposite' to the paper's direction, and is 'not resolved' otherwise. With "
    f"one seed the spread is unknown and no verdict is given. Where both models sit at chance level the task "
    f"measures nothing at this scale: 'not measurable here'."
)


@dataclass(frozen=True)
class Verdict:
    """The outcome of comparing DIFF's values with the baseline's on one measure."""

    word: str
    difference: float
    spread: float | None

    def __str__(self) -> str:
        return self.word


def pooled_spread(first: Sequence[float], second: Sequence[float]) -> float | None:
    """Pooled sample standard deviation of two groups of per-seed values; None with fewer than two in either."""
    if len(first) < 2 or len(second) < 2:
        return None
    return math.sqrt((spread(first) ** 2 + spread(second) ** 2) / 2)


def judge(
    diff: Sequence[float],
    baseline: Sequence[float] | float,
    *,
    higher_is_better: bool,
    at_chance: bool = False,
) -> Verdict:
    """Apply the verdict rule to DIFF's per-seed ``diff`` values against the baseline's per-seed values, or
    against a fixed reference number (e.g. 1.0 for "DIFF needs this share of the baseline's parameters").
    ``at_chance``: both models sit at chance level on this measure in every run."""
    reference = isinstance(baseline, (int, float))
    if not diff or (not reference and not baseline):
        raise ValueError("judge needs at least one value for each model")
    mean_base = float(baseline) if reference else mean(baseline)
    difference = mean(diff) - mean_base
    if reference:
        deviation = spread(diff) if len(diff) >= 2 else None
    else:
        deviation = pooled_spread(diff, baseline)
    if at_chance:
        return Verdict(AT_CHANCE, difference, deviation)
    if deviation is None:
        return Verdict(ONE_SEED, difference, None)
    if abs(difference) > SPREAD_MULTIPLE * deviation:
        diff_better = difference > 0 if higher_is_better else difference < 0
        return Verdict(AGREES if diff_better else OPPOSITE, difference, deviation)
    return Verdict(NOT_RESOLVED, difference, deviation)
