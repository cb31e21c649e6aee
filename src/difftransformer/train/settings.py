"""Every training setting, declared once: transformers' ``TrainingArguments`` with our defaults, and our own options.

:class:`TrainingSettings` *is* ``TrainingArguments`` (every option under its own name, so a new transformers option
reaches ``train`` and ``compare`` without a change here); it differs only where our runs need it, each difference
documented on the field and in docs/training.md. A preset (:mod:`difftransformer.train.presets`) sets some of its
fields; every field no preset sets keeps transformers' default. :class:`PresetOptions` and :class:`DataOptions` are
our own options. :func:`add_options` turns these dataclasses into command-line flags with transformers'
``HfArgumentParser`` (``--name`` and ``--name-with-dashes``); :func:`given` reads back what a command line set.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import HfArgumentParser, TrainingArguments
from transformers.hf_argparser import string_to_bool
from transformers.trainer_utils import IntervalStrategy


@dataclass
class TrainingSettings(TrainingArguments):
    """``TrainingArguments`` with the defaults our runs need (see each field); ``bf16`` and ``use_cpu`` left unset
    are decided from the hardware, and ``data_seed`` left unset is ``seed``."""

    _argument_group_name = "transformers TrainingArguments (every option; a preset sets some defaults)"

    output_dir: str = field(metadata={"help": "run folder: checkpoints, metrics.csv, the final model"})
    seed: int = field(default=0, metadata={"help": "seed of the weights, the data order and the needles"})
    eval_strategy: IntervalStrategy | str = field(
        default="steps", metadata={"help": "validation every eval_steps (ours; transformers: no)"}
    )
    per_device_eval_batch_size: int = field(default=16, metadata={"help": "blocks per evaluation batch"})
    save_total_limit: int | None = field(
        default=3,
        metadata={"help": "checkpoints kept, at least 2 so that a kill during a save leaves a finished one"},
    )
    report_to: None | str | list[str] = field(
        default="tensorboard",
        metadata={
            "help": "where Trainer logs besides metrics.csv: an integration name or none (ours: tensorboard)"
        },
    )
    disable_tqdm: bool | None = field(
        default=True, metadata={"help": "Trainer's own bar (ours replaces it: a bar with loss and tokens/s)"}
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False, metadata={"help": "every parameter gets a gradient: DDP need not search (ours: False)"}
    )
    bf16: bool | None = field(
        default=None,
        metadata={"help": "bfloat16 mixed precision (unset: on a GPU that supports it, else off)"},
    )
    use_cpu: bool | None = field(
        default=None, metadata={"help": "train on the CPU (unset: when no CUDA GPU is visible)"}
    )

    def __post_init__(self) -> None:
        on_gpu = torch.cuda.is_available()
        if self.use_cpu is None:
            self.use_cpu = not on_gpu
        if self.bf16 is None:
            self.bf16 = on_gpu and torch.cuda.is_bf16_supported()
        if self.data_seed is None:
            self.data_seed = self.seed
        for name in (
            "max_steps",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "logging_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        for name in ("eval_steps", "save_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.save_total_limit is not None and self.save_total_limit < 2:
            raise ValueError(
                f"save_total_limit must be >= 2 (one finished checkpoint survives a kill); got {self.save_total_limit}"
            )
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0; got {self.learning_rate}")
        super().__post_init__()


@dataclass
class PresetOptions:
    """The model and the recipe: a preset, and the preset values a flag may override (unset: the preset's)."""

    _argument_group_name = "preset and model"

    preset: str = field(
        default="tiny",
        metadata={"help": "model size and training recipe, one of those listed below (default: tiny)"},
    )
    block_size: int | None = field(
        default=None, metadata={"help": "tokens per training sequence (default: the preset's)"}
    )
    vocab_size: int | None = field(
        default=None,
        metadata={
            "help": "vocabulary of the BPE tokenizer trained on the data, not with --tokenizer (default: the preset's)"
        },
    )
    eval_blocks: int | None = field(
        default=None,
        metadata={
            "help": "validation blocks of the periodic evaluation (default: the preset's; all if it sets none)"
        },
    )
    needle_fraction: float | None = field(
        default=None,
        metadata={
            "help": "share of training blocks replaced by multi-needle retrieval examples (default: the preset's)"
        },
    )
    mqar_fraction: float | None = field(
        default=None,
        metadata={
            "help": "share of training rows replaced by MQAR rows: key-value pairs, then queries, loss on the "
            "answers only (default: the preset's)"
        },
    )
    induction_fraction: float | None = field(
        default=None,
        metadata={
            "help": "share of training rows replaced by induction rows (a random segment repeated), which teach "
            "small models the recall MQAR asks for (default: the preset's)"
        },
    )
    needle_digits: int | None = field(
        default=None,
        metadata={
            "help": "digits of the magic numbers in the retrieval blocks and their evaluation (default: the preset's)"
        },
    )
    max_position_embeddings: int | None = field(
        default=None,
        metadata={
            "help": "longest sequence the saved model admits (unset: the block size it was trained on)"
        },
    )


@dataclass
class DataOptions:
    """Where the text and the tokenizer come from."""

    _argument_group_name = "data"

    data: list[str] | None = field(
        default=None,
        metadata={"help": "your own text instead of the built-in Shakespeare corpus: .txt/.md/.jsonl/.json/"
                  ".parquet files, globs, folders, or a datasets name where a hub is reachable"},
    )  # fmt: skip
    tokenizer: str | None = field(
        default=None, metadata={"help": "a saved tokenizer folder instead of training one"}
    )
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "cache for the corpus and packed blocks (default: $DIFFTRANSFORMER_CACHE, else "
                  "$XDG_CACHE_HOME/difftransformer, else ~/.cache/difftransformer)"},
    )  # fmt: skip
    num_proc: int | None = field(
        default=None,
        metadata={"help": "worker processes that tokenise uncached data (default: the CPU count)"},
    )


def add_options(
    parser: argparse.ArgumentParser,
    dataclass_type: type,
    *,
    preset_fields: frozenset[str] = frozenset(),
    exclude: frozenset[str] = frozenset(),
) -> None:
    """Add ``dataclass_type``'s fields to ``parser`` as transformers' ``HfArgumentParser`` derives them (one
    argument group per dataclass). Fields in ``preset_fields`` default to the preset's value: they are left out of
    the parsed namespace unless given (see :func:`given`). Fields in ``exclude`` get no flag. An optional boolean
    (``--bf16``, ``--gradient-checkpointing``) may be given bare, meaning true."""
    source = HfArgumentParser(dataclass_type, add_help=False)
    for action in source._actions:
        if action.dest in preset_fields:
            action.default = argparse.SUPPRESS
            action.help = f"{action.help or ''} (default: the preset's)".strip()
        if action.type is string_to_bool and action.nargs is None:
            action.nargs, action.const = "?", True
    for group in source._action_groups:
        group._group_actions[:] = [a for a in group._group_actions if a.dest not in exclude]
    source._actions[:] = [a for a in source._actions if a.dest not in exclude]
    parser._add_container_actions(source)  # what argparse's ``parents=`` does


def given(args: argparse.Namespace, dataclass_type: type) -> dict[str, Any]:
    """The fields of ``dataclass_type`` present in ``args`` (for preset fields: only those the user gave)."""
    return {
        f.name: getattr(args, f.name) for f in dataclasses.fields(dataclass_type) if hasattr(args, f.name)
    }


def tokens_per_step(block_size: int, settings: TrainingArguments) -> int:
    """Tokens in one optimizer step's global batch (every process, every accumulated micro-batch)."""
    return (
        block_size
        * settings.per_device_train_batch_size
        * settings.gradient_accumulation_steps
        * settings.world_size
    )
