"""What one run of a comparison does, in the process that runs it: train the model into its folder (resuming a
killed run, reusing a finished one), evaluate it (test loss and the evaluation suite, optionally
lm-evaluation-harness), keep its log (``run.log``, every attempt under a header) and account its wall and CPU
seconds (``usage.json``). Everything it writes goes into the run's folder; the folders are the comparison's state.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm
from transformers import TrainerCallback

from difftransformer.compare.plan import PlannedRun
from difftransformer.compare.records import EVALUATION_JSON, RUN_LOG, USAGE_JSON, RunRecord
from difftransformer.compare.settings import ComparisonSettings
from difftransformer.convert.upcycle import initial_model
from difftransformer.data import DataOptions
from difftransformer.eval.common import mean_token_nll
from difftransformer.eval.harness import run_harness
from difftransformer.eval.suite import SuiteSettings, run_suite
from difftransformer.models import DiffTransformerForCausalLM
from difftransformer.models.folders import load_model_folder
from difftransformer.storage import read_json, write_json
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.provenance import record_provenance
from difftransformer.train.runner import SUMMARY_JSON, is_main_process, train_model
from difftransformer.train.settings import tokens_per_step


@dataclass(frozen=True)
class RunWork:
    """The work of every run of one comparison (it travels to the workers pickled, with the prepared data and the
    settings): :meth:`__call__` trains and, for a run that is evaluated, evaluates one run."""

    data: PreparedData
    suites: Mapping[str, SuiteSettings]
    comparison: ComparisonSettings
    data_options: DataOptions

    def __call__(self, run: PlannedRun, callbacks: Sequence[TrainerCallback], where: str) -> None:
        """Run ``run`` with the Trainer ``callbacks``, its output appended to its log under a header naming this
        process and ``where`` it runs; a data-parallel run's workers other than the first log apart and account
        nothing (the first one's seconds are the run's)."""
        main = is_main_process()
        with (
            run_log(run.folder, where, main),
            _usage(run.folder, "compare" if run.evaluate else "sweep", main),
        ):
            try:
                train_run(self.data, run, self.comparison, self.data_options, callbacks)
                if run.evaluate and main:
                    evaluate_run(self.data, run, self.suites[run.scale], self.comparison)
            except BaseException:
                traceback.print_exc()  # into the run's log, which the message of a failed run names
                raise


def train_run(
    data: PreparedData,
    run: PlannedRun,
    comparison: ComparisonSettings,
    data_options: DataOptions,
    callbacks: Sequence[TrainerCallback] = (),
) -> None:
    """Train one model into its folder unless it is finished already (with ``comparison.init_from`` the pretrained
    model, upcycled to the variant's kind)."""
    if (run.folder / SUMMARY_JSON).is_file():
        return
    training = run.training_settings()
    record_provenance(
        run.folder,
        preset=run.preset,
        training=training,
        data=data_options,
        attention=run.variant.spec(),
        init_from=comparison.init_from,
    )
    train_model(
        initial_model(comparison.init_from, run.variant.kind, seed=run.seed)
        if comparison.init_from
        else run.variant.config(run.preset.model_for(run.variant.kind, data.tokenizer)),
        data.train_dataset,
        data.validation_blocks[: run.preset.eval_blocks],
        data.tokenizer,
        training,
        resume=True,
        progress_desc=run.name,
        callbacks=list(callbacks),
    )


def evaluate_run(
    data: PreparedData, run: PlannedRun, suite_settings: SuiteSettings, comparison: ComparisonSettings
) -> RunRecord:
    """Evaluate the trained model in the run's folder on the test split: test loss and the evaluation suite, whose
    files go to FOLDER/eval/TASK/ (a task already run on this model with the same settings is reused from
    evaluation.json), and the harness tasks; the record goes to the folder's evaluation.json. A folder whose model
    no longer loads (edited, truncated, not finite) is refused in one line."""
    folder, preset, tokenizer = run.folder, run.preset, data.tokenizer
    summary = read_json(folder / SUMMARY_JSON)
    model = load_model_folder(folder, DiffTransformerForCausalLM, what="output_dir").eval()
    training = run.training_settings()
    trained = dict(
        parameters=summary["parameters"],
        tokens=preset.recall.tokens_between(
            0, summary["global_step"], preset.block_size, tokens_per_step(preset.block_size, training)
        ),
        tokens_per_second=summary["tokens_per_second"],
        train_seconds=summary["train_seconds"],
        validation_loss=summary["final_eval_loss"],
    )
    previous, earlier_harness = None, {}
    if (folder / EVALUATION_JSON).is_file():
        earlier = read_json(folder / EVALUATION_JSON)
        # Only an evaluation of this very training run (same summary) may be reused.
        if all(earlier.get(key) == value for key, value in trained.items()):
            previous, earlier_harness = earlier.get("suite"), earlier.get("harness") or {}
    test_loss = mean_token_nll(
        model, data.test_blocks[: comparison.test_blocks], training.per_device_eval_batch_size
    )
    suite = run_suite(model, tokenizer, data.test_texts, suite_settings, folder / "eval", previous=previous)
    tqdm.write(
        f"{run.name} evaluated in seconds: "
        + ", ".join(f"{task} {sec:.1f}" for task, sec in suite["seconds"].items())
    )
    harness = {}
    if comparison.lm_eval_tasks:
        options = dict(tasks=list(comparison.lm_eval_tasks), include_path=comparison.lm_eval_include, limit=comparison.lm_eval_limit,
                       batch_size=comparison.lm_eval_batch_size, seed=run.seed)  # fmt: skip
        if earlier_harness.get("options") == options:
            harness = earlier_harness
        else:
            metrics = run_harness(folder, include_defaults=comparison.lm_eval_include is None, **options)
            harness = {"options": options, "metrics": metrics}
    record = RunRecord(
        variant=run.variant.spec(),
        seed=run.seed,
        scale=run.scale,
        folder=folder,
        test_loss=test_loss,
        suite=suite,
        harness=harness,
        learning_rate=run.learning_rate,
        layer_parameters=sum(p.numel() for p in model.model.layers.parameters()),
        **trained,
    )
    write_json(folder / EVALUATION_JSON, record.to_json(folder))
    return record


@contextlib.contextmanager
def run_log(folder: Path, where: str, main: bool = True) -> Iterator[None]:
    """Append this process's standard output and error (Python's and the C libraries') to the run's log while the
    block runs (``run.rank.PID.log`` for a data-parallel worker other than the first), under a header of its own
    line naming the date, this process and ``where`` it runs (the previous attempt may have ended mid-line)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (RUN_LOG if main else f"run.rank.{os.getpid()}.log")
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab+", buffering=0) as log:
        header = f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()} on {where} ---\n"
        if log.seek(0, os.SEEK_END):
            log.seek(-1, os.SEEK_END)
            if log.read(1) != b"\n":
                header = "\n" + header
        log.write(header.encode())
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


@contextlib.contextmanager
def _usage(folder: Path, phase: str, record: bool) -> Iterator[None]:
    """Append this attempt's wall and CPU seconds (this process and the processes it waited for) at ``phase`` (the
    sweep, or the comparison's runs) to the run's usage.json when ``record`` (the run's first process)."""
    import resource

    def cpu() -> float:
        return sum(
            usage.ru_utime + usage.ru_stime
            for usage in (
                resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN),
            )
        )

    start, cpu_start = time.monotonic(), cpu()
    try:
        yield
    finally:
        if record:
            path = folder / USAGE_JSON
            attempts = read_json(path)["attempts"] if path.is_file() else []
            attempt = {
                "phase": phase,
                "wall_seconds": time.monotonic() - start,
                "cpu_seconds": cpu() - cpu_start,
            }
            write_json(path, {"attempts": [*attempts, attempt]})
