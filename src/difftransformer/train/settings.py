"""Every training setting, declared once: transformers' ``TrainingArguments`` with our defaults, and our own options.

:class:`TrainingSettings` *is* ``TrainingArguments`` (every option under its own name, so a new transformers option
reaches ``train`` and ``compare`` without a change here); it differs only where our runs need it, each difference
documented on the field and in docs/training.md. A preset (:mod:`difftransformer.train.presets`) sets some of its
fields; every field no preset sets keeps transformers' default. :class:`PresetOptions` holds our own
options of the model and recipe (the data options, shared with ``prepare``, are
:class:`difftransformer.data.options.DataOptions`).
:mod:`difftransformer.flags` turns these dataclasses into command-line flags (transformers' ``HfArgumentParser``:
``--name`` and ``--name-with-dashes``) and reads back what a command line set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import TrainingArguments
from transformers.trainer_utils import IntervalStrategy

from difftransformer.data.tokenizer import MIN_VOCAB_SIZE
from difftransformer.errors import UsageError, check_seed
from difftransformer.flags import integer_pairs
from difftransformer.models import ATTENTION_KINDS, PART_FIELDS

# TrainingSettings fields that, left unset, are decided from the hardware of the machine a run trains on.
HARDWARE_DEFAULTS = frozenset({"use_cpu", "bf16"})


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
                raise UsageError(f"`{name}` must be >= 1; got {getattr(self, name)}")
        for name in ("eval_steps", "save_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UsageError(f"`{name}` must be >= 1; got {getattr(self, name)}")
        if self.save_total_limit is not None and self.save_total_limit < 2:
            raise UsageError(
                f"`save_total_limit` must be >= 2 (one finished checkpoint survives a kill); got {self.save_total_limit}"
            )
        if self.learning_rate <= 0:
            raise UsageError(f"`learning_rate` must be > 0; got {self.learning_rate}")
        check_seed(self.seed)
        check_seed(self.data_seed, "data_seed")
        super().__post_init__()


@dataclass(frozen=True)
class RunOptions:
    """``train``'s own options: the attention kind, a model to start from, and whether to resume."""

    _argument_group_name = "run"

    attention: Literal[ATTENTION_KINDS] | None = field(
        default=None,
        metadata={"help": "diff: DIFF V1 with the preset's h heads; softmax: the matched baseline (2h heads); "
                  "the others matched to it by their parts' rule: diff_v2: DIFF V2, gated: gated attention, gda: "
                  "grouped differential attention (--gda-ratio signal heads a noise map), motif: Motif-3's attention "
                  "(docs/architecture.md) (default: diff; with --init-from, the folder's kind)"},
    )  # fmt: skip
    # The attention's parts (layers/parts.py), each moving the kind along one part; unset: the kind's. The same
    # names are the configuration's fields and compare's variant overrides (diff_v2(output_gate=elementwise)).
    map_layout: Literal["split", "whole"] | None = field(
        default=None,
        metadata={"help": "map layout: split (DIFF V1's half-width maps) or whole (query heads)"},
    )
    gda_ratio: int | None = field(
        default=None,
        metadata={"help": "signal heads per noise map (GDA: the paper finds 3 and 4 best; Motif: 4)"},
    )  # fmt: skip
    lambda_mode: Literal["scalar", "token"] | None = field(
        default=None, metadata={"help": "the noise map's weight: scalar (DIFF V1) or token (DIFF V2, Motif)"}
    )
    subln: Literal["affine", "plain", "none"] | None = field(
        default=None, metadata={"help": "the per-head norm: affine, plain (no gain) or none"}
    )
    output_gate: Literal["none", "elementwise"] | None = field(
        default=None, metadata={"help": "the output gate: elementwise (gated attention, Motif) or none"}
    )
    sliding_window: int | None = field(
        default=None,
        metadata={"help": "keys a windowed layer's query sees, itself included (Motif: 129)"},
    )  # fmt: skip
    sliding_window_period: int | None = field(
        default=None,
        metadata={"help": "windowed layers: 0 every layer, P all but every P-th from layer 0 (Motif: 4; 1: none)"},
    )  # fmt: skip
    init_from: str | None = field(
        default=None,
        metadata={"help": "start from a saved model folder: its weights, config and tokenizer (a softmax or "
                  "Llama-family model is upcycled when --attention names another kind; docs/training.md); the "
                  "preset gives the recipe", "metavar": "DIR"},
    )  # fmt: skip
    resume: bool = field(
        default=False,
        metadata={"help": "continue from the last finished checkpoint in --output-dir (unfinished ones are set "
                  "aside)"},
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.model_fields() and self.attention is None:
            raise UsageError(
                f"{', '.join(f'`{name}`' for name in self.model_fields())} move an attention kind along its parts: "
                "give `attention` too"
            )
        for name in ("gda_ratio", "sliding_window"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UsageError(f"`{name}` must be a positive integer; got {value!r}")
        period = self.sliding_window_period
        if period is not None and (isinstance(period, bool) or not isinstance(period, int) or period < 0):
            raise UsageError(f"`sliding_window_period` must be 0 or a positive integer; got {period!r}")

    def model_fields(self) -> dict:
        """The part fields these options set (the configuration's names), on top of the kind's."""
        return {name: getattr(self, name) for name in PART_FIELDS if getattr(self, name) is not None}


def parse_length_schedule(text: str) -> list[tuple[int, int]]:
    """'0:64,3000:256' -> [(0, 64), (3000, 256)]: (first step, tokens) pairs; the recall mix checks their order
    against the block size."""
    schedule = integer_pairs(text, "length_schedule", "STEP:TOKENS as 0:64,3000:256")
    for step, tokens in schedule:
        if step < 0 or tokens < 2:
            raise UsageError(
                f"`length_schedule`: each STEP:TOKENS needs STEP >= 0 and TOKENS >= 2; got '{step}:{tokens}'"
            )
    return schedule


@dataclass
class PresetOptions:
    """The model and the recipe: a preset, and the preset values a flag may override (unset: the preset's)."""

    _argument_group_name = "preset and model"

    preset: str = field(
        default="tiny",
        metadata={"help": "model size and training recipe, one of those listed below (default: tiny)"},
    )
    hidden_size: int | None = field(
        default=None,
        metadata={"help": "model width d_model, with the preset's depth and head width (its DIFF heads follow; "
                  "default: the preset's)"},
    )  # fmt: skip
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
    length_schedule: tuple[tuple[int, int], ...] | None = field(
        default=None,
        metadata={
            "help": "rows that grow with the step, STEP:TOKENS pairs from step 0, e.g. 0:64,3000:256: from each "
            "step on, text, MQAR and induction rows have that many tokens, MQAR pairs scaled with them (default: "
            "the preset's; a preset without one trains every row at the block size)",
            "parse": parse_length_schedule,
            "show": lambda schedule: ",".join(f"{step}:{tokens}" for step, tokens in schedule),
            "metavar": "STEP:TOKENS",
        },
    )

    def __post_init__(self) -> None:
        if self.length_schedule is not None:
            self.length_schedule = tuple((int(step), int(tokens)) for step, tokens in self.length_schedule)
        for name, lowest in (("hidden_size", 1), ("block_size", 2), ("vocab_size", MIN_VOCAB_SIZE),
                             ("eval_blocks", 1), ("max_position_embeddings", 2)):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value < lowest:
                raise UsageError(f"`{name}` must be at least {lowest}; got {value}")
        for name in RECALL_FRACTIONS:
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1:
                raise UsageError(f"`{name}` must lie in [0, 1); got {value}")


# The shares of synthetic rows a preset may draw into training (PresetOptions fields of the same names).
RECALL_FRACTIONS = ("needle_fraction", "mqar_fraction", "induction_fraction")


def step_tokens(block_size: int, *, per_device_batch: int, accumulation: int, world_size: int) -> int:
    """Tokens in one optimizer step's global batch: ``block_size`` x ``per_device_batch`` blocks x
    ``accumulation`` micro-batches x ``world_size`` processes."""
    return block_size * per_device_batch * accumulation * world_size


def tokens_per_step(block_size: int, settings: TrainingArguments) -> int:
    """Tokens in one optimizer step's global batch of a run with ``settings`` (every process, every accumulated
    micro-batch; :func:`step_tokens`)."""
    return step_tokens(
        block_size,
        per_device_batch=settings.per_device_train_batch_size,
        accumulation=settings.gradient_accumulation_steps,
        world_size=settings.world_size,
    )
