"""What the grid shows and says, without a cluster: runs that did not finish end the command in one line (a worker
that died more often than --run-retries, a run that refused its folder), Tune's account of a failed attempt goes
to that run's log and not to the console, a retry's log header starts on its own line, the progress line is plain
lines at a modest rate where the output is not a terminal, and a data-parallel run reports to Ray only at its
evaluations and checkpoints."""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from difftransformer.compare.ray.grid import Grid
from difftransformer.compare.ray.progress import GridProgress
from difftransformer.compare.ray.reporting import TuneReport
from difftransformer.compare.ray.resources import RunResources
from difftransformer.compare.ray.tune import (
    RunDied,
    RunFailed,
    RunRefused,
    _failures_to_run_logs,
    check_results,
)
from difftransformer.compare.work import run_log
from difftransformer.errors import UsageError


def grid_of(tmp_path: Path, count: int = 3, retries: int = 3) -> Grid:
    runs = []
    for index in range(count):
        folder = tmp_path / f"run{index}"
        folder.mkdir()
        runs.append(SimpleNamespace(name=f"DIFF micro seed {index}", folder=folder, log=folder / "run.log", arm="a",
                                    max_steps=10))  # fmt: skip
    return Grid(tuple(runs), work=None, resources=RunResources(), retries=retries)


def result(index: int, metrics: dict | None = None, error: BaseException | None = None) -> SimpleNamespace:
    return SimpleNamespace(config={"run": index}, metrics=metrics, error=error)


def test_runs_that_did_not_finish_end_the_command_in_one_line_naming_each_and_its_log(tmp_path):
    """A worker that died more often than --run-retries ended in Ray's traceback and the package's RunFailed
    traceback (the sweep report's defect 10): it is a one-line UsageError now, as is a run's refusal."""
    grid = grid_of(tmp_path, retries=2)
    check_results(grid, [result(0, {"step": 10}), result(1, {}), result(2, None)])  # all finished
    died = [
        result(0, {"step": 10}),
        result(1, {"step": 4}, RuntimeError("Traceback ...\nThe actor died unexpectedly")),
    ]
    with pytest.raises(RunDied) as error:
        check_results(grid, died)
    line = str(error.value)
    assert isinstance(error.value, UsageError) and "\n" not in line
    assert line.startswith("DIFF micro seed 1: its worker died 3 time(s), more than `run_retries` 2 allows (last: "
                           f"The actor died unexpectedly; its log: {tmp_path / 'run1' / 'run.log'})")  # fmt: skip
    assert line.endswith("; the same command continues (finished runs are reused, a killed one resumes)")
    refused = [
        result(0, {"error": "`output_dir` '/x': cannot load the model: bad config", "refused": True}),
        *died,
    ]
    with pytest.raises(RunRefused, match=r"^DIFF micro seed 0: `output_dir` '/x': cannot load the model"):
        check_results(grid, refused)
    with pytest.raises(RunFailed, match=r"^DIFF micro seed 2 failed \(KeyError: 'x'; its log: "):
        check_results(grid, [result(2, {"error": "KeyError: 'x'", "refused": False})])
    assert not isinstance(RunFailed("bug"), UsageError)  # a bug keeps its traceback


def test_tunes_account_of_a_failed_attempt_goes_to_that_runs_log_not_the_console(tmp_path):
    """Ray Tune's 25-line "Trial task failed for trial run0" traceback was printed above the package's one-line
    note on every retry (a papercut of the sweep report)."""
    grid = grid_of(tmp_path)
    console = io.StringIO()
    ray_logger = logging.getLogger("ray")
    handler = logging.StreamHandler(console)
    ray_logger.addHandler(handler)
    try:
        with _failures_to_run_logs(grid):
            try:
                raise RuntimeError("The actor died unexpectedly before finishing this task.")
            except RuntimeError as error:
                logging.getLogger("ray.tune.execution.tune_controller").error(
                    "Trial task failed for trial run1", exc_info=error
                )
            logging.getLogger("ray.tune.tuner").error("Tune could not save its state")
    finally:
        ray_logger.removeHandler(handler)
    log = (tmp_path / "run1" / "run.log").read_text()
    assert "Trial task failed for trial run1" in log and "RuntimeError: The actor died unexpectedly" in log
    assert console.getvalue() == "Tune could not save its state\n"  # a message about no trial stays
    assert not (tmp_path / "run0" / "run.log").exists()


def test_a_retrys_log_header_starts_on_its_own_line(tmp_path):
    """A killed attempt leaves its progress bar's line unfinished; the retry's header was glued to it."""
    (tmp_path / "run.log").write_text("--- first ---\nDIFF micro seed 0:  40%|████      | 4/10")
    with run_log(tmp_path, "Ray node abc"):
        os.write(1, b"resuming from checkpoint-3\n")  # the process's standard output, as a worker writes it
    lines = (tmp_path / "run.log").read_text().splitlines()
    assert lines[1] == "DIFF micro seed 0:  40%|████      | 4/10"
    assert lines[2].startswith("--- ") and lines[2].endswith(" on Ray node abc ---") and "pid " in lines[2]
    assert lines[3] == "resuming from checkpoint-3"
    with run_log(tmp_path, "Ray node abc"):
        pass
    assert (tmp_path / "run.log").read_text().splitlines()[4].startswith("--- ")  # no empty line before it


def test_the_progress_line_is_plain_lines_at_a_modest_rate_where_output_is_not_a_terminal(tmp_path):
    """Written into a log, the grid's line was redrawn with carriage returns hundreds of times a minute."""
    grid = grid_of(tmp_path, count=2)
    out = io.StringIO()
    progress = GridProgress(grid.runs, "compare", stream=out)
    trials = [SimpleNamespace(config={"run": index}) for index in range(2)]
    for trial in trials:
        progress.on_trial_start(0, trials, trial)
    for step in range(1, 200):
        progress.on_trial_result(0, trials, trials[step % 2], {"step": step // 2})
    progress.on_trial_complete(0, trials, trials[0])
    progress.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 4, lines
    assert lines[0].startswith("compare: 0/2 runs done, 0 running, 2 waiting;")
    assert lines[-1].startswith("compare: 1/2 runs done, 1 running, 0 waiting;")


def test_a_data_parallel_run_reports_at_evaluations_and_checkpoints_only():
    """Ray Train's report is a collective of every worker: at every logging step it made a DDP run over Ray about
    20 times slower (the sweep report)."""
    said = []
    state = SimpleNamespace(global_step=4, max_steps=10, is_world_process_zero=True)
    workers = TuneReport(said.append, every_process=True)
    workers.on_log(None, state, None, logs={"loss": 2.0})
    assert said == []
    workers.on_evaluate(None, state, None, metrics={"eval_loss": 1.5})
    workers.on_save(None, state, None)
    assert said == [{"step": 4, "max_steps": 10, "eval_loss": 1.5}, {"step": 4, "max_steps": 10}]
    said.clear()
    trial = TuneReport(said.append)  # one process: the step at every logging step feeds the progress line
    trial.on_log(None, state, None, logs={"loss": 2.0})
    trial.on_save(None, state, None)
    assert said == [{"step": 4, "max_steps": 10}]


def test_every_kind_builds_the_cpu_kernels_before_its_timed_steps(data, tmp_path, monkeypatch):
    """The softmax baseline's first evaluation built the C++ kernels (its RMSNorm) inside the timed loop, so a
    comparison's first Transformer run reported a tenth of its tokens/s (the sweep report's defect 5)."""
    from difftransformer.train import runner
    from difftransformer.train.presets import get_preset

    built = []
    monkeypatch.setattr(runner, "fused_cpu_available", lambda: built.append("built") or True)
    tokenizer, blocks, validation = data
    preset = get_preset("micro")
    config = preset.model_config("softmax", vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    settings = preset.training_settings(output_dir=str(tmp_path), max_steps=1, report_to="none", save_steps=1)
    runner.train_model(config, blocks, validation, tokenizer, settings)
    assert built == ["built"]
