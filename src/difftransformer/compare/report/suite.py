"""The evaluation suite in the compare report: per task a section with a table (mean ± spread across seeds) and a
chart comparing the variants (the verdicts on each task's measures are :mod:`.claims_table`'s). What each task shows
comes from the task itself (:mod:`difftransformer.eval.task`); this module only lays it out.

Rows are *groups*: an arm's name (:func:`.arms.arm_name`) and the suites of its seeds, as returned by
:func:`difftransformer.eval.suite.run_suite`.
"""

from __future__ import annotations

from pathlib import Path

from difftransformer.compare.report.document import Report, mean_spread
from difftransformer.eval.registry import get_task
from difftransformer.eval.task import Chart, Panel
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean, spread

Group = tuple[str, list[dict]]


def _series(task: str, suites: list[dict], headers: list[str]) -> list[list[float]]:
    """For each table column in ``headers``, its values across ``suites`` (the seeds of one group)."""
    columns = get_task(task).columns
    rows = [{c.header: c.value for c in columns(s["summary"][task])} for s in suites]
    return [[row[header] for row in rows if header in row] for header in headers]


def _first(groups: list[Group], task: str) -> tuple[dict, dict]:
    """(summary, options) of ``task`` in the first run: every run of a comparison has the same settings."""
    suite = groups[0][1][0]
    return suite["summary"][task], suite["options"][task]


def task_table(task: str, groups: list[Group]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of ``task``'s table: one row per group, each cell the mean ± spread across its seeds."""
    columns = get_task(task).columns(_first(groups, task)[0])
    headers = [c.header for c in columns]
    rows = [
        [label]
        + [mean_spread(values, c.digits) for values, c in zip(_series(task, suites, headers), columns)]
        for label, suites in groups
    ]
    return ["variant", *headers], rows


def _draw_panel(axis, task: str, groups: list[Group], panel: Panel, chart: Chart) -> None:
    headers = list(panel.columns)
    if chart.kind == "bars":
        width = 0.8 / len(groups)
        for i, (label, suites) in enumerate(groups):
            series = _series(task, suites, headers)
            axis.bar(
                [j + i * width for j in range(len(headers))],
                [mean(s) for s in series],
                width,
                yerr=[spread(s) for s in series] if len(suites) > 1 else None,
                label=label,
            )
        axis.set_xticks([j + 0.4 - width / 2 for j in range(len(headers))], headers)
        axis.grid(alpha=0.3, axis="y")
    else:
        for label, suites in groups:
            series = _series(task, suites, headers)
            axis.errorbar(
                range(len(headers)),
                [mean(s) for s in series],
                yerr=[spread(s) for s in series] if len(suites) > 1 else None,
                marker="o",
                capsize=3,
                label=label,
            )
        axis.set_xticks(range(len(headers)), panel.xticks or chart.xticks or headers)
        axis.set(xlabel=chart.xlabel)
        axis.grid(alpha=0.3)
    axis.set(ylabel=panel.ylabel)
    if panel.ylim is not None:
        axis.set_ylim(*panel.ylim)
    if chart.log:
        axis.set_yscale("log")
    axis.legend()


def plot_task(task: str, groups: list[Group], path: Path) -> None:
    """``task``'s comparison chart (:meth:`Task.chart`): one bar per group in each column's bar group, or one
    line per group along the columns of each panel; error bars show the spread across seeds."""
    chart = get_task(task).chart(_first(groups, task)[0])
    plt = pyplot()
    if chart.kind == "bars":
        names = chart.panels[0].columns
        figure, axes = plt.subplots(figsize=(max(6, 1.6 * len(names) + 2), 4), squeeze=False)
    else:
        # At most four panels a row: a chart of many panels (mqar's grid of lengths) wraps.
        rows, columns = -(-len(chart.panels) // 4), min(len(chart.panels), 4)
        figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 4 * rows), squeeze=False)
        for axis in axes.flat[len(chart.panels) :]:
            axis.set_visible(False)
    for axis, panel in zip(axes.flat, chart.panels):
        _draw_panel(axis, task, groups, panel, chart)
    if chart.kind == "bars":
        axes[0][0].set(title=chart.title)
    else:
        figure.suptitle(chart.title)
    save_figure(figure, path)


def suite_sections(report: Report, groups: list[Group], out: Path) -> None:
    """Append one section (description, table, chart suite_TASK.png in ``out``) per task the runs have."""
    tasks = list(groups[0][1][0]["summary"])  # every run has the same tasks
    every = [s for _, suites in groups for s in suites]
    seconds = ", ".join(f"{t} {mean([s['seconds'][t] for s in every]):.1f} s" for t in tasks)
    report.heading("Evaluation suite")
    report.paragraph(
        "Every model ran the tasks below with light settings scaled to the preset, on the same samples (fixed "
        f"seed). Mean seconds per model: {seconds}. Each run's full results and plots are in "
        "runs/RUN/eval/TASK/; `difftransformer eval TASK --model runs/RUN` runs a task with its full settings "
        "(docs/evaluation.md)."
    )
    for name in tasks:
        task = get_task(name)
        report.heading(task.title)
        report.paragraph(task.describe(_first(groups, name)[1]))
        report.table(*task_table(name, groups))
        filename = f"suite_{name}.png"
        plot_task(name, groups, out / filename)
        report.image(filename, task.title)
