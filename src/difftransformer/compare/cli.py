"""``difftransformer compare``: train DIFF and its matched Transformer (and DIFF V2) alike, evaluate them on the same
held-out data with the whole evaluation suite (light settings scaled to the preset), and write report.md /
report.html with PNG plots.

Options: the comparison's own first, then the preset and data options and every transformers ``TrainingArguments``
option, as for ``train`` (each run's Trainer folder is OUTPUT_DIR/runs/RUN).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from difftransformer.compare.runs import run_comparison
from difftransformer.compare.settings import DEFAULT_NEEDLES, ComparisonSettings
from difftransformer.compare.variants import Variant, parse_variants
from difftransformer.data import DataOptions
from difftransformer.errors import UsageError
from difftransformer.eval.harness import check_harness
from difftransformer.eval.needle import parse_needle_configs
from difftransformer.eval.registry import TASKS, get_task, parse_tasks
from difftransformer.flags import given
from difftransformer.train.cli import (
    add_recipe_options,
    checked_training_settings,
    resolved_preset,
    training_options,
)
from difftransformer.train.pipeline import prepare_preset_data


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} must be comma-separated integers; got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{flag} must list non-negative integers; got {text!r}")
    return values


def _variants(text: str) -> list[Variant]:
    try:
        return parse_variants(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _tasks(text: str) -> tuple[str, ...]:
    try:
        return parse_tasks(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def configure(parser: argparse.ArgumentParser) -> None:
    """The comparison's options, then the preset, data and training options shared with ``train``."""
    needle_samples = get_task("needle").light.samples
    parser.usage = (
        "%(prog)s [--output-dir DIR] [--preset NAME] [--variants VARIANTS] [--seeds SEEDS] [OPTION ...]"
    )
    own = parser.add_argument_group("comparison")
    own.add_argument("--output-dir", default="runs/compare", help="report folder (default: runs/compare)")
    own.add_argument(
        "--variants",
        type=_variants,
        default=parse_variants("diff,softmax"),
        help="models to train, comma-separated: an attention kind (diff: DIFF V1 as the paper specifies it; "
        "softmax: the matched baseline; diff_v2) with optional config overrides in parentheses, e.g. "
        "'diff,diff(subln=none),diff_v2,softmax'; each is reported under a name saying what it is, and every "
        "other variant is judged against softmax (default: diff,softmax)",
    )
    own.add_argument(
        "--init-from",
        metavar="DIR",
        help="a pretrained softmax model folder (Llama-family or ours) every variant starts from, with its "
        "tokenizer: softmax continues it as it is, diff_v2 and diff continue it upcycled (the same logits at "
        "step 0; docs/training.md); the preset gives the recipe",
    )
    own.add_argument(
        "--seeds",
        type=lambda t: _int_list(t, "--seeds"),
        default=None,
        help="train every variant once per seed and report mean ± spread, e.g. 0,1,2 (default: --seed)",
    )
    own.add_argument(
        "--sizes",
        type=lambda t: _int_list(t, "--sizes"),
        help="model widths (hidden_size) to train every variant at, with the preset's depth and head width and "
        "the same tokens each; fits loss against parameters and says how many parameters DIFF needs to match "
        "the baseline",
    )
    own.add_argument(
        "--token-budgets",
        type=lambda t: _int_list(t, "--token-budgets"),
        help="training tokens (rounded to whole steps) to train every variant for at the preset's size; fits "
        "loss against tokens",
    )
    own.add_argument(
        "--tasks",
        type=_tasks,
        default=None,
        help="evaluation tasks to run on every trained model with light settings, comma-separated: "
        f"{', '.join(TASKS)} (default: every one that fits the block size; a task named here that cannot run "
        "is refused before training)",
    )
    own.add_argument(
        "--needles",
        type=parse_needle_configs,
        default=list(DEFAULT_NEEDLES),
        help="multi-needle retrieval configurations N:R (N needles, R queried), comma-separated, for the needle "
        "task and quant's needle check (default: 1:1,2:2,4:2)",
    )
    own.add_argument(
        "--needle-samples",
        type=int,
        default=needle_samples,
        help=f"multi-needle retrieval samples per (needles, depth) cell, context = block size (default: "
        f"{needle_samples})",
    )
    own.add_argument(
        "--test-blocks",
        type=int,
        default=256,
        help="held-out test blocks for loss and perplexity (default: 256)",
    )
    own.add_argument(
        "--lm-eval-tasks",
        type=lambda text: [item.strip() for item in text.split(",") if item.strip()],
        help="lm-evaluation-harness tasks to run on every trained model as well, comma-separated (e.g. "
        "hellaswag,arc_easy; needs the lmeval extra, and the tasks' data offline or a reachable hub); their "
        "table and plot join the report",
    )
    own.add_argument(
        "--lm-eval-include",
        metavar="DIR",
        help="a folder of local lm-eval task YAML files (--lm-eval-tasks may name them; built-in tasks are then "
        "not indexed)",
    )
    own.add_argument(
        "--lm-eval-limit",
        type=float,
        help="documents per harness task (a fraction below 1 takes that share; default: all)",
    )
    own.add_argument("--lm-eval-batch-size", type=int, default=8, help="harness batch size (default: 8)")
    add_recipe_options(parser, exclude=frozenset({"output_dir"}))


def comparison_settings(args: argparse.Namespace) -> ComparisonSettings:
    """The comparison's own options from the command line (checked by :class:`ComparisonSettings`)."""
    limit = args.lm_eval_limit
    if limit is not None:
        if limit <= 0:
            raise UsageError(f"--lm-eval-limit must be > 0; got {limit}")
        limit = int(limit) if limit >= 1 else limit  # a count from 1 on, a share below
    return ComparisonSettings(
        output_dir=args.output_dir,
        variants=tuple(args.variants),
        init_from=args.init_from,
        seeds=tuple(args.seeds) if args.seeds is not None else None,
        sizes=tuple(args.sizes) if args.sizes else None,
        token_budgets=tuple(args.token_budgets) if args.token_budgets else None,
        tasks=args.tasks,
        needles=tuple(tuple(pair) for pair in args.needles),
        needle_samples=args.needle_samples,
        test_blocks=args.test_blocks,
        lm_eval_tasks=tuple(args.lm_eval_tasks) if args.lm_eval_tasks else None,
        lm_eval_include=args.lm_eval_include,
        lm_eval_limit=limit,
        lm_eval_batch_size=args.lm_eval_batch_size,
    )


def run(args: argparse.Namespace) -> int:
    """Check the flags, prepare the data (with --seed, as ``train`` does), run the comparison, print where the
    report is."""
    preset = resolved_preset(args)
    comparison = comparison_settings(args)
    data_options = DataOptions(**given(vars(args), DataOptions))
    if comparison.init_from:
        if data_options.tokenizer:
            raise UsageError(
                "--tokenizer: --init-from brings the folder's own tokenizer; give one of the two"
            )
        data_options = dataclasses.replace(data_options, tokenizer=comparison.init_from)
    if comparison.lm_eval_tasks:
        check_harness(comparison.lm_eval_include, comparison.lm_eval_batch_size)
    # --output-dir is the report's folder here; every run gets its own under it.
    training = {name: value for name, value in training_options(args).items() if name != "output_dir"}
    # Every training option is checked now, before any work (each run builds its own with its folder and seed).
    checked_training_settings(preset, output_dir=os.path.join(comparison.output_dir, "runs"), **training)
    data = prepare_preset_data(preset, data_options, training["seed"])
    markdown = run_comparison(data, preset, comparison, training)
    print(f"report: {os.path.abspath(markdown)}")
    print(f"        {os.path.abspath(markdown.with_suffix('.html'))}")
    return 0
