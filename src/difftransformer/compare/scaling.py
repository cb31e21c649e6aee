"""Power-law fits of loss against model size or training tokens, and the size DIFF needs to match the baseline."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PowerLaw:
    """loss = coefficient * x ** exponent, fitted by least squares on (log x, log loss)."""

    coefficient: float
    exponent: float

    def __call__(self, x: float | np.ndarray) -> float | np.ndarray:
        return self.coefficient * np.asarray(x, dtype=float) ** self.exponent

    def inverse(self, loss: float) -> float:
        """The x at which the fitted curve reaches ``loss``."""
        if self.exponent == 0:
            raise ValueError("a flat power law (exponent 0) reaches no other loss")
        return (loss / self.coefficient) ** (1.0 / self.exponent)


def fit_power_law(x: Sequence[float], loss: Sequence[float]) -> PowerLaw:
    """Fit loss = a x^b through at least two points with distinct positive x and positive loss."""
    x, loss = np.asarray(x, dtype=float), np.asarray(loss, dtype=float)
    if x.shape != loss.shape or x.ndim != 1:
        raise ValueError(f"x and loss must be 1-D of equal length; got {x.shape} and {loss.shape}")
    if len(np.unique(x)) < 2:
        raise ValueError(f"a power-law fit needs at least two distinct x values; got {x.tolist()}")
    if (x <= 0).any() or (loss <= 0).any():
        raise ValueError("x and loss must be positive for a fit in log space")
    slope, intercept = np.polyfit(np.log(x), np.log(loss), 1)
    return PowerLaw(coefficient=math.exp(intercept), exponent=float(slope))


def matching_ratio(diff: PowerLaw, baseline: PowerLaw, baseline_x: float) -> float:
    """x_diff / baseline_x, where x_diff is the size (or token count) at which DIFF's fitted loss equals the
    baseline's fitted loss at ``baseline_x``: below 1 means DIFF needs less to match."""
    return diff.inverse(float(baseline(baseline_x))) / baseline_x
