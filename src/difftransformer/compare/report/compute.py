"""Verdicts at equal training compute, and each part's paired effect.

Compute is counted, not timed: a run's training FLOPs are its configuration's FLOPs per trained token
(:func:`difftransformer.models.flops.training_flops`, at the preset's block size) times the tokens it trained on.
At equal compute two runs of the same seed are read at the smaller of their budgets: the cheaper run at its end,
the dearer one on its validation-loss curve, interpolated linearly in FLOPs between its evaluations. The CPU seconds
each run measured (its usage.json) stand beside the count.

A part's effect is the paired difference of two arms whose parts differ in that part alone (layers/parts.py; a
window counts as its size and the layers it covers), seed by seed, with the 95% t interval of its mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from difftransformer.compare.records import RunRecord, usage_seconds
from difftransformer.compare.report.arms import Arm
from difftransformer.compare.report.curves import colors, run_curve
from difftransformer.compare.report.document import Report
from difftransformer.layers.parts import SLIDING
from difftransformer.models import PART_FIELDS, DiffTransformerConfig
from difftransformer.models.flops import training_flops
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import Interval, mean, paired_interval

COMPUTE_PNG = "loss_against_compute.png"


def run_config(record: RunRecord) -> DiffTransformerConfig | None:
    """The configuration a run trained (its folder's config.json); None where the folder holds none."""
    try:
        return DiffTransformerConfig.from_pretrained(record.folder)
    except (OSError, ValueError):
        return None


def flops_per_token(record: RunRecord, block_size: int) -> float | None:
    """Training FLOPs per token of the run's configuration on ``block_size``-token rows."""
    config = run_config(record)
    return None if config is None else training_flops(config, block_size).total


def loss_at_flops(record: RunRecord, per_token: float, budget: float) -> float | None:
    """The run's validation loss after ``budget`` training FLOPs, interpolated between its evaluations; None
    outside the evaluations it logged."""
    tokens, losses = run_curve(record, "eval_loss")
    if not tokens:
        return None
    spent = [count * per_token for count in tokens]
    if not spent[0] <= budget <= spent[-1] * (1 + 1e-9):
        return None
    return float(np.interp(budget, spent, losses))


def run_budget(record: RunRecord, per_token: float) -> float | None:
    """The training FLOPs at the run's last evaluation; None where it logged none."""
    tokens, _ = run_curve(record, "eval_loss")
    return tokens[-1] * per_token if tokens else None


def paired_at_equal_compute(
    arm: Arm, baseline: Arm, block_size: int
) -> tuple[list[float], list[float]] | None:
    """(per seed: the arm's validation loss minus the baseline's at the smaller budget of the two runs, those
    budgets); None when a configuration is missing. Seeds either lacks, or whose curves do not reach, are left out."""
    mine, theirs = flops_per_token(arm.runs[0], block_size), flops_per_token(baseline.runs[0], block_size)
    if mine is None or theirs is None:
        return None
    by_seed = {run.seed: run for run in baseline.runs}
    differences, budgets = [], []
    for run in arm.runs:
        other = by_seed.get(run.seed)
        if other is None:
            continue
        ends = [run_budget(run, mine), run_budget(other, theirs)]
        if None in ends:
            continue
        budget = min(ends)
        ours, reference = loss_at_flops(run, mine, budget), loss_at_flops(other, theirs, budget)
        if ours is not None and reference is not None:
            differences.append(ours - reference)
            budgets.append(budget)
    return differences, budgets


def paired_at_equal_tokens(arm: Arm, baseline: Arm) -> list[float]:
    """Per seed both hold: the arm's test loss minus the baseline's."""
    by_seed = {run.seed: run.test_loss for run in baseline.runs}
    return [run.test_loss - by_seed[run.seed] for run in arm.runs if run.seed in by_seed]


def difference_text(differences: Sequence[float]) -> str:
    """'mean [low, high]' with the 95% t interval of paired ``differences``; 'mean (one seed)'; '-' for none."""
    if not differences:
        return "-"
    interval = paired_interval(differences)
    if interval is None:
        return f"{mean(differences):+.4f} (one seed)"
    return f"{mean(differences):+.4f} [{interval[0]:+.4f}, {interval[1]:+.4f}]"


def direction(differences: Sequence[float], lower: str, higher: str) -> str:
    """The verdict of paired loss ``differences``: ``lower`` or ``higher`` where the 95% interval of their mean
    excludes 0, else that it is not resolved."""
    interval: Interval | None = paired_interval(differences)
    if interval is None:
        return "one seed: spread unknown" if differences else "-"
    if interval[1] < 0:
        return lower
    if interval[0] > 0:
        return higher
    return "not resolved (the interval spans 0)"


def cpu_seconds(arm: Arm) -> float | None:
    """The mean CPU seconds of the arm's runs, every attempt counted (their usage.json); None where none recorded."""
    seconds = [usage_seconds([run.folder])["cpu_seconds"] for run in arm.runs]
    recorded = [value for value in seconds if value > 0]
    return mean(recorded) if recorded else None


def equal_compute_section(
    report: Report, baseline: Arm | None, others: Sequence[Arm], block_size: int, out: Path
) -> None:
    """Each arm against the baseline at equal training FLOPs, beside its FLOP and CPU-second ratios, and a plot of
    validation loss against training FLOPs; nothing without a baseline or its configuration."""
    reference_flops = None if baseline is None else flops_per_token(baseline.runs[0], block_size)
    if reference_flops is None:
        return
    reference_cpu = cpu_seconds(baseline)
    rows = []
    for arm in others:
        paired = paired_at_equal_compute(arm, baseline, block_size)
        per_token = flops_per_token(arm.runs[0], block_size)
        if paired is None or per_token is None:
            continue
        differences, budgets = paired
        seconds = cpu_seconds(arm)
        rows.append(
            [
                arm.name,
                f"{per_token / reference_flops:.3f}",
                "-" if seconds is None or reference_cpu is None else f"{seconds / reference_cpu:.2f}",
                f"{mean(budgets):.3g}" if budgets else "-",
                difference_text(differences),
                direction(differences, "ahead of the baseline", "behind the baseline"),
                difference_text(paired_at_equal_tokens(arm, baseline)),
            ]
        )
    if not rows:
        return
    report.heading("At equal training compute")
    report.paragraph(
        f"Compute is counted from each model's shapes: its training FLOPs per token (forward and backward, at the "
        f"preset's {block_size}-token rows; models/flops.py) times the tokens it trained on. Each seed's two runs "
        "are read at the smaller of their budgets: the cheaper run at its last evaluation, the dearer one on its "
        "validation-loss curve, interpolated between evaluations. The dearer run is then mid-schedule (its "
        "learning rate not yet decayed), which favours the cheaper arm. Differences are the arm's validation loss "
        f"minus {baseline.name}'s of the same seed, with the 95% t interval of their mean; the verdict is the "
        "interval's side of 0. The CPU seconds each run measured (every attempt, from usage.json) are shown beside "
        "the FLOP ratio; they depend on the machine and what else ran, the FLOPs do not. The last column repeats "
        "the difference at equal tokens (test loss) for reference."
    )
    report.table(
        ["arm", f"FLOPs / token ÷ {baseline.name}", f"CPU seconds ÷ {baseline.name}", "budget (FLOPs)",
         "Δ loss at equal compute [95%]", "verdict at equal compute", "Δ test loss at equal tokens [95%]"],
        rows,
    )  # fmt: skip
    _plot(baseline, others, block_size, out)
    report.image(COMPUTE_PNG, "validation loss against training FLOPs, every run")


def _plot(baseline: Arm, others: Sequence[Arm], block_size: int, out: Path) -> None:
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    arms = [baseline, *others]
    color = colors(arms)
    for arm in arms:
        per_token = flops_per_token(arm.runs[0], block_size)
        if per_token is None:
            continue
        for index, run in enumerate(arm.runs):
            tokens, losses = run_curve(run, "eval_loss")
            axis.plot([t * per_token for t in tokens], losses, "o-", ms=3, alpha=0.8,
                      color=color[arm.variant.spec()], label=arm.name if index == 0 else None)  # fmt: skip
    axis.set(xlabel="training FLOPs", ylabel="validation loss", title="loss against compute")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    save_figure(figure, out / COMPUTE_PNG)


def effective_parts(config: DiffTransformerConfig) -> dict[str, object]:
    """The parts a configuration computes with: its part fields, its window as (size, the layers it covers) and
    None where no layer is windowed (a window field that windows nothing changes nothing)."""
    parts = {name: getattr(config, name) for name in PART_FIELDS if not name.startswith("sliding_window")}
    windowed = tuple(index for index, kind in enumerate(config.layer_types) if kind == SLIDING)
    parts["window"] = (config.sliding_window, windowed) if windowed else None
    return parts


def _shown(part: str, value: object) -> str:
    if part == "window":
        if value is None:
            return "none"
        size, layers = value
        return f"{size} keys on layers {', '.join(map(str, layers))}"
    return str(value)


def part_pairs(arms: Sequence[Arm]) -> list[tuple[str, Arm, Arm]]:
    """(part, arm without the change, arm with it) for every two arms at one scale whose parts differ in exactly one
    part, the earlier arm (in the comparison's order) first."""
    parts = {}
    for arm in arms:
        config = run_config(arm.runs[0])
        if config is not None:
            parts[arm.name] = effective_parts(config)
    pairs = []
    for index, first in enumerate(arms):
        for second in arms[index + 1 :]:
            if first.scale != second.scale or first.name not in parts or second.name not in parts:
                continue
            changed = [p for p in parts[first.name] if parts[first.name][p] != parts[second.name][p]]
            if len(changed) == 1:
                pairs.append((changed[0], first, second))
    return pairs


def part_effects_section(report: Report, arms: Sequence[Arm], block_size: int) -> None:
    """Each part's paired effect, at equal tokens and at equal compute: every pair of arms that differ in one part
    alone (:func:`part_pairs`); nothing when no such pair was trained."""
    pairs = part_pairs(arms)
    if not pairs:
        return
    rows = []
    for part, without, with_ in pairs:
        tokens = paired_at_equal_tokens(with_, without)
        compute = paired_at_equal_compute(with_, without, block_size)
        at_compute = compute[0] if compute is not None else []
        configs = run_config(without.runs[0]), run_config(with_.runs[0])
        before, after = (_shown(part, effective_parts(config)[part]) for config in configs)
        rows.append(
            [
                part,
                f"{before} → {after}",
                without.name,
                with_.name,
                difference_text(tokens),
                direction(tokens, "lowers the loss", "raises the loss"),
                difference_text(at_compute),
                direction(at_compute, "lowers the loss", "raises the loss"),
                str(len(tokens)),
            ]
        )
    report.heading("What each part does")
    report.paragraph(
        "Every two arms whose attention differs in one part alone (layers/parts.py; the matching rule may change "
        "the head counts with it): the second arm's loss minus the first's, seed by seed, at equal tokens (test "
        "loss) and at equal training compute (validation loss, read as in the section above), with the 95% t "
        "interval of the mean difference. A part 'lowers' or 'raises' the loss where that interval excludes 0."
    )
    report.table(
        ["part", "change", "from", "to", "Δ test loss at equal tokens [95%]", "at equal tokens",
         "Δ loss at equal compute [95%]", "at equal compute", "seeds"],
        rows,
    )  # fmt: skip
