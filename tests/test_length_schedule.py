"""The length curriculum: RecallMix's schedule (checked, pair counts scaled, tokens counted), MixedBlocks serving rows
of the current length, and training runs whose steps follow the schedule, resumed ones included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from difftransformer.data.mqar import IGNORE_INDEX, mqar_vocabulary
from difftransformer.errors import UsageError
from difftransformer.storage import read_json
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.curriculum import LengthCurriculum
from difftransformer.train.mixture import MixedBlocks, RecallMix
from difftransformer.train.presets import RECIPE, get_preset
from difftransformer.train.runner import METRICS_CSV, SUMMARY_JSON, train_model
from difftransformer.train.settings import TrainingSettings

MIX = dict(mqar_fraction=0.4, induction_fraction=0.4, mqar_pairs=(8, 32))


def test_schedule_is_checked_and_scales_the_pairs():
    mix = RecallMix(**MIX, length_schedule=((0, 32), (10, 64), (20, 128)))
    assert [mix.length_at(step, 128) for step in (0, 9, 10, 19, 20, 500)] == [32, 32, 64, 64, 128, 128]
    assert [mix.pairs_at(length, 128) for length in (32, 64, 128)] == [(2, 8), (4, 16), (8, 32)]
    # Steps 0-9 hold a quarter of a full step's tokens, 10-19 half, from 20 on all of it.
    assert mix.tokens_between(0, 25, 128, 1280) == 10 * 320 + 10 * 640 + 5 * 1280
    assert mix.tokens_between(15, 21, 128, 1280) == 5 * 640 + 1280
    assert RecallMix(**MIX).tokens_between(3, 8, 128, 1280) == 5 * 1280
    assert RecallMix(**MIX).length_at(7, 128) == 128
    for bad in (((5, 32),), ((0, 64), (10, 32)), ((0, 32), (10, 64), (10, 128))):
        with pytest.raises(UsageError, match="`length_schedule` must be"):
            RecallMix(**MIX, length_schedule=bad)
    with pytest.raises(UsageError, match="needle"):
        RecallMix(needle_fraction=0.1, length_schedule=((0, 32),))
    vocabulary = mqar_vocabulary(512)
    with pytest.raises(UsageError, match="beyond the block size 128"):
        RecallMix(**MIX, length_schedule=((0, 64), (10, 256))).check(128, vocabulary)
    # An induction row needs 12 tokens: refused with the options (check_schedule), saying what length works.
    with pytest.raises(
        UsageError, match=r"0:8,10:128: rows of 8 tokens cannot hold induction rows .* at least 12"
    ):
        RecallMix(**MIX, length_schedule=((0, 8), (10, 128))).check_schedule(128)
    # MQAR's pairs scale with the length: 16 pairs at 64 tokens need all 64, and the fix names the shortest length
    # that holds both kinds.
    with pytest.raises(
        UsageError, match=r"MQAR rows of 1 key-value pair and its query \(4 tokens\) nor induction"
    ):
        RecallMix(**MIX, length_schedule=((0, 3),)).check_schedule(128)
    with pytest.raises(UsageError, match="only lengths of 4-6, 8-9, 12 tokens hold them"):
        RecallMix(mqar_fraction=0.5, mqar_pairs=(2, 40), length_schedule=((0, 100),)).check_schedule(128)
    with pytest.raises(UsageError, match="no length up to the block size holds them"):
        RecallMix(mqar_fraction=0.5, mqar_pairs=(2, 400), length_schedule=((0, 100),)).check_schedule(128)
    RecallMix(**MIX, length_schedule=((0, 12), (10, 128))).check(128, vocabulary)


def test_rows_have_the_current_length():
    blocks = torch.from_numpy(np.random.default_rng(0).integers(0, 100, size=(48, 128)))
    mix = RecallMix(**MIX, length_schedule=((0, 32), (10, 128)))
    rows = MixedBlocks(blocks, mix, 512, seed=1)
    plain = MixedBlocks(blocks, RecallMix(**MIX), 512, seed=1)
    assert rows.row_length() == 32 and plain.row_length() == 128
    kinds = {rows.kind(i) for i in range(48)}
    assert kinds == {"text", "mqar", "induction"}
    for index in range(48):
        row = rows[index]
        assert row["input_ids"].shape == row["labels"].shape == (32,)
        if rows.kind(index) == "text":
            assert torch.equal(row["input_ids"], blocks[index, :32])
        if rows.kind(index) == "mqar":  # 2-8 pairs at a quarter of the block, every key asked once
            assert 2 <= int((row["labels"] != IGNORE_INDEX).sum()) <= 8
        if rows.kind(index) == "induction":
            assert int((row["labels"] != IGNORE_INDEX).sum()) >= 3
    # Following the schedule, rows are counted into steps: 3 rows a step from step 8 on, so 6 rows at 32 tokens
    # (steps 8 and 9), then the full length, where the rows are those of the mix without a schedule.
    rows.follow_schedule(8, 3)
    lengths = [rows[index]["input_ids"].shape[0] for index in range(12)]
    assert lengths == [32] * 6 + [128] * 6
    rows.follow_schedule(20, 3)
    for index in range(48):
        assert torch.equal(rows[index]["input_ids"], plain[index]["input_ids"])
        assert torch.equal(rows[index]["labels"], plain[index]["labels"])
    with pytest.raises(UsageError, match="`dataloader_num_workers` must be 0"):
        LengthCurriculum(rows, dataloader_num_workers=2)


class RowLengths:
    """Records the length of every training forward's rows (evaluation forwards left out)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.lengths: list[int] = []
        model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        if module.training:
            self.lengths.append(kwargs["input_ids"].shape[1])


def settings(output_dir, **overrides) -> TrainingSettings:
    fields = dict(RECIPE, output_dir=str(output_dir), max_steps=6, per_device_train_batch_size=4, logging_steps=1,
                  eval_steps=6, save_steps=3, learning_rate=3e-3, warmup_steps=1, report_to="none")  # fmt: skip
    fields.update(overrides)
    return TrainingSettings(**fields)


def test_training_follows_the_schedule_and_resumes_on_it(tmp_path):
    from difftransformer.models import DiffTransformerForCausalLM

    blocks = torch.from_numpy(np.random.default_rng(0).integers(0, 100, size=(64, 64)))
    mix = RecallMix(**{**MIX, "mqar_pairs": (4, 16)}, length_schedule=((0, 16), (2, 32), (4, 64)))
    config = get_preset("micro").model_config("softmax", vocab_size=512, max_position_embeddings=64)
    torch.manual_seed(0)
    model = DiffTransformerForCausalLM(config)
    seen = RowLengths(model)
    train_model(model, MixedBlocks(blocks, mix, 512, seed=0), blocks[:4], None, settings(tmp_path / "whole"))
    # Step s (s = 0, 1, ...) trains on rows of the schedule's length at s.
    assert seen.lengths == [16, 16, 32, 32, 64, 64]
    summary = read_json(tmp_path / "whole" / SUMMARY_JSON)
    rows = read_metrics(tmp_path / "whole" / METRICS_CSV)
    assert summary["global_step"] == 6 and len(column(rows, "loss")[0]) == 6
    # A run stopped after step 3 and resumed continues at step 3's length. (64 rows, 4 a step: no epoch ends
    # within the run; test_epochs_restart_the_count covers that.)
    torch.manual_seed(0)
    first = DiffTransformerForCausalLM(config)
    train_model(first, MixedBlocks(blocks, mix, 512, seed=0), blocks[:4], None,
                settings(tmp_path / "split", max_steps=3))  # fmt: skip
    resumed = DiffTransformerForCausalLM(config)
    seen = RowLengths(resumed)
    train_model(resumed, MixedBlocks(blocks, mix, 512, seed=0), blocks[:4], None, settings(tmp_path / "split"),
                resume=True)  # fmt: skip
    assert seen.lengths == [32, 64, 64]
    assert len(column(read_metrics(tmp_path / "split" / METRICS_CSV), "loss")[1]) == 6


def test_epochs_restart_the_count(tmp_path):
    from difftransformer.models import DiffTransformerForCausalLM

    # 10 rows, 4 a step: every epoch ends on a 2-row step, which the count must not carry into the next epoch.
    blocks = torch.from_numpy(np.random.default_rng(0).integers(0, 100, size=(10, 64)))
    mix = RecallMix(**{**MIX, "mqar_pairs": (4, 16)}, length_schedule=((0, 16), (4, 32), (7, 64)))
    config = get_preset("micro").model_config("softmax", vocab_size=512, max_position_embeddings=64)
    model = DiffTransformerForCausalLM(config)
    seen = RowLengths(model)
    train_model(
        model, MixedBlocks(blocks, mix, 512, seed=0), blocks[:4], None, settings(tmp_path, max_steps=8)
    )
    assert seen.lengths == [16, 16, 16, 16, 32, 32, 32, 64]
