"""Recall against context length in compare's report: where the paper's mechanism says noise cancellation should
pay, read off the ``mqar`` task's grid of sequence lengths by key-value pairs (``lengths`` among its settings).

One figure with seed bands (mean ± sample standard deviation across seeds, per variant): MQAR accuracy against
sequence length at the pair counts every length holds (so only the length changes along a line), accuracy against
the number of pairs at the longest length (the distractors), and the attention on the queried pair and on the rest
of the context against length. The table gives the first panel's numbers; the claims rows and a verdict at each
length are the ``mqar`` task's measures (:mod:`difftransformer.compare.report.claims`).

Rows are *groups*, as in :mod:`difftransformer.compare.report.suite`: a label and the suites of its seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from difftransformer.compare.report.document import Report, mean_spread
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean, spread
from difftransformer.train.recall import RECALL_THRESHOLD

Group = tuple[str, list[dict]]


def _grid(suite: dict) -> dict | None:
    """The mqar summary of one run when it scored a grid of lengths, else None."""
    summary = suite["summary"].get("mqar")
    return summary if summary is not None and "by_length" in summary else None


def common_pairs(groups: list[Group]) -> list[str]:
    """The pair counts scored at every length of every run, in ascending order."""
    grids = [_grid(suite) for _, suites in groups for suite in suites]
    counts = [set(cells) for grid in grids for cells in grid["by_length"].values()]
    return sorted(set.intersection(*counts), key=int) if counts else []


def _band(
    axis, xs: list[int], per_seed: list[list[float]], label: str, color: str, marker: str = "o"
) -> None:
    """A line of the means across seeds at ``xs`` and a band of ± their sample standard deviation."""
    means = [mean(values) for values in per_seed]
    axis.plot(xs, means, marker=marker, color=color, label=label)
    if all(len(values) > 1 for values in per_seed):
        spreads = [spread(values) for values in per_seed]
        axis.fill_between(xs, [m - s for m, s in zip(means, spreads)], [m + s for m, s in zip(means, spreads)],
                          color=color, alpha=0.15)  # fmt: skip


def plot_length_curves(groups: list[Group], trained_length: int | None, path: Path) -> None:
    """The section's figure (see the module docstring); ``trained_length`` is marked on the length axes."""
    first = _grid(groups[0][1][0])
    lengths = sorted(first["by_length"], key=int)
    longest = lengths[-1]
    pairs = common_pairs(groups)
    every = sorted(first["by_length"][longest], key=int)
    read = sorted(first["allocation"], key=int)
    plt = pyplot()
    figure, axes = plt.subplots(1, 4, figsize=(22, 4.5))
    for index, (label, suites) in enumerate(groups):
        color = f"C{index}"
        grids = [_grid(suite) for suite in suites]
        averaged = [[mean([grid["by_length"][n][p] for p in pairs]) for grid in grids] for n in lengths]
        _band(axes[0], [int(n) for n in lengths], averaged, label, color)
        by_pairs = [[grid["by_length"][longest][p] for grid in grids] for p in every]
        _band(axes[1], [int(p) for p in every], by_pairs, label, color)
        for axis, key in ((axes[2], "answer"), (axes[3], "context")):
            _band(axis, [int(n) for n in read], [[grid["allocation"][n][key] for grid in grids] for n in read],
                  label, color)  # fmt: skip
    titles = (
        f"MQAR accuracy, {pairs[0]}-{pairs[-1]} pairs averaged" if pairs else "MQAR accuracy",
        f"MQAR accuracy at {longest} tokens",
        "attention on the queried pair",
        "attention on the rest of the context",
    )
    xlabels = (
        "sequence length (tokens)",
        "key-value pairs",
        "sequence length (tokens)",
        "sequence length (tokens)",
    )
    for axis, title, xlabel in zip(axes, titles, xlabels):
        axis.set(title=title, xlabel=xlabel)
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    for axis in axes[:2]:
        axis.set(ylabel="recall accuracy", ylim=(-0.02, 1.02))
    for axis in axes[2:]:
        axis.set(ylabel="share of attention")
    if trained_length is not None:
        for axis in (axes[0], axes[2], axes[3]):
            axis.axvline(trained_length, color="gray", ls=":", lw=1)
    save_figure(figure, path)


def length_section(
    report: Report,
    groups: list[Group],
    trained_length: int | None,
    out: Path,
    schedule: tuple[tuple[int, int], ...] = (),
    learned: Sequence[Sequence[bool | None]] | None = None,
) -> None:
    """Append the section "Recall against context length" (table and ``mqar_length_curves.png`` in ``out``) when
    every run scored mqar on a grid of lengths; nothing otherwise. ``schedule``: the training rows' length by step
    (a length curriculum), said in the text; ``learned``: per group, whether each run's recall probe reached
    ``RECALL_THRESHOLD`` during training (None: no probe), counted in a column when every run had a probe."""
    if not all(_grid(suite) is not None for _, suites in groups for suite in suites):
        return
    pairs = common_pairs(groups)
    first = _grid(groups[0][1][0])
    lengths = sorted(first["by_length"], key=int)
    report.heading("Recall against context length")
    trained = f" (trained at {trained_length} tokens: the dotted line)" if trained_length else ""
    if schedule:
        grown = ", then ".join(f"{length} tokens from step {step}" for step, length in schedule)
        trained = f" (trained on rows of {grown}; the dotted line marks {trained_length})"
    report.paragraph(
        "The paper's mechanism: a softmax map spreads mass over every key, so its noise grows with the number of "
        "distractors, and subtraction cancels it. MQAR accuracy against sequence length"
        + trained
        + f", averaged over the pair counts every length holds ({', '.join(pairs)}), so that only the length "
        "changes along a line; accuracy against key-value pairs at the longest length; and where the model looks "
        "at every length (from each query, the share of attention on its pair and on the rest of the context, "
        "at the fewest pairs each length holds). Lines are the mean over seeds, bands ± one sample standard "
        "deviation. The claims table above judges each length."
    )
    counted = learned is not None and all(run is not None for runs in learned for run in runs)
    if counted:
        report.paragraph(
            f"The last column counts the runs whose recall probe (MQAR at 4 pairs and the block length, at every "
            f"evaluation) reached {RECALL_THRESHOLD} during training; the means include the runs that never did."
        )
    rows = []
    for index, (label, suites) in enumerate(groups):
        grids = [_grid(suite) for suite in suites]
        rows.append([label, *(mean_spread([mean([g["by_length"][n][p] for p in pairs]) for g in grids], 2)
                              for n in lengths)])  # fmt: skip
        if counted:
            rows[-1].append(f"{sum(learned[index])} of {len(learned[index])}")
    header = ["variant", *(f"{n} tokens" for n in lengths)]
    report.table(header + (["learned recall"] if counted else []), rows)
    plot_length_curves(groups, trained_length, out / "mqar_length_curves.png")
    report.image("mqar_length_curves.png", "MQAR accuracy and attention allocation against sequence length")
