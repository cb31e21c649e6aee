"""What a user can get wrong with ``convert`` and ``train`` ends in one line with exit 2 (Ctrl-C in one line with exit
130, taken at the end of a step), a conversion never changes its input or leaves a half-written output, and the
commands refuse a model folder whose weights are not finite or that an edit made another model (the fingerprint
``train`` records at every save)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import LlamaForCausalLM

from difftransformer.cli import main as cli_main
from difftransformer.models.loading import PROVENANCE_JSON, folder_fingerprint
from difftransformer.train.callbacks import CtrlCAtStepEnd
from difftransformer.train.checkpoints import COMPLETE_MARKER
from helpers import random_model
from test_convert import random_diffllama
from test_convert_llama import random_llama
from test_train_support import as_from_a_shell, synthetic_texts


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def refused(argv: list[str], capsys) -> str:
    """Run ``argv``, check it exits 2 with one line on stderr (beside transformers' progress bar of a model it read)
    and no traceback, return that line."""
    capsys.readouterr()
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.replace("\r", "\n").splitlines() if not line.startswith("Loading weights")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def softmax_run(tmp_path) -> Path:
    folder = tmp_path / "run"
    random_model(attention="softmax", num_attention_heads=4).save_pretrained(folder)
    return folder


def test_convert_never_writes_into_or_around_its_input(softmax_run, tmp_path, capsys):
    before = snapshot(softmax_run)
    for output, says in [
        (softmax_run, "outside the source"),
        (softmax_run / "llama", "outside the source"),
        (tmp_path, "must not contain the source"),
    ]:
        assert says in refused(
            ["convert", "--to-llama", str(softmax_run), "--output-dir", str(output)], capsys
        )
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("keep me")
    err = refused(
        ["convert", "--to-llama", str(softmax_run), "--output-dir", str(tmp_path / "taken")], capsys
    )
    assert "new or empty folder" in err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "keep me"
    assert snapshot(softmax_run) == before and not (softmax_run / "llama").exists()


def test_a_conversion_that_fails_while_saving_leaves_nothing(softmax_run, tmp_path, monkeypatch):
    def broken_save(self, folder, **kwargs):
        (Path(folder) / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(LlamaForCausalLM, "save_pretrained", broken_save)
    before = snapshot(softmax_run)
    with pytest.raises(RuntimeError, match="disk full"):
        cli_main(["convert", "--to-llama", str(softmax_run), "--output-dir", str(tmp_path / "out")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no output, no staging folder
    assert snapshot(softmax_run) == before


def test_native_folders_are_refused_by_the_to_directions(tmp_path, capsys):
    random_llama(2).save_pretrained(tmp_path / "llama")
    random_diffllama(2).save_pretrained(tmp_path / "diffllama")
    for flag, folder in [
        ("--to-llama", "llama"),
        ("--to-diffllama", "diffllama"),
        ("--to-llama", "diffllama"),
    ]:
        err = refused(
            ["convert", flag, str(tmp_path / folder), "--output-dir", str(tmp_path / "out")], capsys
        )
        assert "model_type" in err and "--from-" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "damage", ["truncated weights", "no weights", "junk config", "config without a type"]
)
def test_damaged_folders_are_refused_in_one_line(softmax_run, tmp_path, capsys, damage):
    weights = softmax_run / "model.safetensors"
    if damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "no weights":
        weights.unlink()
    elif damage == "junk config":
        (softmax_run / "config.json").write_text("{ this is not json")
    else:
        (softmax_run / "config.json").write_text("[1, 2]")
    before = snapshot(softmax_run)
    for flag in ("--to-llama", "--from-llama"):
        refused(["convert", flag, str(softmax_run), "--output-dir", str(tmp_path / "out")], capsys)
    assert snapshot(softmax_run) == before and not (tmp_path / "out").exists()


@pytest.fixture
def train_argv(tmp_path, monkeypatch) -> tuple[list[str], Path]:
    monkeypatch.setenv("DIFFTRANSFORMER_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(synthetic_texts()))
    run = tmp_path / "run"
    argv = [
        "train", "--data", str(corpus), "--block-size", "64", "--needle-fraction", "0", "--report-to", "none",
        "--output-dir", str(run),
    ]  # fmt: skip
    return argv, run


def test_resume_with_another_preset_is_refused_in_one_line(train_argv, capsys):
    argv, run = train_argv
    assert cli_main([*argv, "--preset", "micro", "--max-steps", "1", "--save-steps", "1"]) == 0
    err = refused([*argv, "--preset", "tiny", "--max-steps", "2", "--resume"], capsys)
    assert "checkpoint-1 holds another model" in err and "hidden_size=32" in err and "hidden_size=128" in err


@pytest.mark.slow
def test_ctrl_c_ends_train_with_a_one_line_note(train_argv):
    argv, run = train_argv
    command = [
        *argv,
        "--preset",
        "micro",
        "--max-steps",
        "100000",
        "--save-steps",
        "2",
        "--eval-steps",
        "100000",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "difftransformer", *command],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=as_from_a_shell,
    )
    # Deadlines only against a hang: the run builds its C++ kernels in its fresh cache first (a minute alone, several
    # on a busy machine), and Ctrl-C is taken at the end of the step it lands in.
    deadline = time.monotonic() + 900
    while not (run / "checkpoint-2" / COMPLETE_MARKER).is_file() and process.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 900 s"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Exception ignored" not in err, err
    note = "difftransformer train: interrupted; `--resume` continues from checkpoint-"
    assert any(line.startswith(note) for line in err.replace("\r", "\n").splitlines()), err[-500:]


def test_ctrl_c_waits_for_the_end_of_the_step_and_a_second_one_interrupts_at_once():
    # the signal comes while a library builds an object (here a tqdm bar, as transformers' checkpoint writer does):
    # nothing is raised inside it; the callback raises at the step's end, a point of the run's own
    callback = CtrlCAtStepEnd()
    previous = signal.getsignal(signal.SIGINT)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # as a shell would start the command
    try:
        with callback.armed():
            signal.raise_signal(signal.SIGINT)
            bar = tqdm(total=3, desc="writing shards")
            bar.update(3)
            bar.close()
            assert callback.requested
            with pytest.raises(KeyboardInterrupt):
                callback.on_step_end(None, None, None)
            with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C: Python's own, at once
                signal.raise_signal(signal.SIGINT)
                time.sleep(5)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert signal.getsignal(signal.SIGINT) is previous


def test_train_fingerprints_each_save_and_the_commands_refuse_an_edited_or_poisoned_folder(
    train_argv, tmp_path, capsys
):
    argv, run = train_argv
    assert cli_main([*argv, "--preset", "micro", "--max-steps", "1", "--save-steps", "1"]) == 0
    for folder in (run, run / "checkpoint-1"):
        recorded = json.loads((folder / PROVENANCE_JSON).read_text())["saved"]
        assert recorded == folder_fingerprint(folder), folder
    assert len(json.loads((run / PROVENANCE_JSON).read_text())["invocations"]) == 1
    edited = tmp_path / "edited"
    shutil.copytree(run, edited)
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "rope_style": "half"}))
    nan = tmp_path / "nan"
    shutil.copytree(run, nan)
    (nan / PROVENANCE_JSON).unlink()  # a folder written before fingerprints: the values alone refuse it
    tensors = load_file(nan / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")
    save_file(tensors, nan / "model.safetensors", metadata={"format": "pt"})
    for folder, says in [
        (edited, "config.json's model-defining fields changed since the model was saved"),
        (
            nan,
            "1 tensor of the weights holds NaN or infinite values (model.layers.0.self_attn.q_proj.weight)",
        ),
    ]:
        commands = [
            ["generate", str(folder), "--prompt", "the", "--max-new-tokens", "2"],
            ["eval", "outliers", "--model", str(folder)],
            ["convert", "--to-diffllama", str(folder), "--output-dir", str(tmp_path / "converted")],
            [*argv[:-1], str(tmp_path / "init"), "--preset", "micro", "--max-steps", "1", "--init-from", str(folder)],
        ]  # fmt: skip
        for command in commands:
            err = refused(command, capsys)
            assert "cannot load the model" in err and says in err, (command[0], err)
        assert not (tmp_path / "converted").exists() and not (tmp_path / "init").exists()


def test_resume_from_a_checkpoint_whose_weights_are_not_finite_is_refused_before_training(train_argv, capsys):
    argv, run = train_argv
    assert cli_main([*argv, "--preset", "micro", "--max-steps", "1", "--save-steps", "1"]) == 0
    weights = run / "checkpoint-1" / "model.safetensors"
    tensors = load_file(weights)
    tensors["lm_head.weight"][3, 1] = float("inf")
    save_file(tensors, weights, metadata={"format": "pt"})
    metrics = (run / "metrics.csv").read_text()
    err = refused([*argv, "--preset", "micro", "--max-steps", "3", "--save-steps", "1", "--resume"], capsys)
    assert f"--resume '{run / 'checkpoint-1'}': cannot load the model:" in err
    assert "1 tensor of the weights holds NaN or infinite values (lm_head.weight)" in err
    assert (
        "the weights (*.safetensors) changed since the model was saved" in err
    )  # its fingerprint says so too
    assert (run / "metrics.csv").read_text() == metrics and not (run / "checkpoint-2").exists()
