"""`difftransformer compare`: train DIFF and its matched Transformer (and DIFF V2) alike, evaluate them on the same
held-out data with the whole evaluation suite (light settings scaled to the preset), and write report.md /
report.html with PNG plots.

Every variant of a seed gets the same blocks in the same order (one tokenizer, one packed and needle-mixed
training set, Trainer's sampler seeded with the run seed) and the same optimizer recipe: only the attention
differs. ``--sizes`` and ``--token-budgets`` repeat this over model widths or training lengths and fit power laws.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from difftransformer.eval.cli import TASKS
from difftransformer.eval.common import pyplot, read_json, save_figure, write_json
from difftransformer.eval.needle import parse_needle_configs
from difftransformer.models import ATTENTION_KINDS, DiffTransformerForCausalLM
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.cli import add_data_options, options_for, resolved_preset
from difftransformer.train.pipeline import PreparedData, prepare_data
from difftransformer.train.presets import Preset
from difftransformer.train.report import Report, mean_spread
from difftransformer.train.runner import METRICS_CSV, SUMMARY_JSON, train_model
from difftransformer.train.scaling import fit_power_law, matching_ratio
from difftransformer.train.suite import SuiteSettings, parse_tasks, run_suite, suite_options
from difftransformer.train.suite_report import ahead, suite_sections, suite_verdict

LABELS = {"diff": "DIFF", "softmax": "Transformer", "diff_v2": "DIFF V2"}


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} must be comma-separated integers; got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{flag} must list non-negative integers; got {text!r}")
    return values


def _variants(text: str) -> list[str]:
    variants = [item.strip() for item in text.split(",") if item.strip()]
    bad = [v for v in variants if v not in ATTENTION_KINDS]
    if bad or not variants or len(set(variants)) != len(variants):
        raise argparse.ArgumentTypeError(
            f"--variants must be distinct names from {ATTENTION_KINDS}; got {text!r}"
        )
    return variants


def _tasks(text: str) -> tuple[str, ...]:
    try:
        return parse_tasks(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default="runs/compare", help="report folder (default: runs/compare)")
    parser.add_argument(
        "--variants",
        type=_variants,
        default=["diff", "softmax"],
        help="attention kinds to train, comma-separated: diff, softmax (the matched baseline), diff_v2 "
        "(default: diff,softmax)",
    )
    parser.add_argument(
        "--seeds",
        type=lambda t: _int_list(t, "--seeds"),
        default=None,
        help="train every variant once per seed and report mean ± spread, e.g. 0,1,2 (default: --seed)",
    )
    parser.add_argument(
        "--sizes",
        type=lambda t: _int_list(t, "--sizes"),
        help="model widths (hidden_size) to train every variant at, with the preset's depth and head width and "
        "the same tokens each; fits loss against parameters and says how many parameters DIFF needs to match "
        "the baseline",
    )
    parser.add_argument(
        "--token-budgets",
        type=lambda t: _int_list(t, "--token-budgets"),
        help="training tokens (rounded to whole steps) to train every variant for at the preset's size; fits "
        "loss against tokens",
    )
    parser.add_argument(
        "--tasks",
        type=_tasks,
        default=TASKS,
        help="evaluation tasks to run on every trained model with light settings, comma-separated: "
        f"{', '.join(TASKS)} (default: all)",
    )
    parser.add_argument(
        "--needles",
        type=parse_needle_configs,
        default=[(1, 1), (2, 2), (4, 2)],
        help="multi-needle retrieval configurations N:R (N needles, R queried), comma-separated, for the needle "
        "task and quant's needle check (default: 1:1,2:2,4:2)",
    )
    parser.add_argument(
        "--needle-samples",
        type=int,
        default=SuiteSettings.needle_samples,
        help="multi-needle retrieval samples per (needles, depth) cell, context = block size "
        f"(default: {SuiteSettings.needle_samples})",
    )
    parser.add_argument(
        "--test-blocks",
        type=int,
        default=256,
        help="held-out test blocks for loss and perplexity (default: 256)",
    )
    add_data_options(parser)


@dataclass
class RunRecord:
    """One trained model: which variant, seed and scale, where it lives, and what it scored (``suite``: what
    :func:`difftransformer.train.suite.run_suite` returned)."""

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
        return {**dataclasses.asdict(self), "folder": str(self.folder)}


@torch.no_grad()
def mean_loss(model: DiffTransformerForCausalLM, blocks: torch.Tensor, batch_size: int = 16) -> float:
    """Token-averaged next-token loss over ``blocks`` (n, T)."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, blocks.shape[0], batch_size):
        batch = blocks[start : start + batch_size]
        loss = model(batch, labels=batch).loss.item()
        tokens = batch.shape[0] * (batch.shape[1] - 1)
        total, count = total + loss * tokens, count + tokens
    return total / count


def train_and_evaluate(
    data: PreparedData,
    preset: Preset,
    variant: str,
    seed: int,
    scale: str,
    folder: Path,
    settings: SuiteSettings,
    args: argparse.Namespace,
) -> RunRecord:
    """Train one model (resuming a killed run, reusing a finished one) and evaluate it on the test split: test loss
    and the evaluation suite, whose files go to FOLDER/eval/TASK/ (a task already run on this model with the same
    settings is reused from evaluation.json)."""
    tokenizer = data.tokenizer
    if not (folder / SUMMARY_JSON).is_file():
        config = preset.model_config(
            variant,
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        run_args = argparse.Namespace(**{**vars(args), "seed": seed})
        train_model(
            config,
            data.train_blocks,
            data.validation_blocks[: preset.eval_blocks],
            tokenizer,
            options_for(preset, run_args, str(folder), desc=f"{LABELS[variant]} {scale} seed {seed}"),
            resume=True,
        )
    summary = read_json(folder / SUMMARY_JSON)
    model = DiffTransformerForCausalLM.from_pretrained(folder).eval()
    trained = dict(
        parameters=summary["parameters"],
        tokens=summary["global_step"] * preset.tokens_per_step(),
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
    test_loss = mean_loss(model, data.test_blocks[: args.test_blocks], args.per_device_eval_batch_size)
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


def scaled_presets(preset: Preset, args: argparse.Namespace) -> list[tuple[str, Preset]]:
    """(label, preset) for every scale to train: the preset itself, each --sizes width, or each --token-budgets."""
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
        scales = []
        for tokens in args.token_budgets:
            steps = max(1, round(tokens / preset.tokens_per_step()))
            scaled = dataclasses.replace(
                preset, max_steps=steps, warmup_steps=min(preset.warmup_steps, max(1, steps // 10))
            )
            scales.append((f"t{steps * preset.tokens_per_step()}", scaled))
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
):
    report = Report(f"DIFF vs Transformer: preset {preset.name}")
    report.paragraph(
        f"Corpus: {data.corpus_name}; {data.train_blocks.shape[0]} training blocks of {preset.block_size} tokens, "
        f"{data.needle_blocks} of them multi-needle retrieval examples; tokenizer vocabulary {len(data.tokenizer)}. "
        f"Every variant saw the same blocks in the same order, with the same seeds and optimizer recipe "
        f"(AdamW betas ({preset.adam_beta1}, {preset.adam_beta2}), weight decay {preset.weight_decay}, lr "
        f"{preset.learning_rate}, {preset.warmup_steps} warm-up steps then {preset.lr_scheduler_type}, clip "
        f"{preset.max_grad_norm}). Seeds: {sorted({r.seed for r in records})}."
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
    loss = {label: sum(r.test_loss for r in runs) / len(runs) for label, runs in by_variant.items()}
    suites = {label: [r.suite for r in runs] for label, runs in by_variant.items()}
    return " ".join([ahead("test loss", loss, False, 3), *suite_verdict(suites)])


def scaling_section(
    report: Report, records: list[RunRecord], variants: list[str], out: Path, by: str
) -> None:
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


def run_comparison(data: PreparedData, preset: Preset, args: argparse.Namespace) -> Path:
    """Train and evaluate every (scale, variant, seed), write the report into ``args.output_dir``; returns the
    path of report.md."""
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data.tokenizer.save_pretrained(str(out / "tokenizer"))
    seeds = args.seeds if args.seeds is not None else [args.seed]
    scales = []
    for scale, scaled in scaled_presets(preset, args):
        settings = SuiteSettings.for_preset(
            scaled, tasks=args.tasks, needles=tuple(args.needles), needle_samples=args.needle_samples
        )
        # Refuse settings the held-out text or the tokenizer cannot serve before anything is trained.
        suite_options(settings, data.tokenizer, data.test_texts)
        scales.append((scale, scaled, settings))
    plan = [(*scale, variant, seed) for scale in scales for seed in seeds for variant in args.variants]
    records = []
    for scale, scaled, settings, variant, seed in tqdm(plan, desc="compare", unit="run"):
        folder = out / "runs" / f"{scale}-{variant}-seed{seed}"
        records.append(train_and_evaluate(data, scaled, variant, seed, scale, folder, settings, args))
    write_json(out / "results.json", {"runs": [r.to_json() for r in records]})
    markdown, _ = build_report(records, args.variants, data, preset, args, out).write(out)
    return markdown


def run(args: argparse.Namespace) -> int:
    preset = resolved_preset(args)
    if args.needle_samples < 1:
        raise ValueError(
            f"--needle-samples must be >= 1 (leave needle out of --tasks to skip it); got {args.needle_samples}"
        )
    data = prepare_data(
        data=args.data,
        tokenizer_path=args.tokenizer,
        vocab_size=preset.vocab_size,
        block_size=preset.block_size,
        needle_fraction=preset.needle_fraction,
        needle_digits=preset.needle_digits,
        seed=0,
        cache_dir=args.cache_dir,
    )
    markdown = run_comparison(data, preset, args)
    print(f"report: {os.path.abspath(markdown)}")
    print(f"        {os.path.abspath(markdown.with_suffix('.html'))}")
    return 0
