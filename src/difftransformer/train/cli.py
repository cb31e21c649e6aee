"""`difftransformer train`: train one DIFF, DIFF V2 or softmax language model on the built-in corpus or your text.

Under ``torchrun --nproc_per_node=N -m difftransformer train ...`` Trainer/accelerate runs DDP (gloo on CPU,
NCCL on GPU); the batch flags are per process, as in ``TrainingArguments``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from difftransformer.models import ATTENTION_KINDS
from difftransformer.train.pipeline import prepare_data
from difftransformer.train.presets import PRESETS, Preset, get_preset
from difftransformer.train.runner import TrainOptions, is_main_process, train_model

# Flags that default to the preset's value: (flag destination, type, help).
PRESET_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("max_steps", int, "optimizer steps"),
    ("per_device_train_batch_size", int, "blocks per process per micro-batch"),
    ("gradient_accumulation_steps", int, "micro-batches per optimizer step"),
    ("learning_rate", float, "peak AdamW learning rate"),
    ("warmup_steps", int, "linear warm-up steps before the decay"),
    ("weight_decay", float, "AdamW weight decay"),
    ("adam_beta1", float, "AdamW beta1"),
    ("adam_beta2", float, "AdamW beta2"),
    ("max_grad_norm", float, "gradient clipping norm"),
    ("lr_scheduler_type", str, "learning-rate decay after warm-up (transformers scheduler name)"),
    ("logging_steps", int, "log the training loss every this many steps"),
    ("eval_steps", int, "validation loss and perplexity every this many steps"),
    ("save_steps", int, "checkpoint every this many steps (and at the end)"),
    ("block_size", int, "tokens per training sequence"),
    ("vocab_size", int, "vocabulary of the BPE tokenizer trained on the data (ignored with --tokenizer)"),
    ("eval_blocks", int, "validation blocks used by the periodic evaluation (all of them when unset)"),
    ("needle_fraction", float, "share of training blocks replaced by multi-needle retrieval examples"),
    ("needle_digits", int, "digits of the magic numbers in the retrieval examples and their evaluation"),
)


def add_data_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``train`` and ``compare``."""
    parser.add_argument(
        "--preset",
        default="tiny",
        choices=sorted(PRESETS),
        help="model size and training recipe; every flag below that says 'preset' overrides one of its values "
        "(default: tiny). " + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()),
    )
    parser.add_argument(
        "--data",
        nargs="+",
        metavar="SOURCE",
        help="your own text instead of the built-in Shakespeare corpus: .txt/.md/.jsonl/.json files, globs, "
        "folders, or a datasets name where a hub is reachable",
    )
    parser.add_argument(
        "--tokenizer", metavar="DIR", help="a saved tokenizer folder to use instead of training one"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help="cache for the corpus and packed blocks (default: ~/.cache/difftransformer)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of weights, data order and needles (default: 0)"
    )
    parser.add_argument(
        "--per-device-eval-batch-size", type=int, default=16, help="blocks per evaluation batch (default: 16)"
    )
    parser.add_argument(
        "--save-total-limit", type=int, default=3, help="checkpoints kept, at least 2 (default: 3)"
    )
    parser.add_argument(
        "--report-to",
        default="tensorboard",
        choices=("tensorboard", "none"),
        help="where Trainer logs besides metrics.csv (default: tensorboard, under OUTPUT_DIR/runs)",
    )
    for name, kind, text in PRESET_FLAGS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, help=f"{text} (default: the preset's)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir", required=True, help="run folder: checkpoints, metrics.csv, final model"
    )
    parser.add_argument(
        "--attention",
        default="diff",
        choices=ATTENTION_KINDS,
        help="diff: DIFF V1 with the preset's h heads; softmax: the matched baseline (2h heads); diff_v2: DIFF V2 "
        "with the baseline's head count (default: diff)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last finished checkpoint in --output-dir (unfinished ones are set aside)",
    )
    add_data_options(parser)


def resolved_preset(args: argparse.Namespace) -> Preset:
    """The chosen preset with every flag the user gave applied."""
    preset = get_preset(args.preset)
    overrides = {name: getattr(args, name) for name, _, _ in PRESET_FLAGS if getattr(args, name) is not None}
    return dataclasses.replace(preset, **overrides)


def options_for(
    preset: Preset, args: argparse.Namespace, output_dir: str, desc: str = "train"
) -> TrainOptions:
    # The preset's recipe fields carry the TrainOptions (TrainingArguments) names: copy every one they share.
    shared = {f.name for f in dataclasses.fields(TrainOptions)} & {f.name for f in dataclasses.fields(Preset)}
    return TrainOptions(
        output_dir=output_dir,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        save_total_limit=args.save_total_limit,
        seed=args.seed,
        report_to=args.report_to,
        progress_desc=desc,
        **{name: getattr(preset, name) for name in shared},
    )


def run(args: argparse.Namespace) -> int:
    preset = resolved_preset(args)
    data = prepare_data(
        data=args.data,
        tokenizer_path=args.tokenizer,
        vocab_size=preset.vocab_size,
        block_size=preset.block_size,
        needle_fraction=preset.needle_fraction,
        needle_digits=preset.needle_digits,
        seed=args.seed,
        cache_dir=args.cache_dir,
    )
    tokenizer = data.tokenizer
    config = preset.model_config(
        args.attention,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    validation = data.validation_blocks[: preset.eval_blocks]
    result = train_model(
        config,
        data.train_blocks,
        validation,
        tokenizer,
        options_for(preset, args, args.output_dir, desc=args.attention),
        resume=args.resume,
    )
    if is_main_process():
        print(
            f"{args.attention}: {result.parameters:,} parameters, {result.global_step} steps, validation loss "
            f"{result.final_eval_loss:.4f}, {result.tokens_per_second:,.0f} tokens/s; model in "
            f"{os.path.abspath(args.output_dir)}"
        )
    return 0
