"""The evaluation suite in the compare report: per task a section with a table (mean ± spread across seeds) and a
plot comparing the variants, and one verdict sentence per measure saying which variant came out ahead.

Rows are *groups*: a label (a variant, with its scale when there are several) and the suites of its seeds, as
returned by :func:`difftransformer.train.suite.run_suite`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from difftransformer.eval.common import pyplot, save_figure
from difftransformer.train.report import Report, mean_spread

Group = tuple[str, list[dict]]
# A task's table columns from one summary: (header, value, digits shown).
Columns = Callable[[dict], list[tuple[str, float, int]]]


def _needle_columns(summary: dict) -> list[tuple[str, float, int]]:
    return [(f"N:R={config}", accuracy, 2) for config, accuracy in summary.items()]


def _attention_columns(summary: dict) -> list[tuple[str, float, int]]:
    return [("answer share", summary["answer"], 3), ("context share (noise)", summary["context"], 3)]


def _outlier_columns(summary: dict) -> list[tuple[str, float, int]]:
    columns = []
    for key, name in (("attention_logits", "logits"), ("hidden_states", "hidden states")):
        stats = summary[key]
        columns += [
            (f"{name} top-1", stats["top1"], 2),
            (f"{name} median", stats["median"], 3),
            (f"{name} top-1/median", stats["ratio"], 1),
        ]
    return columns


def _width(key: str) -> str:
    return "full" if key == "unquantised" else f"{key}-bit"


def _quant_columns(summary: dict) -> list[tuple[str, float, int]]:
    return [(f"loss {_width(k)}", row["loss"], 3) for k, row in summary.items()] + [
        (f"needle {_width(k)}", row["needle_accuracy"], 2) for k, row in summary.items()
    ]


def _longctx_columns(summary: dict) -> list[tuple[str, float, int]]:
    # The cumulative average at the last position is the mean NLL, which has its own column.
    positions = list(summary["cumulative_nll"].items())[:-1]
    return [("mean NLL", summary["mean_nll"], 3)] + [
        (f"cumulative NLL to {p}", value, 3) for p, value in positions
    ]


def _icl_columns(summary: dict) -> list[tuple[str, float, int]]:
    return [(f"{k}-shot", accuracy, 2) for k, accuracy in summary["accuracy"].items()] + [
        (f"order spread ({mode})", spread, 2) for mode, spread in summary["spread"].items()
    ]


def _mqar_columns(summary: dict) -> list[tuple[str, float, int]]:
    return [(f"{pairs} pairs", accuracy, 2) for pairs, accuracy in summary.items()]


COLUMNS: dict[str, Columns] = {
    "needle": _needle_columns,
    "attention": _attention_columns,
    "outliers": _outlier_columns,
    "quant": _quant_columns,
    "longctx": _longctx_columns,
    "icl": _icl_columns,
    "mqar": _mqar_columns,
}

TITLES = {
    "needle": "Multi-needle retrieval (needle)",
    "attention": "Attention allocation in retrieval (attention)",
    "outliers": "Activation outliers (outliers)",
    "quant": "Attention-logit quantisation (quant)",
    "longctx": "NLL by position (longctx)",
    "icl": "In-context learning (icl)",
    "mqar": "Multi-query associative recall (mqar)",
}


def _describe(task: str, options: dict) -> str:
    """What the task's numbers mean and the light settings they came from."""
    if task == "needle":
        return (
            f"Share of queried magic numbers ({options['number_digits']} digits) recalled exactly by greedy "
            f"decoding from {options['context_lengths'][0]}-token contexts of held-out text, per N:R (N needles, "
            f"R queried), with the answer needle at depths {options['depths']} ({options['samples']} per depth). "
            "Higher is better."
        )
    if task == "attention":
        return (
            f"Share of attention that the answer-producing positions put on the answer needle and on the rest "
            f"of the context (noise), {options['num_needles']}:{options['num_queries']} needles in "
            f"{options['context_length']}-token contexts with the answer needle at depths {options['depths']} "
            f"({options['samples']} per depth), averaged over heads, layers and depths. DIFF maps count negative "
            "entries with their sign. More on the answer and less on the noise is better."
        )
    if task == "outliers":
        return (
            "Largest (top-1) and median absolute attention logit (before softmax) and hidden state (every "
            f"decoder layer's output) over {options['tokens']} held-out tokens in windows of {options['length']}; "
            "a smaller top-1/median ratio means milder outliers."
        )
    if task == "quant":
        return (
            f"Held-out loss ({options['num_sequences']} windows of {options['length']} tokens) and needle accuracy "
            f"(N:R as for needle, answer at depth 0.5, {options['needle_kwargs']['samples']} per N:R) with the "
            f"attention logits fake-quantised by dynamic absmax per head at {options['bits']} bits; 'full' is the "
            "unquantised model through the same path. Lower loss and higher accuracy are better."
        )
    if task == "longctx":
        return (
            f"Next-token NLL (nats) on {options['num_sequences']} held-out windows of {options['length']} tokens: "
            "the mean, and the cumulative average from the first position up to the given one. Lower is better."
        )
    if task == "icl":
        return (
            f"Accuracy of the synthetic 5-topic classification task on {options['test_size']} test examples "
            f"with {options['shots']} demonstrations (the largest that fit the context), and the spread (best "
            f"minus worst) of the accuracy over {options['orderings']} orderings of the largest set, shuffled or "
            "grouped by class. Higher accuracy and a smaller spread are better."
        )
    return (
        f"Share of queried keys whose value is the model's argmax, {options['sequences']} sequences of random "
        "vocabulary ids per number of key-value pairs. Higher is better."
    )


def _series(task: str, suites: list[dict], names: list[str]) -> list[list[float]]:
    """For each table column in ``names``, its values across ``suites`` (the seeds of one group)."""
    rows = [{name: value for name, value, _ in COLUMNS[task](s["summary"][task])} for s in suites]
    return [[row[name] for row in rows if name in row] for name in names]


def _first(groups: list[Group], task: str) -> tuple[dict, dict]:
    """(summary, options) of ``task`` in the first run: every run of a comparison has the same settings."""
    suite = groups[0][1][0]
    return suite["summary"][task], suite["options"][task]


def task_table(task: str, groups: list[Group]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of ``task``'s table: one row per group, each cell the mean ± spread across its seeds."""
    columns = COLUMNS[task](_first(groups, task)[0])
    names = [name for name, _, _ in columns]
    rows = [
        [label]
        + [
            mean_spread(values, digits)
            for values, (_, _, digits) in zip(_series(task, suites, names), columns)
        ]
        for label, suites in groups
    ]
    return ["variant", *names], rows


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def plot_bars(
    task: str,
    groups: list[Group],
    names: list[str],
    path: Path,
    *,
    ylabel: str,
    title: str,
    log: bool = False,
    ylim: tuple[float, float] | None = None,
) -> None:
    """One bar group per table column in ``names``, one bar per group of runs (error bar: spread across seeds)."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(max(6, 1.6 * len(names) + 2), 4))
    width = 0.8 / len(groups)
    for i, (label, suites) in enumerate(groups):
        series = _series(task, suites, names)
        axis.bar(
            [j + i * width for j in range(len(names))],
            [_mean(s) for s in series],
            width,
            yerr=[_spread(s) for s in series] if len(suites) > 1 else None,
            label=label,
        )
    axis.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
    axis.set(ylabel=ylabel, title=title)
    if ylim is not None:
        axis.set_ylim(*ylim)
    if log:
        axis.set_yscale("log")
    axis.grid(alpha=0.3, axis="y")
    axis.legend()
    save_figure(figure, path)


def plot_lines(
    task: str,
    groups: list[Group],
    panels: list[tuple[str, list[str], tuple[float, float] | None]],
    path: Path,
    *,
    xlabel: str,
    xticks: list[str],
    title: str,
) -> None:
    """One panel per (y label, table columns along x, y limits or None), one line per group of runs (error bars
    across seeds)."""
    plt = pyplot()
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for axis, (ylabel, names, ylim) in zip(axes[0], panels):
        for label, suites in groups:
            series = _series(task, suites, names)
            axis.errorbar(
                range(len(names)),
                [_mean(s) for s in series],
                yerr=[_spread(s) for s in series] if len(suites) > 1 else None,
                marker="o",
                capsize=3,
                label=label,
            )
        axis.set_xticks(range(len(names)), xticks)
        axis.set(xlabel=xlabel, ylabel=ylabel)
        if ylim is not None:
            axis.set_ylim(*ylim)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(title)
    save_figure(figure, path)


UNIT = (-0.02, 1.02)  # y limits of an accuracy plot


def plot_task(task: str, groups: list[Group], path: Path) -> None:
    """``task``'s comparison plot: bars for needle, attention and outliers; lines over the swept setting (bits,
    position, shots, pairs) for the others."""
    summary = _first(groups, task)[0]
    names = [name for name, _, _ in COLUMNS[task](summary)]
    if task == "needle":
        plot_bars(
            task,
            groups,
            names,
            path,
            ylabel="exact-match accuracy",
            title="multi-needle retrieval",
            ylim=UNIT,
        )
    elif task == "attention":
        plot_bars(
            task, groups, names, path, ylabel="share of attention", title="attention allocation in retrieval"
        )
    elif task == "outliers":
        ratios = [n for n in names if n.endswith("top-1/median")]
        plot_bars(
            task, groups, ratios, path, ylabel="top-1 / median of |x|", title="activation outliers", log=True
        )
    elif task == "quant":
        widths = [_width(k) for k in summary]
        panels = [
            ("held-out loss", [f"loss {w}" for w in widths], None),
            ("needle accuracy", [f"needle {w}" for w in widths], UNIT),
        ]
        plot_lines(task, groups, panels, path, xlabel="attention-logit precision", xticks=widths,
                   title="dynamic absmax quantisation of attention logits")  # fmt: skip
    elif task == "longctx":
        positions = list(summary["cumulative_nll"])
        names = [f"cumulative NLL to {p}" for p in positions[:-1]] + ["mean NLL"]
        plot_lines(task, groups, [("cumulative average NLL (nats)", names, None)], path,
                   xlabel="position (tokens)", xticks=positions, title="long-context NLL by position")  # fmt: skip
    elif task == "icl":
        shots = list(summary["accuracy"])
        plot_lines(task, groups, [("accuracy", [f"{k}-shot" for k in shots], UNIT)], path, xlabel="demonstrations",
                   xticks=shots, title="in-context classification (synthetic topics)")  # fmt: skip
    else:
        pairs = list(summary)
        plot_lines(task, groups, [("recall accuracy", [f"{n} pairs" for n in pairs], UNIT)], path,
                   xlabel="key-value pairs", xticks=pairs, title="multi-query associative recall")  # fmt: skip


def suite_sections(report: Report, groups: list[Group], out: Path) -> None:
    """Append one section (description, table, plot suite_TASK.png in ``out``) per task the runs have."""
    tasks = list(groups[0][1][0]["summary"])  # every run has the same tasks
    every = [s for _, suites in groups for s in suites]
    seconds = ", ".join(f"{t} {_mean([s['seconds'][t] for s in every]):.1f} s" for t in tasks)
    report.heading("Evaluation suite")
    report.paragraph(
        "Every model ran the tasks below with light settings scaled to the preset, on the same samples (fixed "
        f"seed). Mean seconds per model: {seconds}. Each run's full results and plots are in "
        "runs/RUN/eval/TASK/; `difftransformer eval TASK --model runs/RUN` runs a task with its full settings "
        "(docs/evaluation.md)."
    )
    for task in tasks:
        report.heading(TITLES[task])
        report.paragraph(_describe(task, _first(groups, task)[1]))
        report.table(*task_table(task, groups))
        name = f"suite_{task}.png"
        plot_task(task, groups, out / name)
        report.image(name, TITLES[task])


def _lowest_bits(summary: dict) -> str:
    return str(min(int(k) for k in summary if k != "unquantised"))


Measure = tuple[str, Callable[[dict], "float | None"], bool, int]


def measures(task: str, summary: dict) -> list[Measure]:
    """``task``'s verdict measures: (name, its value from one summary or None where the run has none, whether higher
    is better, digits shown). ``summary`` is one run's, for names that depend on the settings."""
    if task == "needle":
        return [("mean retrieval accuracy", lambda s: _mean(list(s.values())), True, 2)]
    if task == "attention":
        return [
            ("attention on the answer needle", lambda s: s["answer"], True, 3),
            ("attention on the rest of the context (noise)", lambda s: s["context"], False, 3),
        ]
    if task == "outliers":
        return [
            ("attention-logit top-1/median", lambda s: s["attention_logits"]["ratio"], False, 1),
            ("hidden-state top-1/median", lambda s: s["hidden_states"]["ratio"], False, 1),
        ]
    if task == "quant":
        bits = _lowest_bits(summary)
        return [
            (f"loss with {bits}-bit attention logits", lambda s: s[bits]["loss"], False, 3),
            (
                f"needle accuracy with {bits}-bit attention logits",
                lambda s: s[bits]["needle_accuracy"],
                True,
                2,
            ),
        ]
    if task == "longctx":
        return [("mean NLL by position", lambda s: s["mean_nll"], False, 3)]
    if task == "icl":
        return [
            (
                "in-context accuracy averaged over shot counts",
                lambda s: _mean(list(s["accuracy"].values())),
                True,
                2,
            ),
            (
                "order spread averaged over random and grouped orderings",
                lambda s: _mean(list(s["spread"].values())) if s["spread"] else None,
                False,
                2,
            ),
        ]
    return [("MQAR accuracy averaged over pair counts", lambda s: _mean(list(s.values())), True, 2)]


def ahead(measure: str, values: dict[str, float], higher_is_better: bool, digits: int) -> str:
    """One sentence naming the variant(s) ahead on ``measure`` (a tie when every value rounds the same)."""
    best = (max if higher_is_better else min)(values.values())
    leaders = [label for label, v in values.items() if round(v, digits) == round(best, digits)]
    if len(leaders) == len(values):
        return f"{measure[0].upper()}{measure[1:]}: a tie at {best:.{digits}f}."
    others = ", ".join(f"{label} {v:.{digits}f}" for label, v in values.items() if label not in leaders)
    word = "Highest" if higher_is_better else "Lowest"
    return f"{word} {measure}: {' and '.join(leaders)} ({best:.{digits}f}; {others})."


def suite_verdict(by_variant: dict[str, list[dict]]) -> list[str]:
    """One sentence per measure of every task all runs have; values are means over each variant's runs."""
    suites = [s for runs in by_variant.values() for s in runs]
    sentences = []
    for task in COLUMNS:
        if not all(task in s["summary"] for s in suites):
            continue
        for measure, value, higher, digits in measures(task, suites[0]["summary"][task]):
            values = {label: [value(s["summary"][task]) for s in runs] for label, runs in by_variant.items()}
            if any(v is None for runs in values.values() for v in runs):
                continue
            sentences.append(ahead(measure, {label: _mean(v) for label, v in values.items()}, higher, digits))
    return sentences
