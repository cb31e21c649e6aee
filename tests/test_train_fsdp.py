"""FSDP (FSDP2 through Trainer/accelerate) on two CPU processes over gloo, as ``--fsdp "full_shard auto_wrap"``
gives it: the same losses as one process with the same global batch, a resume after a kill that reproduces an
uninterrupted run, a final model that loads in one process, and the ``train`` command under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.presets import RECIPE, get_preset
from difftransformer.train.runner import METRICS_CSV, check_run_folder, train_model
from difftransformer.train.settings import TrainingSettings
from helpers import free_port
from test_train_support import pack, small_tokenizer, synthetic_texts


class DieAfter(TrainerCallback):
    """Ends the process abruptly right after checkpoint ``step`` is finished, as a kill would leave the folder."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os._exit(17)


def train_micro(output_dir, batch: int, flags=()) -> None:
    """One run of the micro model on the synthetic corpus, ``batch`` blocks per process; ``flags``: fsdp (shard
    across the processes), bf16, resume, die-after=N (see :class:`DieAfter`)."""
    die_after = next((int(f.split("=")[1]) for f in flags if f.startswith("die-after=")), None)
    texts = synthetic_texts()
    tokenizer = small_tokenizer(texts)
    blocks = pack(texts, tokenizer, 32)
    config = get_preset("micro").model_config(
        "diff", vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id
    )
    fsdp = dict(fsdp="full_shard auto_wrap") if "fsdp" in flags else {}
    settings = TrainingSettings(**{**RECIPE, **fsdp, **dict(
        output_dir=str(output_dir), max_steps=4, per_device_train_batch_size=batch, logging_steps=1, eval_steps=4,
        save_steps=2, learning_rate=3e-3, warmup_steps=1, report_to="none", bf16="bf16" in flags)})  # fmt: skip
    callbacks = [DieAfter(die_after)] if die_after else []
    train_model(
        config, blocks[:-8], blocks[-8:], tokenizer, settings, resume="resume" in flags, callbacks=callbacks
    )


SCRIPT = "import sys\nfrom test_train_fsdp import train_micro\ntrain_micro(sys.argv[1], int(sys.argv[2]), sys.argv[3:])\n"


def run_script(tmp_path, output_dir, batch, *flags, processes=1, check=True) -> subprocess.CompletedProcess:
    script = tmp_path / "fsdp_train.py"
    script.write_text(SCRIPT)
    # the tests' folder first, the caller's path kept (a checkout run without installing it)
    path = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable]
    if processes > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={processes}",
            f"--master_port={free_port()}",
        ]
    command = [*launcher, str(script), str(output_dir), str(batch), *flags]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, failure_text(done.stderr)
    return done


def failure_text(stderr: str) -> str:
    """The end of each rank's own lines, then the end of all: the rank that failed first is the cause, and the
    others' tracebacks (which come last) only say that they lost their peer."""
    ranks: dict[str, list[str]] = {}
    for line in stderr.splitlines():
        if line.startswith("[rank"):
            ranks.setdefault(line.split("]")[0], []).append(line)
    return "\n".join(["\n".join(lines)[-2500:] for lines in ranks.values()] + [stderr[-1500:]])


def losses(output_dir, name="loss") -> tuple[list[int], list[float]]:
    return column(read_metrics(output_dir / METRICS_CSV), name)


def test_two_fsdp_processes_match_one_and_save_one_ordinary_folder(tmp_path):
    train_micro(tmp_path / "one", 8)
    run_script(tmp_path, tmp_path / "fsdp", 4, "fsdp", processes=2)
    one, fsdp = tmp_path / "one", tmp_path / "fsdp"
    # FSDP really ran: accelerate's FSDP checkpoint files, not DDP's optimizer.pt
    assert (fsdp / "checkpoint-4" / "pytorch_model_fsdp.bin").is_file()
    assert (fsdp / "checkpoint-4" / "optimizer.bin").is_file()
    assert not (fsdp / "checkpoint-4" / "optimizer.pt").exists()
    assert losses(fsdp)[0] == losses(one)[0] == [1, 2, 3, 4]
    assert losses(fsdp)[1] == pytest.approx(losses(one)[1], abs=1e-5)
    assert losses(fsdp, "eval_loss")[1] == pytest.approx(losses(one, "eval_loss")[1], abs=1e-5)
    # The final model is one ordinary safetensors file with full (unsharded) tensors, loadable in one process.
    saved, reference = load_file(fsdp / "model.safetensors"), load_file(one / "model.safetensors")
    assert saved.keys() == reference.keys()
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, reference[name], atol=1e-5, rtol=1e-4, msg=name)
    from difftransformer import DiffTransformerForCausalLM

    model = DiffTransformerForCausalLM.from_pretrained(fsdp).eval()
    texts = synthetic_texts()
    ids = pack(texts, small_tokenizer(texts), 32)[:2]
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


@pytest.mark.slow
def test_fsdp_run_killed_after_a_checkpoint_resumes_to_the_same_losses(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    run_script(tmp_path, whole, 4, "fsdp", processes=2)
    killed = run_script(tmp_path, split, 4, "fsdp", "die-after=2", processes=2, check=False)
    assert killed.returncode != 0
    assert losses(split)[0] == [1, 2]
    assert not (split / "model.safetensors").exists()
    (split / "checkpoint-3").mkdir()  # and a half-written save after it, to be set aside
    (split / "checkpoint-3" / "config.json").write_text("{}")
    run_script(tmp_path, split, 4, "fsdp", "resume", processes=2)
    assert (split / "incomplete-checkpoint-3" / "config.json").is_file()
    assert losses(split)[0] == [1, 2, 3, 4]
    assert losses(split)[1] == pytest.approx(losses(whole)[1], abs=1e-6)
    assert losses(split, "eval_loss")[1] == pytest.approx(losses(whole, "eval_loss")[1], abs=1e-6)
    for name, tensor in load_file(split / "model.safetensors").items():
        torch.testing.assert_close(tensor, load_file(whole / "model.safetensors")[name], atol=1e-6, rtol=0)


@pytest.mark.slow
def test_train_command_under_torchrun_with_fsdp(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(synthetic_texts()))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DIFFTRANSFORMER_CACHE": str(tmp_path / "cache")}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
        "-m", "difftransformer", "train", "--fsdp", "full_shard auto_wrap", "--preset", "micro",
        "--data", str(corpus), "--block-size", "64", "--needle-fraction", "0", "--max-steps", "3", "--save-steps", "3",
        "--per-device-train-batch-size", "2", "--report-to", "none", "--output-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "run" / "checkpoint-3" / "pytorch_model_fsdp.bin").is_file()
    from difftransformer import DiffTransformerForCausalLM

    model = DiffTransformerForCausalLM.from_pretrained(tmp_path / "run")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_sharded_state_dicts_are_refused_before_training(tmp_path):
    texts = synthetic_texts()
    tokenizer = small_tokenizer(texts)
    blocks = pack(texts, tokenizer, 32)
    config = get_preset("micro").model_config("diff", vocab_size=len(tokenizer))
    settings = TrainingSettings(**{**RECIPE, **dict(
        output_dir=str(tmp_path), max_steps=1, report_to="none", fsdp="full_shard auto_wrap",
        fsdp_config={"state_dict_type": "SHARDED_STATE_DICT"})})  # fmt: skip
    with pytest.raises(ValueError, match="state_dict_type must be FULL_STATE_DICT"):
        train_model(config, blocks[:-8], blocks[-8:], tokenizer, settings)
    assert not any(tmp_path.iterdir())


def test_only_the_main_process_probes_the_run_folder(tmp_path, monkeypatch):
    # Under torchrun every process checks the run folder; the write probe makes the folder and removes it again.
    # Made by another rank, it raced the main process: with a lock and a probe started together, 5 to 33 of 150
    # tries failed here ("File exists"), and a folder removed under the main process's new lock file kills rank 0
    # (FileNotFoundError) before its peers, who then lose it over gloo.
    folder = tmp_path / "run"
    made: list[Path] = []
    mkdir = Path.mkdir

    def recording_mkdir(self, *args, **kwargs):
        made.append(self)
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", recording_mkdir)
    monkeypatch.setenv("RANK", "1")
    assert check_run_folder(folder, resume=False) == folder and made == []
    monkeypatch.setenv("RANK", "0")  # the main process, which writes the folder, still probes it
    assert check_run_folder(folder, resume=False) == folder and made == [folder] and not folder.exists()
