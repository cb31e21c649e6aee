"""compare's report: the paper's claims judged first, then the runs, the learning curves of the gap, the evaluation
suite's sections and the scaling fits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from difftransformer.compare.claims import (
    LOSS_CLAIM,
    Claim,
    Judgement,
    judge_claim,
    judge_ratio,
    learned_recall,
    matching_ratios,
    task_claims,
    training_claims,
)
from difftransformer.compare.document import Report, mean_spread
from difftransformer.compare.gap import gap_curves
from difftransformer.compare.length_curves import length_section
from difftransformer.compare.rates import at_rates, learning_rate_section
from difftransformer.compare.records import SweepPoint, provenance_line
from difftransformer.compare.scaling import fit_power_law, matching_ratio
from difftransformer.compare.suite_report import suite_sections
from difftransformer.compare.variants import Variant, baseline_of, parse_variant
from difftransformer.compare.verdict import AT_CHANCE, RULE
from difftransformer.eval import paper
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean, spread
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.runner import METRICS_CSV
from difftransformer.train.traces import is_trace_column

if TYPE_CHECKING:
    from difftransformer.compare.records import RunRecord
    from difftransformer.compare.settings import ComparisonSettings
    from difftransformer.train.mixture import RecallMix
    from difftransformer.train.pipeline import PreparedData
    from difftransformer.train.presets import Preset


def label(spec: str) -> str:
    """The report name of the variant ``spec`` (e.g. "diff(subln=none)" -> "DIFF (subln=none)")."""
    return parse_variant(spec).label


def _runs(records: Sequence[RunRecord], spec: str, scale: str | None = None) -> list[RunRecord]:
    """The runs of one variant (at one scale), in seed order."""
    chosen = [r for r in records if r.variant == spec and (scale is None or r.scale == scale)]
    return sorted(chosen, key=lambda r: r.seed)


def _ours(judgement: Judgement, digits: int, baseline_label: str, variant_label: str) -> str:
    return judgement.values_text(digits, variant_label, baseline_label)


def _parameters_differ(
    records: Sequence[RunRecord], variants: Sequence[Variant], reference: Sequence[RunRecord]
) -> bool:
    """Whether a variant's parameter count differs from the baseline's by more than 5% (e.g. upcycled models)."""
    return any(
        abs(_runs(records, variant.spec())[0].parameters / reference[0].parameters - 1) > 0.05
        for variant in variants
    )


def _claim_name(claim: Claim, parameters_differ: bool) -> str:
    """The claim's name; the loss claim says "equal tokens" alone where parameter counts differ."""
    if claim is LOSS_CLAIM and parameters_differ:
        return claim.name.replace("equal parameters and tokens", "equal tokens; parameters differ (above)")
    return claim.name


def claims_section(
    report: Report,
    records: Sequence[RunRecord],
    variants: Sequence[Variant],
    scale: str,
    by: str | None,
    heading: str = "The paper's claims, as measured here",
) -> None:
    """The claims table: one row per claim of the paper the runs measured (at ``scale``; the scaling rows when
    ``by`` is "parameters" or "tokens"), for every DIFF variant against the matched baseline."""
    report.heading(heading)
    baseline = baseline_of(variants)
    others = [v for v in variants if not v.is_baseline]
    if baseline is None or not others:
        report.paragraph(
            "No claim is judged: the comparison needs the matched baseline (softmax) and at least one DIFF variant."
        )
        return
    at_scale = [r for r in records if r.scale == scale]
    reference = _runs(at_scale, baseline.spec())
    seeds = sorted({r.seed for r in reference})
    diff_runs = _runs(at_scale, others[0].spec())
    report.paragraph(
        f"Ours: {diff_runs[0].parameters:,} parameters ({others[0].label}) and {reference[0].parameters:,} "
        f"({baseline.label}), {reference[0].tokens:,} training tokens, {len(seeds)} seed(s) {seeds}"
        + (f", scale {scale}" if len({r.scale for r in records}) > 1 else "")
        + ". Values are mean ± sample standard deviation across seeds. "
        + RULE
    )
    unequal = any(
        abs(_runs(at_scale, variant.spec())[0].parameters / reference[0].parameters - 1) > 0.05
        for variant in others
    )
    header = ["claim", "the paper"]
    for variant in others:
        header += [f"ours: {variant.label} vs {baseline.label}", "verdict"]
    rows = []
    claims: list[Claim] = [*training_claims(at_scale), *task_claims(at_scale)]
    for claim in claims:
        judgements = [judge_claim(claim, _runs(at_scale, variant.spec()), reference) for variant in others]
        # What chance is, said once in the row, where a verdict cell says "not measurable here".
        at_chance = any(j is not None and j.verdict.word == AT_CHANCE for j in judgements)
        name = _claim_name(claim, unequal)
        row = [f"{name} (chance: {claim.chance})" if at_chance and claim.chance else name, claim.paper]
        for variant, judgement in zip(others, judgements):
            row += (
                ["-", "-"]
                if judgement is None
                else [_ours(judgement, claim.digits, baseline.label, variant.label), judgement.verdict.word]
            )
        rows.append(row)
        if claim is LOSS_CLAIM and by is not None:
            rows.append(_scaling_row(records, others, baseline, by))
    report.table(header, rows)


def _scaling_row(
    records: Sequence[RunRecord], others: Sequence[Variant], baseline: Variant, by: str
) -> list[str]:
    name = f"{size_name(records, by)} DIFF needs for the baseline's loss (share, power-law fits per seed)"
    row = [name, paper.PARAMETERS if by == "parameters" else paper.TOKENS]
    for variant in others:
        judgement = judge_ratio(matching_ratios(records, variant.spec(), baseline.spec(), by))
        row += (
            ["-", "-"]
            if judgement is None
            else [
                f"{variant.label} {mean_spread(judgement.values, 2)} of {baseline.label}'s",
                str(judgement.verdict),
            ]
        )
    return row


def verdict_sentences(records: Sequence[RunRecord], variants: Sequence[Variant], scale: str) -> list[str]:
    """One sentence per measure (test loss, then every task measure, with or without a claim of the paper) and
    DIFF variant: both values and the verdict under the rule."""
    baseline = baseline_of(variants)
    if baseline is None:
        return ["No verdicts: the comparison has no matched baseline (softmax)."]
    at_scale = [r for r in records if r.scale == scale]
    reference = _runs(at_scale, baseline.spec())
    unequal = _parameters_differ(at_scale, [v for v in variants if not v.is_baseline], reference)
    sentences = []
    for claim in [*training_claims(at_scale), *task_claims(at_scale, with_paper_only=False)]:
        for variant in variants:
            if variant.is_baseline:
                continue
            judgement = judge_claim(claim, _runs(at_scale, variant.spec()), reference)
            if judgement is not None:
                name = _claim_name(claim, unequal)
                sentences.append(
                    f"{name[0].upper()}{name[1:]}: "
                    f"{_ours(judgement, claim.digits, baseline.label, variant.label)}, {judgement.verdict_text()}."
                )
    return sentences


def _curve(record: RunRecord, name: str) -> tuple[list[int], list[float]]:
    """(tokens seen, values) of one metrics column of a run."""
    steps, values = column(read_metrics(record.folder / METRICS_CSV), name)
    step_tokens = record.tokens / max(steps) if steps else 0
    return [round(step * step_tokens) for step in steps], values


def plot_curves(records: Sequence[RunRecord], path: Path) -> None:
    """Training loss (thin) and validation loss (markers) against tokens, every run overlaid; with a third panel
    of the MQAR probe's accuracy where runs trained with recall rows."""
    plt = pyplot()
    recall = any(_curve(record, "eval_mqar_accuracy")[0] for record in records)
    panels = [("loss", "training loss", "loss"), ("eval_loss", "validation loss", "loss")]
    if recall:
        panels.append(("eval_mqar_accuracy", "MQAR accuracy while training (4 pairs)", "accuracy"))
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5))
    colors = {spec: f"C{i}" for i, spec in enumerate(dict.fromkeys(r.variant for r in records))}
    for record in records:
        name = f"{label(record.variant)} {record.scale} s{record.seed}"
        for axis, (metric, _, _) in zip(axes, panels):
            style = dict(lw=1, alpha=0.7) if metric == "loss" else dict(marker="o", ms=3, alpha=0.8)
            axis.plot(*_curve(record, metric), color=colors[record.variant], label=name, **style)
    for axis, (_, title, unit) in zip(axes, panels):
        axis.set(xlabel="training tokens", ylabel=unit, title=title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    save_figure(figure, path)


def _trace_layers(record: RunRecord) -> tuple[str, list[int]]:
    """(kind, layer indices) of a run's lambda columns: "v1" (lambda), "v2" (mean and spread of sigmoid(lambda))
    or "" for a run without any (the baseline, or a run trained before the traces)."""
    rows = read_metrics(record.folder / METRICS_CSV)
    names = [name for name in (rows[0] if rows else {}) if is_trace_column(name)]
    v2 = [name for name in names if name.startswith("lambda_mean_layer_")]
    if v2:
        return "v2", sorted(int(name.rsplit("_", 1)[1]) for name in v2)
    return ("v1", sorted(int(name.rsplit("_", 1)[1]) for name in names)) if names else ("", [])


def lambda_section(
    report: Report, records: Sequence[RunRecord], variants: Sequence[Variant], out: Path
) -> None:
    """DIFF's lambda per layer during training (metrics.csv's traces) beside the training loss, every run
    overlaid, and a table of the final values; nothing when no run logged traces."""
    traced = {(r.variant, r.seed, r.scale): _trace_layers(r) for r in records}
    layers = sorted({layer for _, indices in traced.values() for layer in indices})
    if not layers:
        return
    plt = pyplot()
    figure, axes = plt.subplots(1, 1 + len(layers), figsize=(5.5 * (1 + len(layers)), 4.5), squeeze=False)
    colors = {spec: f"C{i}" for i, spec in enumerate(dict.fromkeys(r.variant for r in records))}
    for record in records:
        name = f"{label(record.variant)} {record.scale} s{record.seed}"
        axes[0][0].plot(*_curve(record, "loss"), color=colors[record.variant], lw=1, alpha=0.7, label=name)
        kind, indices = traced[(record.variant, record.seed, record.scale)]
        for axis, layer in zip(axes[0][1:], layers):
            if layer not in indices:
                continue
            if kind == "v1":
                axis.plot(
                    *_curve(record, f"lambda_layer_{layer}"), color=colors[record.variant], lw=1, label=name
                )
                continue
            tokens, means = _curve(record, f"lambda_mean_layer_{layer}")
            spreads = _curve(record, f"lambda_std_layer_{layer}")[1]
            axis.plot(tokens, means, color=colors[record.variant], lw=1, ls="--", label=name)
            axis.fill_between(tokens, [m - s for m, s in zip(means, spreads)],
                              [m + s for m, s in zip(means, spreads)], color=colors[record.variant], alpha=0.08)  # fmt: skip
    axes[0][0].set(xlabel="training tokens", ylabel="loss", title="training loss")
    for axis, layer in zip(axes[0][1:], layers):
        axis.set(xlabel="training tokens", ylabel="lambda", title=f"lambda, layer {layer}")
    for axis in axes[0]:
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    save_figure(figure, out / "lambda_traces.png")
    header = ["variant", *(f"layer {layer}" for layer in layers)]
    rows = []
    scales = list(dict.fromkeys(r.scale for r in records))
    for scale in scales:
        for variant in variants:
            runs = _runs(records, variant.spec(), scale)
            kind = traced[(runs[0].variant, runs[0].seed, runs[0].scale)][0]
            if not kind:
                continue
            name = "lambda_layer_{}" if kind == "v1" else "lambda_mean_layer_{}"
            # A run shorter than its logging steps logged no value: its cell says so ("-").
            finals = [
                [values[-1] for r in runs if (values := _curve(r, name.format(layer))[1])] for layer in layers
            ]
            row_label = variant.label + (f" {scale}" if len(scales) > 1 else "")
            row_label += " (mean sigmoid(lambda))" if kind == "v2" else ""
            rows.append([row_label, *(mean_spread(values, 3) for values in finals)])
    report.heading("lambda during training")
    report.paragraph(
        "DIFF V1's lambda (one scalar a layer, exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + "
        "lambda_init) and DIFF V2's per-token, per-head sigmoid(lambda) (dashed: its mean over the training "
        "tokens between two logging steps, the band ± its standard deviation over those tokens and heads), "
        "beside the training loss; from each run's metrics.csv. The table gives the last logged value, mean ± "
        "spread across seeds"
        + (
            "."
            if any(cell != "-" for row in rows for cell in row[1:])
            else "; no run logged lambda (each ended before its first logging step: `logging_steps`)."
        )
    )
    report.table(header, rows)
    report.image("lambda_traces.png", "lambda per layer during training, beside the training loss")


def gap_section(
    report: Report, records: Sequence[RunRecord], variants: Sequence[Variant], scale: str, out: Path
) -> None:
    """Each DIFF variant's validation loss minus the baseline's against tokens (mean and spread over seeds)."""
    baseline = baseline_of(variants)
    if baseline is None:
        return
    at_scale = [r for r in records if r.scale == scale]
    curves = {
        spec: {r.seed: list(zip(*_curve(r, "eval_loss"))) for r in _runs(at_scale, spec)}
        for spec in dict.fromkeys(r.variant for r in at_scale)
    }
    gaps = gap_curves(curves, baseline.spec())
    if not any(gaps.values()):  # no other variant, or no validation loss logged at a common step
        return
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    lines = []
    for spec, points in gaps.items():
        if not points:
            continue
        tokens, means, spreads = zip(*points)
        axis.plot(tokens, means, "o-", label=label(spec))
        if all(s is not None for s in spreads):
            low = [m - s for m, s in zip(means, spreads)]
            high = [m + s for m, s in zip(means, spreads)]
            axis.fill_between(tokens, low, high, alpha=0.2)
        lines.append(
            f"{label(spec)}: {means[0]:+.3f} after {tokens[0]:,} tokens, {means[-1]:+.3f} after {tokens[-1]:,}"
        )
    axis.axhline(0, color="gray", lw=1)
    axis.set(
        xlabel="training tokens",
        ylabel=f"validation loss minus {baseline.label}'s",
        title="the gap during training (below 0: ahead of the baseline)",
    )
    axis.grid(alpha=0.3)
    axis.legend()
    save_figure(figure, out / "gap_curves.png")
    report.heading("The gap during training")
    report.paragraph(
        "Validation loss of each DIFF variant minus the baseline's at the same step and seed; the line is the mean "
        "over seeds and the band ± one sample standard deviation. Small-scale studies see the sign change with "
        "training length, so the final value alone can mislead. " + "; ".join(lines) + "."
    )
    report.image("gap_curves.png", "validation-loss gap to the baseline against training tokens")


def harness_section(
    report: Report, records: Sequence[RunRecord], variants: Sequence[Variant], out: Path
) -> None:
    """lm-evaluation-harness metrics of every run (``compare --lm-eval-tasks``): a table of each task's metrics
    (standard errors left out) as mean ± spread across seeds, and a bar chart."""
    if not all(r.harness for r in records):
        return
    first = records[0].harness
    columns = [
        (task, metric)
        for task, metrics in first["metrics"].items()
        for metric, value in metrics.items()
        if not metric.endswith("_stderr") and value is not None
    ]
    scales = list(dict.fromkeys(r.scale for r in records))
    groups = [
        (variant.label + (f" {scale}" if len(scales) > 1 else ""), _runs(records, variant.spec(), scale))
        for scale in scales
        for variant in variants
    ]

    def values(runs: Sequence[RunRecord], task: str, metric: str) -> list[float]:
        return [
            r.harness["metrics"][task][metric]
            for r in runs
            if r.harness["metrics"][task].get(metric) is not None
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
        [[name, *(mean_spread(values(runs, t, m), 3) for t, m in columns)] for name, runs in groups],
    )
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(max(6, 1.6 * len(columns) + 2), 4))
    width = 0.8 / len(groups)
    for i, (name, runs) in enumerate(groups):
        series = [values(runs, t, m) for t, m in columns]
        axis.bar([j + i * width for j in range(len(columns))], [mean(s) if s else 0.0 for s in series], width,
                 yerr=[spread(s) for s in series] if len(runs) > 1 else None, label=name)  # fmt: skip
    axis.set_xticks([j + 0.4 - width / 2 for j in range(len(columns))], [f"{t}\n{m}" for t, m in columns])
    axis.grid(alpha=0.3, axis="y")
    axis.legend()
    save_figure(figure, out / "lm_eval.png")
    report.image("lm_eval.png", "lm-evaluation-harness metrics per variant")


def plot_scaling(points: dict[str, list[tuple[float, float]]], xlabel: str, path: Path) -> dict:
    """Loss against x (log-log) per variant spec: the mean over seeds at each x with a band of ± one sample
    standard deviation, and the power law fitted to every seed's point; returns the fits."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 4.5))
    fits = {}
    for i, (spec, pairs) in enumerate(points.items()):
        xs = sorted({x for x, _ in pairs})
        by_x = [[y for x_, y in pairs if x_ == x] for x in xs]
        means = [mean(ys) for ys in by_x]
        axis.plot(xs, means, "o", color=f"C{i}", label=label(spec))
        if all(len(ys) > 1 for ys in by_x):
            low = [m - spread(ys) for m, ys in zip(means, by_x)]
            high = [m + spread(ys) for m, ys in zip(means, by_x)]
            axis.fill_between(xs, low, high, color=f"C{i}", alpha=0.2)
        if len(xs) >= 2:
            fits[spec] = fit_power_law(*zip(*pairs))
            grid = [min(xs) * (max(xs) / min(xs)) ** (j / 50) for j in range(51)]
            axis.plot(grid, fits[spec](grid), color=f"C{i}", lw=1)
    axis.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="test loss")
    axis.grid(alpha=0.3, which="both")
    axis.legend()
    save_figure(figure, path)
    return fits


def size_name(records: Sequence[RunRecord], by: str) -> str:
    """What :meth:`RunRecord.size` measures for ``by`` in these records, in words."""
    if by == "tokens":
        return "training tokens"
    kept = all(r.layer_parameters is not None for r in records)
    return "parameters in the decoder layers" if kept else "parameters"


def scaling_section(
    report: Report, records: Sequence[RunRecord], variants: Sequence[Variant], out: Path, by: str
) -> None:
    """Power-law fits of test loss against parameters or tokens (all seeds pooled), their plot, and how much each
    DIFF variant needs to match the baseline."""
    points = {
        v.spec(): [(r.size(by), r.test_loss) for r in records if r.variant == v.spec()] for v in variants
    }
    name = f"scaling_{by}.png"
    axis_name = size_name(records, by)
    fits = plot_scaling(points, axis_name, out / name)
    report.heading(f"Scaling with {by}")
    report.table(
        ["variant", "fit: loss = a * x^b", "a", "b"],
        [[label(spec), "", f"{f.coefficient:.4g}", f"{f.exponent:.4f}"] for spec, f in fits.items()],
    )
    reference = baseline_of(variants)
    baseline = reference.spec() if reference is not None else None
    if baseline in fits:
        largest = max(x for x, _ in points[baseline])
        shares = [
            f"{label(spec)} {matching_ratio(fit, fits[baseline], largest):.0%}"
            for spec, fit in fits.items()
            if spec != baseline
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


def _schedule_text(mix: RecallMix, block_size: int) -> str:
    """How the training rows grew along a length schedule, for the setup paragraph ("" without one)."""
    if not mix.length_schedule:
        return ""
    stages = []
    for step, length in mix.length_schedule:
        low, high = mix.pairs_at(length, block_size)
        stages.append(
            f"{length} tokens from step {step}" + (f" ({low}-{high} MQAR pairs)" if mix.mqar_fraction else "")
        )
    grown = ", then ".join(stages)
    return f"; the rows grew with the step (a length curriculum): {grown}, text blocks cut to that length"


def build_report(
    records: list[RunRecord],
    variants: Sequence[Variant],
    data: PreparedData,
    preset: Preset,
    comparison: ComparisonSettings,
    out: Path,
    sweep: Sequence[SweepPoint] = (),
    shared_rate: float | None = None,
    best: dict[tuple[str, str], float] | None = None,
) -> Report:
    """The whole report: the claims table and the verdict rule, setup, results table and verdicts, loss and gap
    curves, the suite's sections, scaling fits. With a learning-rate ``sweep``, ``records`` hold every seed at the
    ``shared_rate`` and at each arm's ``best``: the claims are judged at both, the learning-rate section follows the
    results, and the sections after it read the runs at each arm's best rate."""
    scales = list(dict.fromkeys(r.scale for r in records))
    by = ("parameters" if comparison.sizes else "tokens") if len(scales) > 1 else None
    # Claims and verdicts read the largest scale: the model or budget closest to the paper's.
    largest = max(scales, key=lambda s: max((r.parameters, r.tokens) for r in records if r.scale == s))
    names = " vs ".join(v.label for v in variants)
    report = Report(f"{names}: preset {preset.name}")
    report.paragraph(provenance_line(records))
    every = records
    if sweep and any(rate != shared_rate for rate in best.values()):
        shared, records = at_rates(every, shared_rate), at_rates(every, best)
        claims_section(report, shared, variants, largest, by,
                       heading=f"The paper's claims at the shared learning rate {shared_rate:g} (every arm alike)")  # fmt: skip
        claims_section(report, records, variants, largest, by,
                       heading="The paper's claims, each arm at its own best learning rate")  # fmt: skip
    elif sweep:
        records = at_rates(every, shared_rate)
        claims_section(report, records, variants, largest, by,
                       heading=f"The paper's claims at the shared learning rate {shared_rate:g}, every arm's best")  # fmt: skip
    else:
        claims_section(report, records, variants, largest, by)
    recipe = preset.training
    report.heading("Setup")
    report.paragraph(
        f"Corpus: {data.corpus_name}; {data.train_blocks.shape[0]} training blocks of {preset.block_size} tokens"
        + "".join(
            f"; {share:.0%} of the rows served were {what}"
            for share, what in (
                (data.recall.needle_fraction, "multi-needle retrieval examples"),
                (
                    data.recall.mqar_fraction,
                    f"MQAR rows ({data.recall.mqar_pairs[0]}-{data.recall.mqar_pairs[1]} "
                    "key-value pairs, loss on the answers only)",
                ),
                (
                    data.recall.induction_fraction,
                    "induction rows (a random segment repeated, loss on the repeat)",
                ),
            )
            if share
        )
        + _schedule_text(data.recall, preset.block_size)
        + f"; tokenizer vocabulary {len(data.tokenizer)}. "
        f"Every variant saw the same blocks in the same order, with the same seeds and optimizer recipe "
        f"(AdamW betas ({recipe['adam_beta1']}, {recipe['adam_beta2']}), weight decay {recipe['weight_decay']}, lr "
        f"{recipe['learning_rate']}, {recipe['warmup_steps']} warm-up steps then {recipe['lr_scheduler_type']}, "
        f"clip {recipe['max_grad_norm']}). Seeds: {sorted({r.seed for r in records})}. Variants: "
        + "; ".join(f"{v.label} = `{v.spec()}`" for v in variants)
        + "."
    )
    report.heading("Results")
    header = ["variant", "scale", *(["learning rate"] if sweep else []), "parameters", "tokens", "tokens/s",
              "validation loss", "test loss", "test perplexity"]  # fmt: skip
    rows = []
    for scale in scales:
        for variant in variants:
            runs = _runs(every, variant.spec(), scale)
            for rate in dict.fromkeys(r.learning_rate for r in runs):
                at_rate = [r for r in runs if r.learning_rate == rate]
                rows.append(
                    [
                        variant.label,
                        scale,
                        *(
                            [
                                f"{rate:g}"
                                + (" (its best)" if best.get((scale, variant.spec())) == rate else "")
                            ]
                            if sweep
                            else []
                        ),  # fmt: skip
                        f"{at_rate[0].parameters:,}",
                        f"{at_rate[0].tokens:,}",
                        mean_spread([r.tokens_per_second for r in at_rate], 0),
                        mean_spread([r.validation_loss for r in at_rate]),
                        mean_spread([r.test_loss for r in at_rate]),
                        mean_spread([math.exp(r.test_loss) for r in at_rate], 1),
                    ]
                )
    report.table(header, rows)
    report.paragraph(
        "Values here and in every table below are mean ± sample standard deviation across seeds; the test "
        f"loss is over {min(comparison.test_blocks, data.test_blocks.shape[0])} held-out blocks."
    )
    if sweep:
        learning_rate_section(report, sweep, best, shared_rate, out, comparison.rate_choice)
        report.paragraph("The sections below read every arm's runs at its own best learning rate.")
    report.paragraph(" ".join(verdict_sentences(records, variants, largest)))
    plot_curves(records, out / "loss_curves.png")
    report.image("loss_curves.png", "training and validation loss (and MQAR accuracy), all runs overlaid")
    lambda_section(report, records, variants, out)
    gap_section(report, records, variants, largest, out)
    arms = [
        (variant.label + (f" {scale}" if len(scales) > 1 else ""), _runs(records, variant.spec(), scale))
        for scale in scales
        for variant in variants
    ]
    groups = [(name, [r.suite for r in runs]) for name, runs in arms]
    learned = [[learned_recall(r.folder) for r in runs] for _, runs in arms]
    length_section(report, groups, preset.block_size, out, preset.length_schedule, learned)
    suite_sections(report, groups, out)
    harness_section(report, records, variants, out)
    if by is not None:
        scaling_section(report, records, variants, out, by)
    return report
