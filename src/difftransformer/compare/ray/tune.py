"""A comparison's runs fanned out over a Ray cluster by Ray Tune.

Every run is one Tune trial holding :class:`~difftransformer.compare.ray.resources.RunResources`; Tune starts as
many at once as the cluster holds, in the grid's order, and starts a trial again when its worker process dies
(killed, out of memory, its node lost), up to ``retries`` times: the run then resumes from its folder's last
checkpoint, as ``train --resume`` does, and ends with the weights an uninterrupted run gets. An exception raised by
the run itself is not retried (it would be raised again); it is reported with the run's log. A run of several
workers trains data-parallel under Ray Train (:mod:`.train_worker`). With ``early_stop``, ASHA stops the runs whose
validation loss falls behind the other runs of the same arm.

The folders are the state: a run writes only into its own folder, on storage that the driver and every node share,
and what Tune keeps of its own (trial results) goes to a temporary folder. The console holds the grid's progress
line and the package's one-line notes; Tune's account of a failed attempt (a traceback) goes to that run's log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

from difftransformer.compare.ray.grid import Grid
from difftransformer.compare.ray.reporting import EVAL_LOSS, TuneReport, node_name
from difftransformer.compare.ray.resources import RunResources
from difftransformer.errors import UsageError

_ERROR = "error"  # the metric a run reports its own exception under (not retried)
_TRIAL = re.compile(
    r"\btrial run(\d+)\b"
)  # how Tune names a trial in its messages (trial_name_creator below)


class RunRefused(UsageError):
    """A run refused its settings or its folder (a :class:`UsageError` raised in the worker): the message is the
    run's."""


class RunDied(UsageError):
    """Runs whose worker process died more often than the grid retries them (killed, out of memory, a node lost):
    each with the last error and its log; the same command continues them."""


class RunFailed(RuntimeError):
    """Runs that raised an error of their own (a bug): each with its error and the log that holds the traceback."""


def run_grid(grid: Grid) -> None:
    """Run every run of ``grid`` on the connected Ray cluster, showing one progress display for the whole grid.
    Raises :class:`RunRefused` when a run refused its settings, :class:`RunFailed` when a run raised another
    error, :class:`RunDied` when a run's worker died more often than ``grid.retries`` (each naming the run, its
    error and its log); runs stopped early by ASHA are not failures."""
    if not grid.runs:
        return
    from ray import tune

    from difftransformer.compare.ray.progress import GridProgress
    from difftransformer.compare.ray.schedulers import PerArmASHA
    from difftransformer.compare.ray.train_worker import no_coordinator_left

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
        data_parallel = no_coordinator_left() if grid.resources.workers > 1 else contextlib.nullcontext()
        try:
            with _quiet_tune(), _failures_to_run_logs(grid), data_parallel:
                results = tuner.fit()
        finally:
            progress.close()
    check_results(grid, results)


def check_results(grid: Grid, results: Iterable[Any]) -> None:
    """Raise for the runs of ``grid`` that did not finish, by Tune's ``results`` (each with the ``config`` of its
    trial, the ``metrics`` it last reported and the ``error`` that ended it): see :func:`run_grid`."""
    refused, failed, died = [], [], []
    for result in results:
        run = grid.runs[result.config["run"]]
        metrics = result.metrics or {}
        if metrics.get(_ERROR):
            (refused if metrics.get("refused") else failed).append((run, metrics[_ERROR]))
        elif result.error is not None:
            died.append((run, _last_line(result.error)))
    if refused:
        raise RunRefused("; ".join(f"{run.name}: {error}" for run, error in refused))
    if failed:
        raise RunFailed(
            "; ".join(f"{run.name} failed ({error}; its log: {run.log})" for run, error in failed)
        )
    if died:
        raise RunDied(
            "; ".join(
                f"{run.name}: its worker died {grid.retries + 1} time(s), more than `run_retries` {grid.retries} "
                f"allows (last: {error}; its log: {run.log})"
                for run, error in died
            )
            + "; the same command continues (finished runs are reused, a killed one resumes)"
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


class _RunLogs(logging.Handler):
    """Tune's messages about one trial (a failed attempt's "Trial task failed for trial runN" and its traceback)
    appended to that run's log; any other message handed on to the loggers above."""

    def __init__(self, grid: Grid, above: logging.Logger) -> None:
        super().__init__()
        self.grid, self.above = grid, above
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        found = _TRIAL.search(record.getMessage())
        if found is None or int(found.group(1)) >= len(self.grid.runs):
            self.above.handle(record)
            return
        log = self.grid.runs[int(found.group(1))].log
        log.parent.mkdir(parents=True, exist_ok=True)  # an attempt may fail before its worker made the folder
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"\n{self.format(record)}\n")


@contextlib.contextmanager
def _failures_to_run_logs(grid: Grid) -> Iterator[None]:
    """Route Tune's messages that name a trial into the run's log while the grid runs (the console keeps the
    package's one-line note on the retry)."""
    tune_logger = logging.getLogger("ray.tune")
    handler = _RunLogs(grid, tune_logger.parent)
    propagate = tune_logger.propagate
    tune_logger.addHandler(handler)
    tune_logger.propagate = False
    try:
        yield
    finally:
        tune_logger.removeHandler(handler)
        tune_logger.propagate = propagate


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
    """One Tune trial: the run ``config["run"]`` of ``grid``; an error of the run's own is reported as its result
    (its traceback is in the run's log)."""
    import torch
    from ray import tune

    from difftransformer.compare.ray.train_worker import train_data_parallel

    run = grid.runs[config["run"]]
    try:
        if grid.resources.workers > 1:
            train_data_parallel(config["run"], grid)
        else:
            torch.set_num_threads(grid.resources.cpus)
            grid.work(run, [TuneReport(tune.report)], node_name())
    except Exception as error:  # the run's own error: the same settings would raise it again, so no retry
        tune.report({_ERROR: str(error) or type(error).__name__, "refused": isinstance(error, UsageError)})
