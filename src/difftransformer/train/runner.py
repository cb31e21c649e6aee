"""One training run with the transformers ``Trainer``: locking, resuming, metrics, checkpoints, final save.

Trainer (with accelerate underneath) handles devices, DDP under ``torchrun``, mixed precision, the optimizer and
schedule, checkpoint contents and exact resumption (RNG states, data-order skipping), all under the run's
:class:`difftransformer.train.settings.TrainingSettings`. This module adds perplexity, the progress bar and the CSV
log, saves configs fit for inference, and guards the output directory.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, Trainer, TrainerCallback, default_data_collator, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from difftransformer.errors import UsageError
from difftransformer.models import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.models.folders import check_model_files, load_model_folder
from difftransformer.ops import fused_cpu_available
from difftransformer.storage import check_output_dir, read_json, write_json
from difftransformer.train.callbacks import CsvMetrics, ProgressBar
from difftransformer.train.checkpoints import CompletionMarker, checkpoints, last_good_checkpoint
from difftransformer.train.curriculum import LengthCurriculum
from difftransformer.train.fsdp import check_fsdp_state_dict, enable_fsdp_on_cpu
from difftransformer.train.lock import RunDirectoryTaken, RunLock
from difftransformer.train.mixture import Blocks, MixedBlocks, RecallMix
from difftransformer.train.provenance import record_fingerprint
from difftransformer.train.recall import RecallProbe
from difftransformer.train.settings import TrainingSettings, tokens_per_step
from difftransformer.train.traces import LambdaTraces

METRICS_CSV = "metrics.csv"
SUMMARY_JSON = "train_summary.json"


class LanguageModelTrainer(Trainer):
    """Trainer that logs validation perplexity beside validation loss (and, with a ``recall_probe``, MQAR accuracy
    as ``eval_mqar_accuracy``), DIFF's per-layer lambda beside every training loss (with ``lambda_traces``), and
    saves configs fit for inference.

    Trainer sets ``config.use_cache`` to ``TrainingArguments.use_cache`` (False: no KV cache while training); every
    checkpoint and the final model are saved with the model's own value instead, so that generation from a saved
    folder uses the cache.
    """

    def __init__(
        self,
        *args,
        recall_probe: RecallProbe | None = None,
        lambda_traces: LambdaTraces | None = None,
        **kwargs,
    ) -> None:
        model = kwargs.get("model", args[0] if args else None)
        self._inference_use_cache = model.config.use_cache
        self.recall_probe = recall_probe
        self.lambda_traces = lambda_traces
        super().__init__(*args, **kwargs)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        config = self.model.config
        training_use_cache, config.use_cache = config.use_cache, self._inference_use_cache
        try:
            super()._save(output_dir, state_dict)
        finally:
            config.use_cache = training_use_cache

    def _issue_warnings_after_load(self, load_result) -> None:
        """Refuse a checkpoint to resume whose weights lack tensors of the model or hold others (Trainer only logs
        them): the run would go on with fresh or dropped weights. Tied tensors are saved once and not counted."""
        tied = set(getattr(self.model, "all_tied_weights_keys", {}))
        missing = sorted(set(load_result.missing_keys) - tied)
        unexpected = sorted(load_result.unexpected_keys)
        if missing or unexpected:
            found = [f"{len(keys)} {what} ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})"
                     for keys, what in ((missing, "missing"), (unexpected, "unexpected")) if keys]  # fmt: skip
            raise UsageError(
                f"`resume`: the checkpoint's weights do not match the model it holds: tensors {'; '.join(found)}; "
                "restore the checkpoint or choose another `output_dir`"
            )
        super()._issue_warnings_after_load(load_result)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Trainer's load of the checkpoint to resume (its names checked by :meth:`_issue_warnings_after_load`),
        then what a strict load checks beyond names, before any step: weights that are not finite, or that are not
        what the checkpoint's fingerprint recorded (:func:`~difftransformer.models.folders.check_model_files`)."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        check_model_files(resume_from_checkpoint, what="resume")

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        enable_fsdp_on_cpu(self)  # --fsdp on CPU processes (accelerate applies it on accelerators only)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Trainer's log, with ``eval_perplexity`` beside every ``eval_loss`` and the lambda traces beside every
        training ``loss``."""
        if "loss" in logs and self.lambda_traces:
            logs.update(self.lambda_traces.values())
        if "eval_loss" in logs:
            logs["eval_perplexity"] = math.exp(min(logs["eval_loss"], 700.0))
            if self.recall_probe is not None:
                training = self.model.training
                self.model.eval()
                logs["eval_mqar_accuracy"] = self.recall_probe.accuracy(self.model)
                self.model.train(training)
        super().log(logs, start_time)


@dataclass
class TrainResult:
    """What a finished run reports (and writes to train_summary.json): its folder, parameter count, training wall
    time and throughput of this call (a resumed run counts only its own steps), last validation loss, and the
    global step reached."""

    output_dir: Path
    parameters: int
    train_seconds: float
    tokens_per_second: float
    final_eval_loss: float
    global_step: int


# Rows of a block tensor whose ids _check_blocks reads up front (evenly spaced): a memory-mapped tensor is not read
# whole (each row read can map a megabyte of the file into the process: fault-around, large folios), and Blocks
# checks every row it serves.
_CHECKED_ROWS = 8


def _check_blocks(
    train_blocks: torch.Tensor, eval_blocks: torch.Tensor, config: DiffTransformerConfig
) -> int:
    for name, blocks in (("train_blocks", train_blocks), ("eval_blocks", eval_blocks)):
        if blocks.dim() != 2 or blocks.dtype != torch.long or blocks.shape[0] == 0:
            raise UsageError(
                f"{name} must be a non-empty (n, T) int64 tensor; got {tuple(blocks.shape)} {blocks.dtype}"
            )
        n = blocks.shape[0]
        rows = blocks if n <= _CHECKED_ROWS else blocks[torch.linspace(0, n - 1, _CHECKED_ROWS).long()]
        if int(rows.max()) >= config.vocab_size or int(rows.min()) < 0:
            raise UsageError(f"{name} holds ids outside [0, vocab_size={config.vocab_size})")
    if train_blocks.shape[1] != eval_blocks.shape[1]:
        raise UsageError(
            f"train and eval blocks differ in length: {train_blocks.shape[1]} vs {eval_blocks.shape[1]}"
        )
    if train_blocks.shape[1] > config.max_position_embeddings:
        raise UsageError(
            f"block size {train_blocks.shape[1]} exceeds max_position_embeddings {config.max_position_embeddings}"
        )
    return train_blocks.shape[1]


def destroy_process_group_at_exit() -> None:
    """Once a run has finished, have the process group (which accelerate set up for the Trainer) destroyed when
    the interpreter exits, before it tears itself down: without it gloo's worker threads can abort the exiting
    process ("terminate called without an active exception", SIGABRT, seen once in a two-process FSDP run).
    Called only after a run that succeeded, so a failing rank never waits in it for the others; later runs in
    the same process (a comparison under torchrun) keep the group. Does nothing without a process group."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        _register_destroy_at_exit()


@functools.cache
def _register_destroy_at_exit() -> None:
    def destroy() -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    atexit.register(destroy)


def is_main_process() -> bool:
    """True in the process that writes files (rank 0, or the only one)."""
    return int(os.environ.get("RANK", "0")) == 0


def train_model(
    model: DiffTransformerConfig | DiffTransformerForCausalLM,
    train_blocks: torch.Tensor | Blocks,
    eval_blocks: torch.Tensor,
    tokenizer: PreTrainedTokenizerBase,
    args: TrainingSettings,
    *,
    resume: bool = False,
    callbacks: list[TrainerCallback] = (),
    progress_desc: str = "train",
) -> TrainResult:
    """Train ``model`` (a config: a fresh ``DiffTransformerForCausalLM`` seeded with ``args.seed``; or a model,
    e.g. a pretrained or upcycled one) or continue the last finished checkpoint when ``resume``, with Trainer
    under ``args``, save the final model and tokenizer into ``args.output_dir``, and return a summary.

    ``train_blocks`` (n_train, T) and ``eval_blocks`` (n_eval, T) are int64 token ids, every block a full
    training sequence; ``train_blocks`` may instead be a :class:`Blocks` dataset, e.g. :class:`MixedBlocks` with
    recall rows (whose MQAR accuracy is then logged at every evaluation); ``callbacks`` are added to Trainer's; ``progress_desc`` labels the progress bar.
    The tokenizer saved with the model takes the model's context as its ``model_max_length`` (pipelines truncate
    to it), set on ``tokenizer`` itself.
    """
    check_fsdp_state_dict(args)
    output_dir = Path(args.output_dir)
    lock = RunLock(output_dir) if is_main_process() else None
    if lock is not None:
        lock.acquire()
    try:
        checkpoint = _checkpoint_to_resume(output_dir, resume)
        config = model if isinstance(model, DiffTransformerConfig) else model.config
        if tokenizer is not None:
            tokenizer.model_max_length = config.max_position_embeddings
        if checkpoint is not None:
            _check_same_model(checkpoint, config)
        finished = _finished_run(output_dir, checkpoint, args, tokenizer)
        if finished is not None:
            return finished
        set_seed(args.seed)  # the same initial weights for the same seed and config
        if isinstance(model, DiffTransformerConfig):
            model = DiffTransformerForCausalLM(model)
        if args.device.type == "cpu":
            # Build the C++ kernels now (first use only), not inside the timed steps: every kind uses some of them
            # (the softmax baseline's RMSNorm at evaluation), and a build there cost its tokens/s a factor of 10.
            fused_cpu_available()
        train_dataset = (
            train_blocks if isinstance(train_blocks, Blocks) else Blocks(train_blocks, config.vocab_size)
        )
        block_size = _check_blocks(train_dataset.blocks, eval_blocks, config)
        step_tokens = tokens_per_step(block_size, args)
        mix = train_dataset.mix if isinstance(train_dataset, MixedBlocks) else RecallMix()
        tokens = functools.partial(mix.tokens_between, block_size=block_size, step_tokens=step_tokens)
        probe, curriculum = None, []
        if mix.mqar_fraction:
            probe = RecallProbe(train_dataset.vocabulary, block_size, seed=args.seed)
        if mix.length_schedule:
            curriculum.append(LengthCurriculum(train_dataset, args.dataloader_num_workers))
        traces = LambdaTraces(model)
        trainer = LanguageModelTrainer(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=Blocks(eval_blocks, config.vocab_size),
            data_collator=default_data_collator,
            processing_class=tokenizer,
            recall_probe=probe,
            lambda_traces=traces,
            callbacks=[
                CompletionMarker(),
                CsvMetrics(output_dir / METRICS_CSV, tokens, traces.columns),
                ProgressBar(tokens, desc=progress_desc),
                *curriculum,
                *callbacks,
            ],
        )
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        start = time.perf_counter()
        first_step = 0 if checkpoint is None else _step(checkpoint)
        try:
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        finally:
            traces.remove()
        seconds = time.perf_counter() - start
        evals = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
        final_eval = evals[-1] if evals else trainer.evaluate()["eval_loss"]
        result = TrainResult(
            output_dir=output_dir,
            parameters=sum(p.numel() for p in model.parameters()),
            train_seconds=seconds,
            tokens_per_second=tokens(first_step, trainer.state.global_step) / max(seconds, 1e-9),
            final_eval_loss=float(final_eval),
            global_step=trainer.state.global_step,
        )
        # Every process: under FSDP saving gathers the shards; only the main process writes.
        trainer.save_model(str(output_dir))  # final weights (safetensors), config and tokenizer
        if trainer.is_world_process_zero():
            record_fingerprint(output_dir)
            write_json(output_dir / SUMMARY_JSON, asdict(result))
        destroy_process_group_at_exit()
        return result
    finally:
        if lock is not None:
            lock.release()


def _step(checkpoint: Path) -> int:
    return int(checkpoint.name.rsplit("-", 1)[1])


def _finished_run(
    output_dir: Path, checkpoint: Path | None, args: TrainingSettings, tokenizer: PreTrainedTokenizerBase
) -> TrainResult | None:
    """The result of a run whose newest finished checkpoint already reached ``args.max_steps`` (Trainer would
    train one step more), or None. A run killed during its final save gets its final model from that checkpoint."""
    if checkpoint is None or _step(checkpoint) < args.max_steps:
        return None
    if (output_dir / SUMMARY_JSON).is_file():
        result = TrainResult(**read_json(output_dir / SUMMARY_JSON))
        result.output_dir = Path(result.output_dir)
    else:
        model = load_model_folder(checkpoint, DiffTransformerForCausalLM, what="output_dir")
        history = read_json(checkpoint / "trainer_state.json")["log_history"]
        evals = [entry["eval_loss"] for entry in history if "eval_loss" in entry]
        result = TrainResult(
            output_dir=output_dir,
            parameters=sum(p.numel() for p in model.parameters()),
            train_seconds=0.0,
            tokens_per_second=0.0,
            final_eval_loss=float(evals[-1]) if evals else math.nan,
            global_step=_step(checkpoint),
        )
        if is_main_process():
            model.save_pretrained(output_dir)
            record_fingerprint(output_dir)
            tokenizer.save_pretrained(output_dir)
            write_json(output_dir / SUMMARY_JSON, asdict(result))
    if is_main_process():
        print(
            f"{output_dir} is complete: {checkpoint.name} reached --max-steps {args.max_steps}; nothing to train "
            "(raise --max-steps to train on)"
        )
    return result


# The config fields that fix the weights' shapes: a checkpoint that differs in one cannot be resumed.
_SHAPE_FIELDS = ("attention", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "map_dim", "tie_word_embeddings")  # fmt: skip


def _check_same_model(checkpoint: Path, config: DiffTransformerConfig) -> None:
    """Refuse to resume ``checkpoint`` when it holds a model of another shape than ``config`` (another preset, or
    other model options): its weights would not load."""
    try:
        saved = DiffTransformerConfig.from_pretrained(checkpoint)  # every field, defaults included
    except (OSError, ValueError) as err:  # a config of another model type, or one our config class refuses
        raise UsageError(
            f"`resume`: {checkpoint} holds no model this command can resume ({err}); choose another `output_dir`"
        ) from err
    differ = [name for name in _SHAPE_FIELDS if getattr(saved, name) != getattr(config, name)]
    if differ:
        raise UsageError(
            f"`resume`: {checkpoint} holds another model ("
            + ", ".join(f"{name}={getattr(saved, name)!r}" for name in differ)
            + ") than this command builds ("
            + ", ".join(f"{name}={getattr(config, name)!r}" for name in differ)
            + "); resume with the run's own `preset` and model options, or choose another `output_dir`"
        )


def check_run_folder(output_dir: str | os.PathLike, *, resume: bool) -> Path:
    """Refuse, creating nothing, a run folder that cannot be written
    (:func:`~difftransformer.storage.check_output_dir`) or that holds another run's checkpoints when not
    ``resume`` (:class:`~difftransformer.train.lock.RunDirectoryTaken`): what ``train_model`` would refuse, for a
    command to check before any work. Only the main process, the one that writes the folder, probes it: the probe
    makes the folder and removes it again, so under torchrun another process's probe raced the main process, which
    found the folder it had just made for its lock file gone (or the probe found it made), and died before its
    peers, who lost it in their first collective (the two-process FSDP test's lost gloo peer)."""
    path = check_output_dir(output_dir, "output_dir") if is_main_process() else Path(output_dir)
    existing = checkpoints(path) if path.is_dir() else []
    if existing and not resume:
        raise RunDirectoryTaken(
            f"{path} already holds checkpoints ({existing[-1].name}); pass `resume` to continue that run "
            "or choose another `output_dir`"
        )
    return path


def _checkpoint_to_resume(output_dir: Path, resume: bool) -> Path | None:
    check_run_folder(output_dir, resume=resume)
    if not resume:
        return None
    existing = checkpoints(output_dir)
    checkpoint = last_good_checkpoint(output_dir, quarantine=is_main_process())
    if checkpoint is None:
        if existing:
            print(f"--resume: no finished checkpoint in {output_dir}; starting from step 0")
    else:
        print(f"resuming from {checkpoint}")
    return checkpoint
