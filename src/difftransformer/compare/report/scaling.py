"""Power-law fits of loss against model size or training tokens, the size DIFF needs to match the baseline, and
the report's section on them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from difftransformer.compare.records import RunRecord
from difftransformer.compare.report.arms import Arm
from difftransformer.compare.report.document import Report
from difftransformer.compare.variants import Variant
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean, spread


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


def size_name(records: Sequence[RunRecord], by: str) -> str:
    """What :meth:`RunRecord.size` measures for ``by`` in these records, in words."""
    if by == "tokens":
        return "training tokens"
    kept = all(r.layer_parameters is not None for r in records)
    return "parameters in the decoder layers" if kept else "parameters"


def _plot(
    points: dict[Variant, list[tuple[float, float]]], xlabel: str, path: Path
) -> dict[Variant, PowerLaw]:
    """Loss against x (log-log) per variant: the mean over seeds at each x with a band of ± one sample standard
    deviation, and the power law fitted to every seed's point; returns the fits."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 4.5))
    fits = {}
    for i, (variant, pairs) in enumerate(points.items()):
        xs = sorted({x for x, _ in pairs})
        by_x = [[y for x_, y in pairs if x_ == x] for x in xs]
        means = [mean(ys) for ys in by_x]
        axis.plot(xs, means, "o", color=f"C{i}", label=variant.label)
        if all(len(ys) > 1 for ys in by_x):
            low = [m - spread(ys) for m, ys in zip(means, by_x)]
            high = [m + spread(ys) for m, ys in zip(means, by_x)]
            axis.fill_between(xs, low, high, color=f"C{i}", alpha=0.2)
        if len(xs) >= 2:
            fits[variant] = fit_power_law(*zip(*pairs))
            grid = [min(xs) * (max(xs) / min(xs)) ** (j / 50) for j in range(51)]
            axis.plot(grid, fits[variant](grid), color=f"C{i}", lw=1)
    axis.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="test loss")
    axis.grid(alpha=0.3, which="both")
    axis.legend()
    save_figure(figure, path)
    return fits


def scaling_section(report: Report, arms: Sequence[Arm], out: Path, by: str) -> None:
    """Power-law fits of test loss against parameters or tokens (all seeds pooled, every scale's arm of a
    variant; a loss that is not finite left out), their plot, and how much each variant needs to match the
    baseline."""
    variants = list(dict.fromkeys(arm.variant for arm in arms))
    points = {
        variant: [(r.size(by), r.test_loss) for arm in arms if arm.variant == variant for r in arm.runs
                  if math.isfinite(r.test_loss)]
        for variant in variants
    }  # fmt: skip
    name = f"scaling_{by}.png"
    axis_name = size_name([r for arm in arms for r in arm.runs], by)
    fits = _plot(points, axis_name, out / name)
    report.heading(f"Scaling with {by}")
    report.table(
        ["variant", "fit: loss = a * x^b", "a", "b"],
        [[variant.label, "", f"{f.coefficient:.4g}", f"{f.exponent:.4f}"] for variant, f in fits.items()],
    )
    baseline = next((variant for variant in fits if variant.is_baseline), None)
    if baseline is not None:
        largest = max(x for x, _ in points[baseline])
        shares = [
            f"{variant.label} {matching_ratio(fit, fits[baseline], largest):.0%}"
            for variant, fit in fits.items()
            if variant != baseline
        ]
        report.paragraph(
            f"At the largest baseline ({largest:,.0f} {axis_name}) the pooled fits say each variant reaches the "
            f"Transformer's loss with this share of the {axis_name}: {', '.join(shares)} (the paper: 62% of the "
            "parameters at 6.8B; 63.7% of the tokens)."
        )
    report.image(
        name,
        f"test loss against {axis_name}, log-log: the mean over seeds with a ± one standard deviation band, and "
        "power-law fits",
    )
