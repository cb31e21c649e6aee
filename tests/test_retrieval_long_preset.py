"""The retrieval-long preset (make study-retrieval-long): the retrieval preset's models on 256-token rows with 8-64
MQAR pairs, a vocabulary with keys for 128 pairs, and positions for 1024-token evaluation."""

from __future__ import annotations

import numpy as np
import torch

from difftransformer.data.mqar import IGNORE_INDEX, MqarSettings, mqar_vocabulary
from difftransformer.eval.suite import SuiteSettings
from difftransformer.models import DiffTransformerForCausalLM
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.mixture import MixedBlocks
from difftransformer.train.presets import get_preset
from difftransformer.train.runner import METRICS_CSV, train_model


def test_same_models_as_the_retrieval_preset_on_longer_rows():
    long, short = get_preset("retrieval-long"), get_preset("retrieval")
    for attention in ("diff", "diff_v2", "softmax"):
        a, b = long.model_config(attention), short.model_config(attention)
        for field in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "head_dim",
        ):
            assert getattr(a, field) == getattr(b, field), (attention, field)
        assert (a.vocab_size, a.max_position_embeddings) == (512, 1024)
    assert long.block_size == 256 and long.mqar_pairs == (8, 64)
    assert (long.recall.mqar_fraction, long.recall.induction_fraction) == (0.4, 0.4)
    # 1024-token evaluation with up to 128 pairs needs 128 distinct keys and values in the vocabulary.
    vocabulary = mqar_vocabulary(long.vocab_size)
    MqarSettings(128, None, 1024).check(vocabulary)
    assert min(len(vocabulary.keys), len(vocabulary.values)) >= 128
    # compare scores mqar on Zoology's grid of lengths by pair counts, up to 4x the trained length.
    grid = long.evaluation["mqar"]
    assert grid["lengths"] == [64, 128, 256, 512, 1024] and grid["num_pairs"] == [4, 8, 16, 32, 64, 128]
    suite = SuiteSettings(tasks=("mqar",), context_length=256, max_positions=1024, light=long.evaluation)
    assert suite.light_settings("mqar").lengths == grid["lengths"]
    assert get_preset("retrieval").evaluation == {}
    settings = long.training_settings(output_dir="unused")
    assert settings.per_device_train_batch_size * settings.max_steps * long.block_size > 10_000_000


def test_its_rows_hold_8_to_64_pairs_and_a_model_trains_on_them(tmp_path):
    preset = get_preset("retrieval-long")
    rng = np.random.default_rng(0)
    text = torch.from_numpy(rng.integers(0, 128, size=(64, preset.block_size)))
    rows = MixedBlocks(text, preset.recall, preset.vocab_size, seed=3)
    answers = []
    for index in range(64):
        row = rows[index]
        assert row["input_ids"].shape == (preset.block_size,)
        if rows.kind(index) == "mqar":
            answers.append(int((row["labels"] != IGNORE_INDEX).sum()))  # one answer per pair, every key asked
    assert answers and min(answers) >= 8 and max(answers) <= 64 and len(set(answers)) > 3
    config = preset.model_config("diff_v2")
    settings = preset.training_settings(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                        logging_steps=1, eval_steps=2, save_steps=2, report_to="none")  # fmt: skip
    result = train_model(config, rows, text[:4], tokenizer=None, args=settings)
    assert result.global_step == 2
    steps, accuracy = column(read_metrics(tmp_path / METRICS_CSV), "eval_mqar_accuracy")
    assert steps == [2] and 0.0 <= accuracy[0] <= 1.0
    model = DiffTransformerForCausalLM.from_pretrained(tmp_path)
    logits = model(torch.from_numpy(rng.integers(0, 512, size=(1, 1024)))).logits  # beyond the trained length
    assert logits.shape == (1, 1024, 512) and bool(torch.isfinite(logits).all())
