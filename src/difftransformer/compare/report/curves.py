"""What a run logged while it trained, against the tokens it had seen (its metrics.csv), and the report's plot of
every run's losses."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from difftransformer.compare.records import RunRecord
from difftransformer.compare.report.arms import Arm
from difftransformer.compare.report.document import Report
from difftransformer.plotting import pyplot, save_figure
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.runner import METRICS_CSV

LOSS_CURVES_PNG = "loss_curves.png"


def run_curve(record: RunRecord, name: str) -> tuple[list[int], list[float]]:
    """(tokens seen, values) of one metrics column of a run."""
    steps, values = column(read_metrics(record.folder / METRICS_CSV), name)
    step_tokens = record.tokens / max(steps) if steps else 0
    return [round(step * step_tokens) for step in steps], values


def colors(arms: Sequence[Arm]) -> dict[str, str]:
    """One plot color per variant (by spec), the same in every plot of the report."""
    specs = dict.fromkeys(arm.variant.spec() for arm in arms)
    return {spec: f"C{i}" for i, spec in enumerate(specs)}


def loss_section(report: Report, arms: Sequence[Arm], out: Path) -> None:
    """Training loss (thin) and validation loss (markers) against tokens, every run overlaid; with a third panel
    of the MQAR probe's accuracy where runs trained with recall rows."""
    plt = pyplot()
    runs = [(arm, record) for arm in arms for record in arm.runs]
    recall = any(run_curve(record, "eval_mqar_accuracy")[0] for _, record in runs)
    panels = [("loss", "training loss", "loss"), ("eval_loss", "validation loss", "loss")]
    if recall:
        panels.append(("eval_mqar_accuracy", "MQAR accuracy while training (4 pairs)", "accuracy"))
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5))
    color = colors(arms)
    for arm, record in runs:
        for axis, (metric, _, _) in zip(axes, panels):
            style = dict(lw=1, alpha=0.7) if metric == "loss" else dict(marker="o", ms=3, alpha=0.8)
            axis.plot(*run_curve(record, metric), color=color[arm.variant.spec()],
                      label=f"{arm.name} s{record.seed}", **style)  # fmt: skip
    for axis, (_, title, unit) in zip(axes, panels):
        axis.set(xlabel="training tokens", ylabel=unit, title=title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    save_figure(figure, out / LOSS_CURVES_PNG)
    report.image(LOSS_CURVES_PNG, "training and validation loss (and MQAR accuracy), all runs overlaid")
