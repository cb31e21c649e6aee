"""A comparison's runs fanned out over a Ray cluster by Ray Tune.

Every run is one Tune trial holding :class:`~difftransformer.compare.resources.RunResources`; Tune starts as many at
once as the cluster holds, in the grid's order, and starts a trial again when its worker process dies (killed,
out of memory, its node lost), up to ``retries`` times: the run then resumes from its folder's last checkpoint, as
``train --resume`` does, and ends with the weights an uninterrupted run gets. An exception raised by the run itself
is not retried (it would be raised again); it is reported with the run's log. A run of several workers trains
data-parallel under Ray Train (its ``TorchTrainer`` sets up the process group the Trainer then uses). With
``early_stop``, ASHA stops the runs whose validation loss falls behind the other runs of the same arm.

The folders are the state: a run writes only into its own folder (its log there too, ``run.log``), on storage that
the driver and every node share, and what Tune keeps of its own (trial results) goes to a temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from difftransformer.compare.grid import Grid
from difftransformer.compare.resources import RunResources
from difftransformer.errors import UsageError
from difftransformer.storage import read_json, write_json

RUN_LOG = "run.log"
USAGE_JSON = "usage.json"  # every attempt's wall and CPU seconds, in a run's folder
EVAL_LOSS = "eval_loss"
_ERROR = "error"  # the metric a run reports its own exception under (not retried)


class RunFailed(RuntimeError):
    """Runs of a grid that could not finish: each with its error and the log to read."""


class RunRefused(UsageError):
    """A run refused its settings (a :class:`UsageError` raised in the worker): the message is the run's."""


def run_grid(grid: Grid) -> None:
    """Run every run of ``grid`` on the connected Ray cluster, showing one progress display for the whole grid.
    Raises :class:`RunRefused` when a run refused its settings, :class:`RunFailed` (naming each run, its error
    and its log) when any other run could not finish; runs stopped early by ASHA are not failures."""
    if not grid.runs:
        return
    from ray import tune

    from difftransformer.compare.progress import GridProgress
    from difftransformer.compare.schedulers import PerArmASHA

    indices = list(range(len(grid.runs)))
    trainable = tune.with_parameters(tune.with_resources(_trial, _trial_resources(grid.resources)), grid=grid)
    scheduler = None
    if grid.early_stop:
        longest = max(run.max_steps for run in grid.runs)
        scheduler = PerArmASHA(
            arm=lambda trial: grid.runs[trial.config["run"]].arm,
            time_attr="step",
            metric=EVAL_LOSS,
            mode="min",
            # Rungs at a quarter and half of the run: never at its last step, whose report would stop a finished
            # run before it writes its summary.
            max_t=max(2, longest - 1),
            grace_period=max(1, longest // 4),
            reduction_factor=2,
            stop_last_trials=False,
        )
    progress = GridProgress(grid.runs, grid.desc)
    with tempfile.TemporaryDirectory(prefix="difftransformer-tune-") as storage:
        tuner = tune.Tuner(
            trainable,
            param_space={"run": tune.grid_search(indices)},
            tune_config=tune.TuneConfig(
                scheduler=scheduler,
                # A finished run's worker takes the next run (no new process, no imports); Tune starts a new one
                # after a run that early stopping ended (its thread still runs), so that run's lock owner is gone.
                reuse_actors=True,
                trial_name_creator=lambda trial: f"run{trial.config['run']}",
                trial_dirname_creator=lambda trial: f"run{trial.config['run']}",
            ),
            run_config=tune.RunConfig(
                name="compare",
                storage_path=storage,
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=grid.retries),
                callbacks=[progress],
            ),
        )
        try:
            with _quiet_tune():
                results = tuner.fit()
        finally:
            progress.close()
    refused, failed = [], []
    for result in results:
        run = grid.runs[result.config["run"]]
        metrics = result.metrics or {}
        if metrics.get(_ERROR):
            (refused if metrics.get("refused") else failed).append((run, metrics[_ERROR]))
        elif result.error is not None:
            failed.append(
                (run, f"its worker failed {grid.retries + 1} times; last: {_last_line(result.error)}")
            )
    if refused:
        raise RunRefused("; ".join(f"{run.name}: {error}" for run, error in refused))
    if failed:
        raise RunFailed(
            "; ".join(
                f"{run.name} failed ({error}; its log: {run.folder / RUN_LOG})" for run, error in failed
            )
        )


@contextlib.contextmanager
def _quiet_tune() -> Iterator[None]:
    """Tune's own console output off (the grid has its one progress line), none of its per-trial result loggers
    (the runs' folders hold their metrics), and Ctrl-C left to Python: it interrupts the grid at once (the runs
    keep their checkpoints) instead of asking Tune to wind the experiment down."""
    quiet = {
        "RAY_AIR_NEW_OUTPUT": "0",
        "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
        "TUNE_DISABLE_SIGINT_HANDLER": "1",
    }
    saved = {name: os.environ.get(name) for name in quiet}
    os.environ.update(quiet)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _last_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__


def _trial_resources(resources: RunResources) -> dict[str, float]:
    """What a trial itself holds: the run's cores and GPUs, or, when Ray Train's workers hold them, one byte of
    memory (Tune takes no empty request, and a share of a core would keep a worker off a full node)."""
    if resources.workers > 1:
        return {"cpu": 0, "memory": 1}
    return {"cpu": resources.cpus, "gpu": resources.gpus}


def _trial(config: dict[str, int], grid: Grid) -> None:
    """One Tune trial: the run ``config["run"]`` of ``grid``, its output appended to the run's log."""
    from ray import tune

    run = grid.runs[config["run"]]
    with run_log(run.folder), _usage(run.folder, grid.desc):
        try:
            if grid.resources.workers > 1:
                _train_data_parallel(config, grid)
            else:
                _set_threads(grid.resources.cpus)
                grid.work(run, [TuneReport(tune.report)])
        except Exception as error:  # the run's own error: the same settings would raise it again, so no retry
            traceback.print_exc()
            tune.report(
                {_ERROR: str(error) or type(error).__name__, "refused": isinstance(error, UsageError)}
            )


@contextlib.contextmanager
def _usage(folder: Path, phase: str) -> Iterator[None]:
    """Append this attempt's wall and CPU seconds (this process and the processes it waited for) to the run's
    usage.json; a data-parallel run's workers are other processes: its CPU seconds are the trial's alone."""
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
        path = folder / USAGE_JSON
        attempts = read_json(path)["attempts"] if path.is_file() else []
        attempt = {"phase": phase, "wall_seconds": time.monotonic() - start, "cpu_seconds": cpu() - cpu_start}
        write_json(path, {"attempts": [*attempts, attempt]})


def usage_seconds(folders: Sequence[Path]) -> dict[str, float]:
    """The wall and CPU seconds of every attempt at the runs in ``folders`` (their usage.json files); an attempt
    whose worker was killed left none."""
    attempts = [
        attempt
        for folder in folders
        if (folder / USAGE_JSON).is_file()
        for attempt in read_json(folder / USAGE_JSON)["attempts"]
    ]
    return {key: sum(attempt[key] for attempt in attempts) for key in ("wall_seconds", "cpu_seconds")}


def _set_threads(cpus: int) -> None:
    import torch

    torch.set_num_threads(cpus)


def _train_data_parallel(config: dict[str, int], grid: Grid) -> None:
    """Train the run with ``grid.resources.workers`` data-parallel processes under Ray Train, its progress
    reported to this trial."""
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    run, resources = grid.runs[config["run"]], grid.resources
    trainer = TorchTrainer(
        _data_parallel_worker,
        train_loop_config={"run": config["run"], "grid": grid},
        scaling_config=ray.train.ScalingConfig(
            num_workers=resources.workers,
            use_gpu=resources.gpus > 0,
            resources_per_worker={"CPU": resources.cpus_per_worker, "GPU": resources.gpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            name=f"{run.folder.name}-{int(time.time())}",
            storage_path=str(run.folder / "ray-train"),
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=0),  # Tune starts the trial again instead
        ),
    )
    trainer.fit()


def _data_parallel_worker(config: dict[str, Any]) -> None:
    """One of a run's data-parallel workers (Ray Train set RANK, WORLD_SIZE and the process group)."""
    import ray.train

    grid: Grid = config["grid"]
    run = grid.runs[config["run"]]
    _set_threads(grid.resources.cpus_per_worker)
    with run_log(run.folder, suffix="" if ray.train.get_context().get_world_rank() == 0 else "rank"):
        # Ray Train's report is collective: every worker reports at every logging and evaluation step.
        grid.work(run, [TuneReport(ray.train.report, every_process=True)])


@contextlib.contextmanager
def run_log(folder: Path, suffix: str = "") -> Iterator[None]:
    """Append this process's standard output and error (Python's and the C libraries') to ``folder/run.log``
    (``run.SUFFIX.PID.log`` for a worker other than the first) while the block runs."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (RUN_LOG if not suffix else f"run.{suffix}.{os.getpid()}.log")
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab", buffering=0) as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {_where()} ---\n".encode())
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


def _where() -> str:
    """This process as a run's log names it: its pid and its Ray node."""
    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "none"
    return f"pid {os.getpid()} on Ray node {node}"


class TuneReport(TrainerCallback):
    """Reports the step and the validation loss at each evaluation, and the step at each logging step, to the
    trial (the progress display and early stopping read them): from the main process, or from ``every_process``
    (Ray Train's report, which every worker calls alike)."""

    def __init__(self, report: Callable[[dict], None], every_process: bool = False) -> None:
        self.report, self.every_process = report, every_process

    def _reports(self, state) -> bool:
        return self.every_process or state.is_world_process_zero

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._reports(state) and logs and EVAL_LOSS not in logs:
            self.report({"step": state.global_step, "max_steps": state.max_steps})

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self._reports(state) and metrics and EVAL_LOSS in metrics:
            self.report(
                {"step": state.global_step, "max_steps": state.max_steps, EVAL_LOSS: metrics[EVAL_LOSS]}
            )
