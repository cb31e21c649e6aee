"""Learning curves of the gap: each DIFF variant's validation loss minus the baseline's, against tokens, and the
report's section on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from difftransformer.compare.report.arms import Arm
from difftransformer.compare.report.curves import run_curve
from difftransformer.compare.report.document import Report
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean, spread

Curve = Sequence[tuple[int, float]]  # (tokens seen, validation loss)
GAP_PNG = "gap_curves.png"


def gap_curves(
    curves: Mapping[str, Mapping[int, Curve]], baseline: str
) -> dict[str, list[tuple[int, float, float | None]]]:
    """For every variant but ``baseline``: (tokens, mean gap, spread or None) at each evaluation both were run at,
    where the gap of one seed is the variant's validation loss minus the baseline's of the same seed (same data
    order) and mean / spread are taken across the seeds both have."""
    gaps = {}
    for label, by_seed in curves.items():
        if label == baseline:
            continue
        per_tokens: dict[int, list[float]] = {}
        for seed, curve in by_seed.items():
            reference = dict(curves[baseline].get(seed, ()))
            for tokens, loss in curve:
                if tokens in reference:
                    per_tokens.setdefault(tokens, []).append(loss - reference[tokens])
        gaps[label] = [
            (tokens, mean(values), spread(values) if len(values) > 1 else None)
            for tokens, values in sorted(per_tokens.items())
        ]
    return gaps


def gap_section(report: Report, baseline: Arm | None, others: Sequence[Arm], out: Path) -> None:
    """Each other arm's validation loss minus the baseline arm's against tokens (mean and spread over seeds); nothing
    without a baseline, or where no validation loss was logged at a step both share."""
    if baseline is None:
        return
    curves = {
        arm.name: {r.seed: list(zip(*run_curve(r, "eval_loss"))) for r in arm.runs}
        for arm in [baseline, *others]
    }
    gaps = gap_curves(curves, baseline.name)
    if not any(gaps.values()):
        return
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    lines = []
    for name, points in gaps.items():
        if not points:
            continue
        tokens, means, spreads = zip(*points)
        axis.plot(tokens, means, "o-", label=name)
        if all(s is not None for s in spreads):
            low = [m - s for m, s in zip(means, spreads)]
            high = [m + s for m, s in zip(means, spreads)]
            axis.fill_between(tokens, low, high, alpha=0.2)
        lines.append(
            f"{name}: {means[0]:+.3f} after {tokens[0]:,} tokens, {means[-1]:+.3f} after {tokens[-1]:,}"
        )
    axis.axhline(0, color="gray", lw=1)
    axis.set(
        xlabel="training tokens",
        ylabel=f"validation loss minus {baseline.name}'s",
        title="the gap during training (below 0: ahead of the baseline)",
    )
    axis.grid(alpha=0.3)
    axis.legend()
    save_figure(figure, out / GAP_PNG)
    report.heading("The gap during training")
    report.paragraph(
        "Validation loss of each DIFF variant minus the baseline's at the same step and seed; the line is the mean "
        "over seeds and the band ± one sample standard deviation. Small-scale studies see the sign change with "
        "training length, so the final value alone can mislead. " + "; ".join(lines) + "."
    )
    report.image(GAP_PNG, "validation-loss gap to the baseline against training tokens")
