"""The retrieval-long preset (make study-retrieval-long): the retrieval preset's models and vocabulary, rows grown
from 64 to 256 tokens with 8-64 MQAR pairs at 256, positions for 1024-token evaluation, and compare's grid of
lengths by pairs."""

from __future__ import annotations

import argparse

import numpy as np
import torch

from difftransformer.cli import main
from difftransformer.data.mqar import IGNORE_INDEX, MqarSettings, mqar_vocabulary
from difftransformer.eval.suite import SuiteSettings
from difftransformer.models import DiffTransformerForCausalLM
from difftransformer.train import cli as train_cli
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.mixture import MixedBlocks
from difftransformer.train.presets import get_preset
from difftransformer.train.runner import METRICS_CSV, train_model


def test_same_models_as_the_retrieval_preset_grown_to_longer_rows():
    long, short = get_preset("retrieval-long"), get_preset("retrieval")
    for attention in ("diff", "diff_v2", "softmax"):
        a, b = long.model_config(attention), short.model_config(attention)
        for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "head_dim",
                      "vocab_size"):  # fmt: skip
            assert getattr(a, field) == getattr(b, field), (attention, field)
        assert a.max_position_embeddings == 1024
    assert long.block_size == 256 and long.mqar_pairs == (8, 64)
    mix = long.recall
    assert (mix.mqar_fraction, mix.induction_fraction) == (0.4, 0.4)
    # 64-token rows (2-16 pairs) until step 4500, then 256-token rows (8-64 pairs) to the end.
    assert [mix.length_at(step, 256) for step in (0, 4499, 4500, 5099)] == [64, 64, 256, 256]
    assert mix.pairs_at(64, 256) == (2, 16) and mix.pairs_at(256, 256) == (8, 64)
    settings = long.training_settings(output_dir="unused")
    assert settings.max_steps == 5100 and settings.per_device_train_batch_size == 64
    full = 64 * 256
    assert mix.tokens_between(0, 5100, 256, full) == 4500 * full // 4 + 600 * full
    # compare scores mqar on Zoology's grid of lengths by pair counts, up to 4x the trained length; the vocabulary
    # holds 120 distinct keys, so 64 pairs at most.
    grid = long.evaluation["mqar"]
    assert grid["lengths"] == [64, 128, 256, 512, 1024] and grid["num_pairs"] == [4, 8, 16, 32, 64]
    MqarSettings(64, None, 1024).check(mqar_vocabulary(long.vocab_size))
    suite = SuiteSettings(tasks=("mqar",), context_length=256, max_positions=1024, light=long.evaluation)
    assert suite.light_settings("mqar").lengths == grid["lengths"]
    assert get_preset("retrieval").evaluation == {} and get_preset("retrieval").length_schedule == ()


def test_its_rows_grow_and_a_model_trains_on_them(tmp_path):
    preset = get_preset("retrieval-long")
    rng = np.random.default_rng(0)
    text = torch.from_numpy(rng.integers(0, 80, size=(64, preset.block_size)))
    rows = MixedBlocks(text, preset.recall, preset.vocab_size, seed=3)
    for step, length, (low, high) in ((0, 64, (2, 16)), (4500, 256, (8, 64))):
        rows.follow_schedule(step, 64)
        answers = []
        for index in range(64):
            row = rows[index]
            assert row["input_ids"].shape == (length,)
            if rows.kind(index) == "mqar":
                answers.append(int((row["labels"] != IGNORE_INDEX).sum()))  # one answer per pair
        assert answers and low <= min(answers) and max(answers) <= high and len(set(answers)) > 3
    config = preset.model_config("diff_v2")
    settings = preset.training_settings(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                        logging_steps=1, eval_steps=2, save_steps=2, report_to="none")  # fmt: skip
    result = train_model(
        config, MixedBlocks(text, preset.recall, preset.vocab_size), text[:4], None, settings
    )
    assert result.global_step == 2
    steps, accuracy = column(read_metrics(tmp_path / METRICS_CSV), "eval_mqar_accuracy")
    assert steps == [2] and 0.0 <= accuracy[0] <= 1.0
    model = DiffTransformerForCausalLM.from_pretrained(tmp_path)
    logits = model(torch.from_numpy(rng.integers(0, 320, size=(1, 1024)))).logits  # beyond the trained length
    assert logits.shape == (1, 1024, 320) and bool(torch.isfinite(logits).all())


def test_the_length_schedule_flag_replaces_the_presets_and_is_checked_before_work(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    train_cli.configure(parser)
    flags = ["--preset", "retrieval-long", "--output-dir", str(tmp_path / "run")]
    preset = train_cli.resolved_preset(parser.parse_args([*flags, "--length-schedule", "0:64,3000:256"]))
    assert preset.length_schedule == ((0, 64), (3000, 256))
    assert [preset.recall.length_at(step, 256) for step in (2999, 3000)] == [64, 256]
    assert train_cli.resolved_preset(parser.parse_args(flags)).length_schedule == ((0, 64), (4500, 256))
    for schedule, expected in (("64:0", "STEP:TOKENS"), ("0:64,10:32", "ascending"), ("5:64", "step 0"),
                               ("0:64,10:512", "beyond the block size")):  # fmt: skip
        try:  # argparse exits on a word its type refuses; the preset's own checks return 2
            status = main(["train", *flags, "--length-schedule", schedule])
        except SystemExit as exit_:
            status = exit_.code
        assert status == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--length-schedule" in err and expected in err, err
        assert not (tmp_path / "run").exists()
