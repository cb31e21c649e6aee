"""Resuming and guarding a run folder: set-aside checkpoints survive Trainer's rotation, ``--resume`` on a finished
run leaves it alone, and the folder's refusals reach the command line as one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from difftransformer.cli import main
from difftransformer.train.checkpoints import COMPLETE_MARKER
from difftransformer.train.lock import LOCK_NAME
from difftransformer.train.provenance import PROVENANCE_JSON
from difftransformer.train.runner import METRICS_CSV, SUMMARY_JSON, train_model
from test_train import StopAt, config_for, options, train_losses
from test_train_support import synthetic_texts


def test_set_aside_checkpoint_survives_rotation(tmp_path, data):
    tokenizer, train, val = data
    settings = dict(save_steps=1, save_total_limit=2)
    train_model(
        config_for(tokenizer), train, val, tokenizer, options(tmp_path, **settings), callbacks=[StopAt(3)]
    )
    (tmp_path / "checkpoint-3" / COMPLETE_MARKER).unlink()  # a kill during the save of step 3
    train_model(config_for(tokenizer), train, val, tokenizer, options(tmp_path, **settings), resume=True)
    # Rotation kept the two newest checkpoints and left the set-aside folder alone.
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-5", "checkpoint-6"]
    assert (tmp_path / "incomplete-checkpoint-3" / "trainer_state.json").is_file()
    assert len(train_losses(tmp_path)) == 6


def test_resume_of_a_finished_run_leaves_it_alone(tmp_path, data, capsys):
    tokenizer, train, val = data
    first = train_model(config_for(tokenizer), train, val, tokenizer, options(tmp_path, max_steps=3))
    metrics = (tmp_path / METRICS_CSV).read_text()
    weights = (tmp_path / "model.safetensors").read_bytes()
    capsys.readouterr()
    again = train_model(
        config_for(tokenizer), train, val, tokenizer, options(tmp_path, max_steps=3), resume=True
    )
    assert "is complete: checkpoint-3 reached --max-steps 3" in capsys.readouterr().out
    assert again == first
    assert (tmp_path / METRICS_CSV).read_text() == metrics
    assert (tmp_path / "model.safetensors").read_bytes() == weights
    assert not (tmp_path / "checkpoint-4").exists()
    # Killed during the final save: the final model comes from the last checkpoint, still without a step.
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / SUMMARY_JSON).unlink()
    restored = train_model(
        config_for(tokenizer), train, val, tokenizer, options(tmp_path, max_steps=3), resume=True
    )
    assert restored.global_step == 3
    assert restored.final_eval_loss == pytest.approx(first.final_eval_loss, abs=1e-6)
    saved, checkpoint = (
        load_file(tmp_path / "model.safetensors"),
        load_file(tmp_path / "checkpoint-3" / "model.safetensors"),
    )
    assert saved.keys() == checkpoint.keys()
    assert all(torch.equal(saved[name], checkpoint[name]) for name in saved)
    assert (tmp_path / METRICS_CSV).read_text() == metrics
    # A larger --max-steps trains on from there.
    longer = train_model(
        config_for(tokenizer), train, val, tokenizer, options(tmp_path, max_steps=4), resume=True
    )
    assert longer.global_step == 4 and len(train_losses(tmp_path)) == 4


@pytest.fixture
def train_command(tmp_path, monkeypatch):
    """``difftransformer train`` on a small text file: returns (argv prefix, run folder)."""
    monkeypatch.setenv("DIFFTRANSFORMER_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(synthetic_texts()))
    run = tmp_path / "run"
    argv = [
        "train", "--preset", "micro", "--data", str(corpus), "--block-size", "64", "--needle-fraction", "0",
        "--max-steps", "1", "--report-to", "none", "--output-dir", str(run),
    ]  # fmt: skip
    return argv, run


def test_a_folder_with_checkpoints_is_refused_in_one_line(train_command, capsys):
    argv, run = train_command
    (run / "checkpoint-7").mkdir(parents=True)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("difftransformer train: error: ") and "checkpoint-7" in err and "--resume" in err
    assert len(err.splitlines()) == 1


def test_a_folder_locked_by_a_live_run_is_refused_in_one_line(train_command, capsys):
    argv, run = train_command
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run.mkdir(parents=True)
        (run / LOCK_NAME).write_text(f"{owner.pid}\n")
        assert main(argv) == 2
    finally:
        owner.kill()
        owner.wait()
    err = capsys.readouterr().err.strip()
    assert err.startswith("difftransformer train: error: ") and f"process {owner.pid}" in err
    assert len(err.splitlines()) == 1


def test_provenance_records_only_invocations_that_train_and_a_damaged_checkpoint_is_refused(
    train_command, capsys
):
    argv, run = train_command
    argv = [*argv, "--save-steps", "1"]
    assert main([*argv, "--max-steps", "2"]) == 0
    entries = lambda: len(json.loads((run / PROVENANCE_JSON).read_text())["invocations"])  # noqa: E731
    assert entries() == 1
    # the saved tokenizer truncates to the model's context (64: the block size), as a Hub model's does
    assert json.loads((run / "tokenizer_config.json").read_text())["model_max_length"] == 64
    assert main([*argv, "--max-steps", "2", "--resume"]) == 0  # complete: nothing trained, nothing recorded
    assert entries() == 1
    weights = run / "checkpoint-2" / "model.safetensors"
    tensors = load_file(weights)
    tensors.pop("model.norm.weight")
    save_file(tensors, weights, metadata={"format": "pt"})
    capsys.readouterr()
    assert main([*argv, "--max-steps", "3", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        "difftransformer train: error: --resume: the checkpoint's weights do not match"
    ) and ("1 missing (model.norm.weight)" in err and "--output-dir" in err), err
    assert entries() == 1 and not (run / "checkpoint-3").exists()
