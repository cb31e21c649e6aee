"""One training run with the transformers ``Trainer``: locking, resuming, metrics, checkpoints, final save.

Trainer (with accelerate underneath) handles devices, DDP under ``torchrun``, mixed precision, the optimizer and
schedule, checkpoint contents and exact resumption (RNG states, data-order skipping). This module chooses its
arguments, adds perplexity, the progress bar and the CSV log, and guards the output directory.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import (
    PreTrainedTokenizerBase,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from difftransformer.models import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.ops import fused_cpu_available
from difftransformer.train.callbacks import CsvMetrics, ProgressBar
from difftransformer.train.checkpoints import (
    CompletionMarker,
    checkpoints,
    last_good_checkpoint,
    write_json_atomic,
)
from difftransformer.train.lock import RunLock

METRICS_CSV = "metrics.csv"
SUMMARY_JSON = "train_summary.json"


@dataclass
class TrainOptions:
    """Trainer settings, named as in ``TrainingArguments``; ``save_total_limit`` must keep at least 2 so a kill
    during a save always leaves a finished checkpoint behind."""

    output_dir: str
    max_steps: int
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 16
    gradient_accumulation_steps: int = 1
    learning_rate: float = 3.2e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    lr_scheduler_type: str = "cosine"
    logging_steps: int = 10
    eval_steps: int = 100
    save_steps: int = 500
    save_total_limit: int = 3
    seed: int = 0
    report_to: str = "tensorboard"
    progress_desc: str = "train"

    def check(self) -> None:
        for name in (
            "max_steps",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "logging_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        for name in ("eval_steps", "save_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.save_total_limit < 2:
            raise ValueError(
                f"save_total_limit must be >= 2 (one finished checkpoint survives a kill); got {self.save_total_limit}"
            )
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0; got {self.learning_rate}")


def training_arguments(options: TrainOptions) -> TrainingArguments:
    """``TrainingArguments`` for ``options``: float32 on CPU, bf16 on a GPU that has it, safetensors checkpoints,
    validation every ``eval_steps``, TensorBoard logs under ``output_dir/runs/<date_host>``."""
    options.check()
    on_gpu = torch.cuda.is_available()
    return TrainingArguments(
        output_dir=options.output_dir,
        max_steps=options.max_steps,
        per_device_train_batch_size=options.per_device_train_batch_size,
        per_device_eval_batch_size=options.per_device_eval_batch_size,
        gradient_accumulation_steps=options.gradient_accumulation_steps,
        learning_rate=options.learning_rate,
        warmup_steps=options.warmup_steps,
        weight_decay=options.weight_decay,
        adam_beta1=options.adam_beta1,
        adam_beta2=options.adam_beta2,
        max_grad_norm=options.max_grad_norm,
        lr_scheduler_type=options.lr_scheduler_type,
        logging_steps=options.logging_steps,
        eval_strategy="steps",
        eval_steps=options.eval_steps,
        save_strategy="steps",
        save_steps=options.save_steps,
        save_total_limit=options.save_total_limit,
        seed=options.seed,
        data_seed=options.seed,
        bf16=on_gpu and torch.cuda.is_bf16_supported(),
        use_cpu=not on_gpu,
        report_to=[] if options.report_to == "none" else [options.report_to],
        disable_tqdm=True,  # our ProgressBar replaces Trainer's
        ddp_find_unused_parameters=False,
    )


class LanguageModelTrainer(Trainer):
    """Trainer that logs validation perplexity beside validation loss."""

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "eval_loss" in logs:
            logs["eval_perplexity"] = math.exp(min(logs["eval_loss"], 700.0))
        super().log(logs, start_time)


@dataclass
class TrainResult:
    output_dir: Path
    parameters: int
    train_seconds: float
    tokens_per_second: float
    final_eval_loss: float
    global_step: int


class Blocks(Dataset):
    """(n, T) token ids as causal-LM examples; labels are the inputs (the model shifts them)."""

    def __init__(self, blocks: torch.Tensor) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


def _check_blocks(
    train_blocks: torch.Tensor, eval_blocks: torch.Tensor, config: DiffTransformerConfig
) -> int:
    for name, blocks in (("train_blocks", train_blocks), ("eval_blocks", eval_blocks)):
        if blocks.dim() != 2 or blocks.dtype != torch.long or blocks.shape[0] == 0:
            raise ValueError(
                f"{name} must be a non-empty (n, T) int64 tensor; got {tuple(blocks.shape)} {blocks.dtype}"
            )
        if int(blocks.max()) >= config.vocab_size or int(blocks.min()) < 0:
            raise ValueError(f"{name} holds ids outside [0, vocab_size={config.vocab_size})")
    if train_blocks.shape[1] != eval_blocks.shape[1]:
        raise ValueError(
            f"train and eval blocks differ in length: {train_blocks.shape[1]} vs {eval_blocks.shape[1]}"
        )
    if train_blocks.shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"block size {train_blocks.shape[1]} exceeds max_position_embeddings {config.max_position_embeddings}"
        )
    return train_blocks.shape[1]


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def train_model(
    config: DiffTransformerConfig,
    train_blocks: torch.Tensor,
    eval_blocks: torch.Tensor,
    tokenizer: PreTrainedTokenizerBase,
    options: TrainOptions,
    *,
    resume: bool = False,
    callbacks: list[TrainerCallback] = (),
) -> TrainResult:
    """Train a fresh ``DiffTransformerForCausalLM(config)`` (or continue the last finished checkpoint when
    ``resume``), save the final model and tokenizer into ``options.output_dir``, and return a summary.

    ``train_blocks`` (n_train, T) and ``eval_blocks`` (n_eval, T) are int64 token ids, every block a full
    training sequence; ``callbacks`` are added to Trainer's.
    """
    output_dir = Path(options.output_dir)
    lock = RunLock(output_dir) if is_main_process() else None
    if lock is not None:
        lock.acquire()
    try:
        checkpoint = _checkpoint_to_resume(output_dir, resume)
        args = training_arguments(options)
        set_seed(options.seed)  # the same initial weights for the same seed and config
        model = DiffTransformerForCausalLM(config)
        world = args.world_size
        if config.attention == "diff" and args.device.type == "cpu":
            fused_cpu_available()  # compile the CPU kernel now (first use only), not inside the timed steps
        block_size = _check_blocks(train_blocks, eval_blocks, config)
        tokens_per_step = (
            block_size * options.per_device_train_batch_size * options.gradient_accumulation_steps * world
        )
        trainer = LanguageModelTrainer(
            model=model,
            args=args,
            train_dataset=Blocks(train_blocks),
            eval_dataset=Blocks(eval_blocks),
            data_collator=default_data_collator,
            processing_class=tokenizer,
            callbacks=[
                CompletionMarker(),
                CsvMetrics(output_dir / METRICS_CSV, tokens_per_step),
                ProgressBar(tokens_per_step, desc=options.progress_desc),
                *callbacks,
            ],
        )
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        start = time.perf_counter()
        first_step = 0
        if checkpoint is not None:
            first_step = int(checkpoint.name.rsplit("-", 1)[1])
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        seconds = time.perf_counter() - start
        evals = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
        final_eval = evals[-1] if evals else trainer.evaluate()["eval_loss"]
        result = TrainResult(
            output_dir=output_dir,
            parameters=sum(p.numel() for p in model.parameters()),
            train_seconds=seconds,
            tokens_per_second=(trainer.state.global_step - first_step) * tokens_per_step / max(seconds, 1e-9),
            final_eval_loss=float(final_eval),
            global_step=trainer.state.global_step,
        )
        if trainer.is_world_process_zero():
            trainer.save_model(str(output_dir))  # final weights (safetensors), config and tokenizer
            summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result).items()}
            write_json_atomic(output_dir / SUMMARY_JSON, summary)
        return result
    finally:
        if lock is not None:
            lock.release()


def _checkpoint_to_resume(output_dir: Path, resume: bool) -> Path | None:
    existing = checkpoints(output_dir)
    if not resume:
        if existing:
            raise FileExistsError(
                f"{output_dir} already holds checkpoints ({existing[-1].name}); pass --resume to continue that run "
                "or choose another --output-dir"
            )
        return None
    checkpoint = last_good_checkpoint(output_dir, quarantine=is_main_process())
    if checkpoint is None:
        if existing:
            print(f"--resume: no finished checkpoint in {output_dir}; starting from step 0")
    else:
        print(f"resuming from {checkpoint}")
    return checkpoint
