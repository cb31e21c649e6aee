"""The runs of a comparison and its report: every (scale, variant, seed) trained alike and evaluated with the suite.

Every variant of a seed gets the same blocks in the same order (one tokenizer, one packed and needle-mixed
training set, Trainer's sampler seeded with the run seed) and the same optimizer recipe: only the attention
differs. ``--sizes`` and ``--token-budgets`` repeat this over model widths or training lengths and fit power laws.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from difftransformer.compare.document import Report, mean_spread
from difftransformer.compare.scaling import fit_power_law, matching_ratio
from difftransformer.compare.suite_report import ahead, suite_sections, suite_verdict
from difftransformer.eval.common import mean, mean_token_nll, pyplot, save_figure
from difftransformer.eval.suite import SuiteSettings, run_suite, suite_options
from difftransformer.models import DiffTransformerForCausalLM
from difftransformer.storage import read_json, write_json
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.presets import Preset
from difftransformer.train.runner import METRICS_CSV, SUMMARY_JSON, train_model
from difftransformer.train.settings import tokens_per_step

LABELS = {"diff": "DIFF", "softmax": "Transformer", "diff_v2": "DIFF V2"}


@dataclass
class RunRecord:
    """One trained model: which variant, seed and scale, where it lives, and what it scored (``suite``: what
    :func:`difftransformer.eval.suite.run_suite` returned)."""

    variant: str
    seed: int
    scale: str
    folder: Path
    parameters: int
    tokens: int
    tokens_per_second: float
    train_seconds: float
    validation_loss: float
    test_loss: float
    suite: dict

    def to_json(self) -> dict:
        """The record as JSON types (the folder as a string)."""
        return {**dataclasses.asdict(self), "folder": str(self.folder)}


def train_and_evaluate(
    data: PreparedData,
    preset: Preset,
    variant: str,
    seed: int,
    scale: str,
    folder: Path,
    settings: SuiteSettings,
    args: argparse.Namespace,
    training: dict[str, Any],
) -> RunRecord:
    """Train one model (resuming a killed run, reusing a finished one) and evaluate it on the test split: test loss
    and the evaluation suite, whose files go to FOLDER/eval/TASK/ (a task already run on this model with the same
    settings is reused from evaluation.json). ``training``: the command line's training options beyond the
    preset's (its seed replaced by ``seed``)."""
    tokenizer = data.tokenizer
    run_settings = preset.training_settings(**{**training, "output_dir": str(folder), "seed": seed})
    if not (folder / SUMMARY_JSON).is_file():
        train_model(
            preset.model_for(variant, tokenizer),
            data.train_blocks,
            data.validation_blocks[: preset.eval_blocks],
            tokenizer,
            run_settings,
            resume=True,
            progress_desc=f"{LABELS[variant]} {scale} seed {seed}",
        )
    summary = read_json(folder / SUMMARY_JSON)
    model = DiffTransformerForCausalLM.from_pretrained(folder).eval()
    trained = dict(
        parameters=summary["parameters"],
        tokens=summary["global_step"] * tokens_per_step(preset.block_size, run_settings),
        tokens_per_second=summary["tokens_per_second"],
        train_seconds=summary["train_seconds"],
        validation_loss=summary["final_eval_loss"],
    )
    previous = None
    if (folder / "evaluation.json").is_file():
        earlier = read_json(folder / "evaluation.json")
        # Only an evaluation of this very training run (same summary) may be reused.
        if all(earlier.get(key) == value for key, value in trained.items()):
            previous = earlier.get("suite")
    test_loss = mean_token_nll(
        model, data.test_blocks[: args.test_blocks], run_settings.per_device_eval_batch_size
    )
    suite = run_suite(model, tokenizer, data.test_texts, settings, folder / "eval", previous=previous)
    tqdm.write(
        f"{LABELS[variant]} {scale} seed {seed} evaluated in seconds: "
        + ", ".join(f"{task} {sec:.1f}" for task, sec in suite["seconds"].items())
    )
    record = RunRecord(
        variant=variant, seed=seed, scale=scale, folder=folder, test_loss=test_loss, suite=suite, **trained
    )
    write_json(folder / "evaluation.json", record.to_json())
    return record


def scaled_presets(
    preset: Preset, args: argparse.Namespace, training: dict[str, Any]
) -> list[tuple[str, Preset]]:
    """(label, preset) for every scale to train: the preset itself, each --sizes width, or each --token-budgets
    (``training``: the command line's other training options, which set the tokens per step with the preset's)."""
    if args.sizes and args.token_budgets:
        raise ValueError("give --sizes or --token-budgets, not both")
    if args.sizes:
        head_width = preset.hidden_size // (2 * preset.diff_heads)
        scales = []
        for width in args.sizes:
            if width < 2 * head_width or width % (2 * head_width):
                raise ValueError(
                    f"--sizes: each width must be a multiple of 2 x head width {head_width}; got {width}"
                )
            scales.append(
                (
                    f"d{width}",
                    dataclasses.replace(
                        preset,
                        hidden_size=width,
                        diff_heads=width // (2 * head_width),
                        intermediate_size=None,
                    ),
                )
            )
        return scales
    if args.token_budgets:
        settings = preset.training_settings(**{**training, "output_dir": args.output_dir})
        step_tokens = tokens_per_step(preset.block_size, settings)
        scales = []
        for tokens in args.token_budgets:
            steps = max(1, round(tokens / step_tokens))
            warmup = min(preset.training["warmup_steps"], max(1, steps // 10))
            scales.append(
                (f"t{steps * step_tokens}", preset.with_training(max_steps=steps, warmup_steps=warmup))
            )
        return scales
    return [(preset.name, preset)]


def plot_curves(records: list[RunRecord], path: Path) -> None:
    """Training loss (thin) and validation loss (markers) against step, every run overlaid."""
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"diff": "tab:red", "softmax": "tab:blue", "diff_v2": "tab:green"}
    for record in records:
        rows = read_metrics(record.folder / METRICS_CSV)
        label = f"{LABELS[record.variant]} {record.scale} s{record.seed}"
        axes[0].plot(*column(rows, "loss"), color=colors[record.variant], alpha=0.7, lw=1, label=label)
        axes[1].plot(*column(rows, "eval_loss"), "o-", color=colors[record.variant], alpha=0.8, label=label)
    for axis, title in zip(axes, ("training loss", "validation loss")):
        axis.set(xlabel="step", ylabel="loss", title=title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    save_figure(figure, path)


def plot_scaling(points: dict[str, list[tuple[float, float]]], xlabel: str, path: Path) -> dict:
    """Loss against x (log-log) per variant with its fitted power law; returns the fits."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 4.5))
    fits = {}
    for variant, pairs in points.items():
        xs, ys = zip(*pairs)
        axis.scatter(xs, ys, label=LABELS[variant])
        if len(set(xs)) >= 2:
            fits[variant] = fit_power_law(xs, ys)
            grid = [min(xs) * (max(xs) / min(xs)) ** (i / 50) for i in range(51)]
            axis.plot(grid, fits[variant](grid), lw=1)
    axis.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="test loss")
    axis.grid(alpha=0.3, which="both")
    axis.legend()
    save_figure(figure, path)
    return fits


def build_report(
    records: list[RunRecord], variants: list[str], data: PreparedData, preset: Preset, args, out: Path
) -> Report:
    """The whole report: setup, results table and verdict, loss curves, the suite's sections, scaling fits."""
    recipe = preset.training
    report = Report(f"DIFF vs Transformer: preset {preset.name}")
    report.paragraph(
        f"Corpus: {data.corpus_name}; {data.train_blocks.shape[0]} training blocks of {preset.block_size} tokens, "
        f"{data.needle_blocks} of them multi-needle retrieval examples; tokenizer vocabulary {len(data.tokenizer)}. "
        f"Every variant saw the same blocks in the same order, with the same seeds and optimizer recipe "
        f"(AdamW betas ({recipe['adam_beta1']}, {recipe['adam_beta2']}), weight decay {recipe['weight_decay']}, lr "
        f"{recipe['learning_rate']}, {recipe['warmup_steps']} warm-up steps then {recipe['lr_scheduler_type']}, "
        f"clip {recipe['max_grad_norm']}). Seeds: {sorted({r.seed for r in records})}."
    )
    report.heading("Results")
    scales = list(dict.fromkeys(r.scale for r in records))
    header = [
        "variant",
        "scale",
        "parameters",
        "tokens",
        "tokens/s",
        "validation loss",
        "test loss",
        "test perplexity",
    ]
    rows = []
    for scale in scales:
        for variant in variants:
            runs = [r for r in records if r.variant == variant and r.scale == scale]
            row = [
                LABELS[variant],
                scale,
                f"{runs[0].parameters:,}",
                f"{runs[0].tokens:,}",
                mean_spread([r.tokens_per_second for r in runs], 0),
                mean_spread([r.validation_loss for r in runs]),
                mean_spread([r.test_loss for r in runs]),
                mean_spread([math.exp(r.test_loss) for r in runs], 1),
            ]
            rows.append(row)
    report.table(header, rows)
    report.paragraph(
        "Values here and in every table below are mean ± sample standard deviation across seeds; the test "
        f"loss is over {min(args.test_blocks, data.test_blocks.shape[0])} held-out blocks."
    )
    report.paragraph(verdict(records, variants))
    plot_curves(records, out / "loss_curves.png")
    report.image("loss_curves.png", "training and validation loss, all runs overlaid")
    groups = [
        (
            LABELS[variant] + (f" {scale}" if len(scales) > 1 else ""),
            [r.suite for r in records if r.variant == variant and r.scale == scale],
        )
        for scale in scales
        for variant in variants
    ]
    suite_sections(report, groups, out)
    if len(scales) > 1:
        scaling_section(report, records, variants, out, by="parameters" if args.sizes else "tokens")
    return report


def verdict(records: list[RunRecord], variants: list[str]) -> str:
    """One sentence per measure (test loss, then every suite measure) saying which variant came out ahead,
    whichever it is; each variant's value is the mean over its runs."""
    by_variant = {LABELS[v]: [r for r in records if r.variant == v] for v in variants}
    loss = {label: mean([r.test_loss for r in runs]) for label, runs in by_variant.items()}
    suites = {label: [r.suite for r in runs] for label, runs in by_variant.items()}
    return " ".join([ahead("test loss", loss, False, 3), *suite_verdict(suites)])


def scaling_section(
    report: Report, records: list[RunRecord], variants: list[str], out: Path, by: str
) -> None:
    """Power-law fits of test loss against parameters or tokens, their plot, and how much DIFF needs to match."""
    points = {
        v: [
            (float(r.parameters if by == "parameters" else r.tokens), r.test_loss)
            for r in records
            if r.variant == v
        ]
        for v in variants
    }
    name = f"scaling_{by}.png"
    fits = plot_scaling(points, "parameters" if by == "parameters" else "training tokens", out / name)
    report.heading(f"Scaling with {by}")
    report.table(
        ["variant", "fit: loss = a * x^b", "a", "b"],
        [[LABELS[v], "", f"{f.coefficient:.4g}", f"{f.exponent:.4f}"] for v, f in fits.items()],
    )
    if "diff" in fits and "softmax" in fits:
        largest = max(x for x, _ in points["softmax"])
        ratio = matching_ratio(fits["diff"], fits["softmax"], largest)
        report.paragraph(
            f"At the largest baseline ({largest:,.0f} {by}) the fits say DIFF reaches the Transformer's loss with "
            f"{ratio:.0%} of the {by} (the paper: 62% of the parameters at 6.8B; 63.7% of the tokens)."
        )
    report.image(name, f"test loss against {by}, log-log, with power-law fits")


def run_comparison(
    data: PreparedData, preset: Preset, args: argparse.Namespace, training: dict[str, Any]
) -> Path:
    """Train and evaluate every (scale, variant, seed), write the report into ``args.output_dir``; returns the
    path of report.md. ``training``: the command line's training options beyond the preset's."""
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data.tokenizer.save_pretrained(str(out / "tokenizer"))
    seeds = args.seeds if args.seeds is not None else [training["seed"]]
    scales = []
    for scale, scaled in scaled_presets(preset, args, training):
        settings = SuiteSettings(
            tasks=args.tasks,
            context_length=scaled.block_size,
            needle_digits=scaled.needle_digits,
            needles=tuple(tuple(pair) for pair in args.needles),
            light={"needle": {"samples": args.needle_samples}},
        )
        # Refuse settings the held-out text or the tokenizer cannot serve before anything is trained.
        suite_options(settings, data.tokenizer, data.test_texts)
        scales.append((scale, scaled, settings))
    plan = [(*scale, variant, seed) for scale in scales for seed in seeds for variant in args.variants]
    records = []
    for scale, scaled, settings, variant, seed in tqdm(plan, desc="compare", unit="run"):
        folder = out / "runs" / f"{scale}-{variant}-seed{seed}"
        records.append(
            train_and_evaluate(data, scaled, variant, seed, scale, folder, settings, args, training)
        )
    write_json(out / "results.json", {"runs": [r.to_json() for r in records]})
    markdown, _ = build_report(records, args.variants, data, preset, args, out).write(out)
    return markdown
