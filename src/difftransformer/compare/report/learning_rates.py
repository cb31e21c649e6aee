"""The report's learning-rate section: each arm's validation loss against the learning rate in its sweep, and the
rate it chose (:func:`~difftransformer.compare.rates.best_rates` chose it)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from difftransformer.compare.records import SweepPoint
from difftransformer.compare.report.arms import arm_name
from difftransformer.compare.report.document import Report
from difftransformer.compare.settings import RateChoice
from difftransformer.compare.variants import parse_variant
from difftransformer.plotting import pyplot, save_figure
from difftransformer.train.recall import RECALL_THRESHOLD

RATES_PNG = "learning_rates.png"


def learning_rate_section(
    report: Report,
    points: Sequence[SweepPoint],
    best: Mapping[tuple[str, str], float],
    shared_rate: float,
    out: Path,
    rate_choice: RateChoice = "validation_loss",
) -> None:
    """Each arm's validation loss against the learning rate (one line per arm, its chosen rate circled), and a
    table of the sweep: the loss at every rate, where early stopping ended a run, which runs never learned recall
    (where they trained with recall rows), the rate chosen (by ``rate_choice``, as in
    :func:`~difftransformer.compare.rates.best_rates`)."""
    arms = list(dict.fromkeys(p.arm for p in points))
    scales = {scale for scale, _ in arms}
    names = {arm: arm_name(parse_variant(arm[1]), arm[0], scales) for arm in arms}
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for i, arm in enumerate(arms):
        mine = sorted((p for p in points if p.arm == arm), key=lambda p: p.learning_rate)
        finished = [p for p in mine if not p.stopped_early and not math.isnan(p.validation_loss)]
        axis.plot([p.learning_rate for p in finished], [p.validation_loss for p in finished], "o-",
                  color=f"C{i}", label=names[arm])  # fmt: skip
        stopped = [p for p in mine if p.stopped_early and not math.isnan(p.validation_loss)]
        axis.plot(
            [p.learning_rate for p in stopped], [p.validation_loss for p in stopped], "x", color=f"C{i}"
        )
        if arm in best:
            chosen = next(p for p in finished if p.learning_rate == best[arm])
            axis.plot([chosen.learning_rate], [chosen.validation_loss], "o", ms=12, mfc="none", color=f"C{i}")
    axis.axvline(shared_rate, color="gray", lw=1, ls="--")
    axis.set(xscale="log", xlabel="learning rate", ylabel="validation loss",
             title="validation loss against learning rate (circled: each arm's choice; dashed: the shared rate)")  # fmt: skip
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    save_figure(figure, out / RATES_PNG)

    rates = sorted({p.learning_rate for p in points})
    steps = sorted({p.steps for p in points})
    stopped = [p for p in points if p.stopped_early]
    report.heading("Learning rates")
    report.paragraph(
        f"Every arm (a variant{' at one size' if len(scales) > 1 else ''}) trained at each rate with seed "
        f"{points[0].seed} for {', '.join(f'{s:,}' for s in steps)} steps"
        + "; the rate with the lowest validation loss "
        + (
            f"among those whose recall probe reached {RECALL_THRESHOLD} (every rate where none did; the "
            "validation text does not measure recall)"
            if rate_choice == "learned_recall"
            else "(never the test loss)"
        )
        + f" is the arm's own, and every seed then trained at it and at the shared rate {shared_rate:g}. "
        + (
            f"'no recall': the run's recall probe never reached {RECALL_THRESHOLD}. "
            if any(p.learned_recall is False for p in points)
            else ""
        )
        + (
            f"Early stopping (ASHA within each arm) ended {len(stopped)} sweep run(s) before their last step "
            "(marked x; their loss is where they stopped, and they are not candidates)."
            if stopped
            else "No sweep run was stopped early."
        )
    )
    header = ["arm", *(f"lr {rate:g}" for rate in rates), "chosen"]
    rows = []
    for arm in arms:
        mine = {p.learning_rate: p for p in points if p.arm == arm}
        cells = []
        for rate in rates:
            point = mine.get(rate)
            if point is None:
                cells.append("-")
            elif point.stopped_early:
                cells.append(f"{point.validation_loss:.3f} (stopped at step {point.step:,})")
            else:
                cells.append(
                    f"{point.validation_loss:.3f}" + (" (no recall)" if point.learned_recall is False else "")
                )
        rows.append([names[arm], *cells, f"{best[arm]:g}" if arm in best else "-"])
    report.table(header, rows)
    report.image(RATES_PNG, "validation loss against learning rate, each arm")
