"""Training runs: exact resumption, the directory lock, broken checkpoints, the metrics CSV, presets."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

from difftransformer import DiffTransformerForCausalLM
from difftransformer.data.needles import NeedleSpec
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.checkpoints import COMPLETE_MARKER, checkpoint_problem, last_good_checkpoint
from difftransformer.train.lock import RunDirectoryLocked, RunLock
from difftransformer.train.mixture import MixedBlocks, RecallMix
from difftransformer.train.presets import PRESETS, RECIPE, get_preset
from difftransformer.train.retrieval import NeedleRows
from difftransformer.train.runner import METRICS_CSV, train_model
from difftransformer.train.settings import TrainingSettings
from test_train_support import pack, small_tokenizer, synthetic_texts


def options(output_dir, **overrides) -> TrainingSettings:
    fields = dict(
        RECIPE,
        output_dir=str(output_dir),
        max_steps=6,
        per_device_train_batch_size=4,
        logging_steps=1,
        eval_steps=3,
        save_steps=3,
        learning_rate=3e-3,
        warmup_steps=2,
        report_to="none",
    )
    fields.update(overrides)
    return TrainingSettings(**fields)


def config_for(tokenizer, attention="diff"):
    return get_preset("micro").model_config(
        attention, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id
    )


class StopAt(TrainerCallback):
    """Stops training at a step, as a kill right after that step's checkpoint would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def train_losses(output_dir) -> list[float]:
    return column(read_metrics(os.path.join(output_dir, METRICS_CSV)), "loss")[1]


def test_resume_reproduces_an_uninterrupted_run(tmp_path, data):
    tokenizer, train, val = data
    whole = train_model(config_for(tokenizer), train, val, tokenizer, options(tmp_path / "whole"))
    assert whole.global_step == 6
    train_model(
        config_for(tokenizer), train, val, tokenizer, options(tmp_path / "split"), callbacks=[StopAt(3)]
    )
    assert len(train_losses(tmp_path / "split")) == 3
    resumed = train_model(
        config_for(tokenizer), train, val, tokenizer, options(tmp_path / "split"), resume=True
    )
    assert resumed.global_step == 6
    expected, got = train_losses(tmp_path / "whole"), train_losses(tmp_path / "split")
    assert len(expected) == len(got) == 6
    assert expected[0] > expected[-1]  # it did learn something
    assert got == pytest.approx(expected, abs=1e-6)
    assert resumed.final_eval_loss == pytest.approx(whole.final_eval_loss, abs=1e-6)


def test_metrics_csv_and_final_model(tmp_path, data):
    tokenizer, train, val = data
    result = train_model(
        config_for(tokenizer, "softmax"), train, val, tokenizer, options(tmp_path, report_to="tensorboard")
    )
    rows = read_metrics(tmp_path / METRICS_CSV)
    steps, losses = column(rows, "loss")
    assert steps == [1, 2, 3, 4, 5, 6] and all(math.isfinite(x) for x in losses)
    eval_steps, eval_losses = column(rows, "eval_loss")
    assert eval_steps == [3, 6]
    _, perplexities = column(rows, "eval_perplexity")
    assert perplexities == pytest.approx([math.exp(x) for x in eval_losses], rel=1e-6)
    assert all(float(r["tokens_per_second"]) > 0 for r in rows if r["loss"])
    assert result.final_eval_loss == pytest.approx(eval_losses[-1])
    assert list((tmp_path / "runs").rglob("events.out.tfevents*"))
    for name in ("model.safetensors", "config.json", "tokenizer.json", "checkpoint-6/model.safetensors"):
        assert (tmp_path / name).is_file(), name


def test_existing_checkpoints_need_resume(tmp_path, data):
    tokenizer, train, val = data
    train_model(config_for(tokenizer), train, val, tokenizer, options(tmp_path, max_steps=3))
    with pytest.raises(FileExistsError, match="`resume`"):
        train_model(config_for(tokenizer), train, val, tokenizer, options(tmp_path, max_steps=3))


def test_incomplete_checkpoint_is_ignored_on_resume(tmp_path, data):
    tokenizer, train, val = data
    train_model(config_for(tokenizer), train, val, tokenizer, options(tmp_path), callbacks=[StopAt(3)])
    good = tmp_path / "checkpoint-3"
    assert checkpoint_problem(good) is None
    # A save killed half way: the files are there but the marker is not, and the weights are truncated.
    broken = tmp_path / "checkpoint-5"
    broken.mkdir()
    for path in good.iterdir():
        if path.name != COMPLETE_MARKER:
            (broken / path.name).write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])
    assert "did not finish" in checkpoint_problem(broken)
    (broken / COMPLETE_MARKER).write_text('{"global_step": 5}')
    assert "trainer_state" in checkpoint_problem(broken) or "safetensors" in checkpoint_problem(broken)
    assert last_good_checkpoint(tmp_path) == good
    assert not broken.exists() and (tmp_path / "incomplete-checkpoint-5").is_dir()
    result = train_model(config_for(tokenizer), train, val, tokenizer, options(tmp_path), resume=True)
    assert result.global_step == 6 and len(train_losses(tmp_path)) == 6


def test_lock_refuses_a_live_owner_and_takes_over_a_dead_one(tmp_path, data):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".lock").write_text(f"{child.pid}\n")
        tokenizer, train, val = data
        with pytest.raises(RunDirectoryLocked, match=f"in use by process {child.pid}"):
            train_model(config_for(tokenizer), train, val, tokenizer, options(tmp_path))
    finally:
        child.kill()
        child.wait()
    # The owner is dead now: its stale lock is taken over, and released at the end.
    assert (tmp_path / ".lock").read_text().strip() == str(child.pid)
    with RunLock(tmp_path) as lock:
        assert lock.held and (tmp_path / ".lock").read_text().strip() == str(os.getpid())
    assert not (tmp_path / ".lock").exists()


def test_presets_match_the_paper():
    paper = {"830m": (1536, 24, 8), "1.4b": (2048, 24, 8), "2.8b": (2560, 32, 10), "3b": (3072, 28, 12),
             "6.8b": (4096, 32, 16), "13.1b": (5120, 40, 20)}  # fmt: skip
    for name, (hidden, layers, heads) in paper.items():
        diff = PRESETS[name].model_config("diff")
        base = PRESETS[name].model_config("softmax")
        v2 = PRESETS[name].model_config("diff_v2")
        gated = PRESETS[name].model_config("gated")
        gda = PRESETS[name].model_config("gda", gda_ratio=3)
        assert (diff.hidden_size, diff.num_hidden_layers, diff.num_attention_heads) == (hidden, layers, heads)
        assert base.num_attention_heads == 2 * heads and base.attention == "softmax"
        assert v2.num_attention_heads == 2 * heads and v2.attention == "diff_v2"
        assert gated.num_attention_heads == 2 * heads and gated.head_dim == base.head_dim
        # GDA 3:1 spends the baseline's query heads as 3 signal heads to a noise map, rounded up to whole groups
        maps = 4 * -(-2 * heads // 4)
        assert (gda.num_attention_heads, gda.noise_heads, gda.map_head_dim) == (
            3 * maps // 4,
            maps // 4,
            base.head_dim,
        )
        # d: the baseline's head width, DIFF V1's map width (its value and cache are 2d wide).
        assert (
            base.head_dim == diff.map_head_dim == hidden // (2 * heads) and diff.head_dim == 2 * base.head_dim
        )
    assert (
        PRESETS["3b"].model_config().intermediate_size == 8192
        and PRESETS["3b"].model_config().map_head_dim == 128
    )
    assert (PRESETS["3b"].training["adam_beta2"], PRESETS["3b"].training["weight_decay"]) == (0.95, 0.1)
    with pytest.raises(ValueError, match="`preset` must be one of"):
        get_preset("7b")
    with pytest.raises(ValueError, match="`attention` must be one of"):
        PRESETS["tiny"].model_config("linear")


@pytest.mark.parametrize(
    "fields, shape",
    [
        (dict(), (2, 2, 2, None)),  # gda_ratio 1: DIFF V1's shape
        (dict(gda_ratio=3), (3, 1, 1, None)),
        (dict(gda_ratio=4), (4, 1, 1, 16)),
    ],
)
def test_the_retrieval_preset_builds_gda_at_the_compared_ratios(fields, shape):
    """The retrieval preset's baseline has 4 heads of width 16 (d_model 64): GDA 3:1 is 3 signal heads and 1 noise
    map over one KV group; 4:1 needs 5 maps of width 16, one more than d_model holds, so map_dim keeps d."""
    config = PRESETS["retrieval"].model_config("gda", **fields)
    assert (
        config.num_attention_heads,
        config.noise_heads,
        config.num_key_value_heads,
        config.map_dim,
    ) == shape
    assert config.map_head_dim == 16 and config.head_dim == 32
    model = DiffTransformerForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (2, 12))
    model(ids, labels=ids).loss.backward()
    # DIFF V1 at G = 3 is GDA's shape (a composition of parts); the baseline has no noise maps to group
    assert PRESETS["retrieval"].model_config("diff", gda_ratio=3).parts == config.parts.__class__(
        "split", 3, "scalar", "affine"
    )
    with pytest.raises(ValueError, match="gda_ratio=2 gives this kind noise maps, which need a lambda_mode"):
        PRESETS["retrieval"].model_config("softmax", gda_ratio=2)


def test_bad_blocks_are_refused(tmp_path, data):
    tokenizer, train, val = data
    with pytest.raises(ValueError, match="differ in length"):
        train_model(config_for(tokenizer), train, val[:, :16], tokenizer, options(tmp_path))
    with pytest.raises(ValueError, match="train_blocks holds ids outside"):
        train_model(config_for(tokenizer), train + 10_000, val, tokenizer, options(tmp_path))
    assert torch.is_tensor(train)


def test_generate_greedy_and_sampled(tmp_path, data, capsys):
    import argparse

    from difftransformer import generate_cli

    tokenizer, train, val = data
    train_model(config_for(tokenizer), train, val, tokenizer, options(tmp_path, max_steps=2, save_steps=2))
    parser = argparse.ArgumentParser()
    generate_cli.configure(parser)
    outputs = []
    for flags in (["--max-new-tokens", "6"], ["--max-new-tokens", "6"], ["--temperature", "1.0", "--top-k", "20",
                  "--top-p", "0.9", "--max-new-tokens", "6", "--seed", "3"]):  # fmt: skip
        assert generate_cli.run(parser.parse_args([str(tmp_path), "--prompt", "the king", *flags])) == 0
        outputs.append(capsys.readouterr().out)
    assert (
        outputs[0] == outputs[1] and outputs[0].startswith("the king") and len(outputs[0]) > len("the king\n")
    )
    assert outputs[2].startswith("the king")
    with pytest.raises(ValueError, match="`top_p`"):
        generate_cli.run(parser.parse_args([str(tmp_path), "--prompt", "x", "--top-p", "1.5"]))
    with pytest.raises(ValueError, match="config.json"):
        generate_cli.run(parser.parse_args([str(tmp_path / "nothing"), "--prompt", "x"]))


@pytest.mark.parametrize("seed", [0, 3])
def test_retrieval_blocks_are_spread_through_the_training_order(seed):
    """The Trainer's sampler visits torch.randperm(n) seeded with the run seed: the drawn-in retrieval rows must
    not be exactly the ones it visits first (which would train retrieval first and plain text last)."""
    mixed = MixedBlocks(torch.zeros(1000, 48, dtype=torch.long), RecallMix(mqar_fraction=0.5), 320, seed=seed)
    recall = torch.tensor([mixed.kind(i) == "mqar" for i in range(1000)], dtype=torch.float)
    order = torch.randperm(1000, generator=torch.Generator().manual_seed(seed))
    assert 0.4 < recall[order[:500]].mean().item() < 0.6
    assert 0.45 < recall.mean().item() < 0.55


def test_retrieval_blocks_answer_every_needle_with_its_own_number():
    """Every episode in a block asks for all its needles and answers each with that city's number from the
    episode's own context, then ends in EOS; blocks are exactly block_size long."""
    import re

    texts = synthetic_texts(count=40)
    tokenizer = small_tokenizer(texts, vocab_size=400)
    stream = pack(texts, tokenizer, 64).flatten()
    needles = NeedleRows(stream, tokenizer, 256, needle=NeedleSpec(needle_digits=3))
    rng = np.random.default_rng(7)
    blocks = torch.tensor([needles.row(rng) for _ in range(12)])
    assert blocks.shape == (12, 256)
    eos = tokenizer.decode([tokenizer.eos_token_id])
    needle = re.compile(r"The magic number of (\w+) is (\d+)\.")
    answers = re.compile(r"(?:\nThe magic number of (\w+) is (\d+))")
    episodes = answered = 0
    for row in blocks.tolist():
        context, *asked = tokenizer.decode(row).split("\nWhat are the magic numbers of ")
        assert asked, "every retrieval block holds at least one episode"
        for part in asked:
            cities, _, rest = part.partition("?")
            replies, _, context_after = rest.partition(eos)
            given = answers.findall(replies)
            numbers = dict(needle.findall(context))
            assert [city for city, _ in given] == cities.split(", ") and sorted(numbers) == sorted(
                cities.split(", ")
            )
            assert all(numbers[city] == number for city, number in given)
            episodes, answered, context = episodes + 1, answered + len(given), context_after
    assert episodes >= 12 and answered > episodes  # several needles answered per episode on average
