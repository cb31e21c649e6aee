"""The report's section on lm-evaluation-harness (``compare --lm-eval-tasks``): each task's metrics per arm."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from difftransformer.compare.records import RunRecord
from difftransformer.compare.report.arms import Arm
from difftransformer.compare.report.document import Report, mean_spread
from difftransformer.eval import paper
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean, spread

HARNESS_PNG = "lm_eval.png"


def _values(runs: Sequence[RunRecord], task: str, metric: str) -> list[float]:
    """The metric of every run that has it."""
    return [
        r.harness["metrics"][task][metric] for r in runs if r.harness["metrics"][task].get(metric) is not None
    ]


def harness_section(report: Report, arms: Sequence[Arm], out: Path) -> None:
    """lm-evaluation-harness metrics of every arm: a table of each task's metrics (standard errors left out) as
    mean ± spread across seeds, and a bar chart; nothing unless every run ran the harness."""
    records = [record for arm in arms for record in arm.runs]
    if not records or not all(r.harness for r in records):
        return
    first = records[0].harness
    columns = [
        (task, metric)
        for task, metrics in first["metrics"].items()
        for metric, value in metrics.items()
        if not metric.endswith("_stderr") and value is not None
    ]
    report.heading("LM Evaluation Harness")
    options = first["options"]
    report.paragraph(
        f"lm-evaluation-harness tasks {', '.join(options['tasks'])} on every trained model (limit "
        f"{options['limit'] or 'none'}, batch size {options['batch_size']}; windows up to the trained block size). "
        + paper.HARNESS
    )
    report.table(
        ["variant", *(f"{task} {metric}" for task, metric in columns)],
        [[arm.name, *(mean_spread(_values(arm.runs, t, m), 3) for t, m in columns)] for arm in arms],
    )
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(max(6, 1.6 * len(columns) + 2), 4))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        series = [_values(arm.runs, t, m) for t, m in columns]
        axis.bar([j + i * width for j in range(len(columns))], [mean(s) if s else 0.0 for s in series], width,
                 yerr=[spread(s) for s in series] if len(arm.runs) > 1 else None, label=arm.name)  # fmt: skip
    axis.set_xticks([j + 0.4 - width / 2 for j in range(len(columns))], [f"{t}\n{m}" for t, m in columns])
    axis.grid(alpha=0.3, axis="y")
    axis.legend()
    save_figure(figure, out / HARNESS_PNG)
    report.image(HARNESS_PNG, "lm-evaluation-harness metrics per variant")
