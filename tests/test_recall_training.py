"""Recall rows drawn into training: the mix, its determinism, the MQAR probe logged while training, and the
steps a run took to learn recall."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from difftransformer.data.mqar import IGNORE_INDEX, mqar_vocabulary
from difftransformer.data.needles import NeedleSpec
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.mixture import Blocks, MixedBlocks, RecallMix
from difftransformer.train.presets import RECIPE, get_preset
from difftransformer.train.recall import RecallProbe, steps_to_recall
from difftransformer.train.retrieval import NeedleRows
from difftransformer.train.runner import METRICS_CSV, train_model
from difftransformer.train.settings import TrainingSettings
from test_train_support import pack, small_tokenizer, synthetic_texts

VOCAB = 320


def text_blocks(rows: int = 400, length: int = 48) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(0).integers(0, VOCAB, size=(rows, length)))


def test_mixed_blocks_draw_the_asked_shares_and_keep_text_rows():
    blocks = text_blocks()
    data = MixedBlocks(
        blocks, RecallMix(mqar_fraction=0.3, induction_fraction=0.2, mqar_pairs=(2, 6)), VOCAB, seed=1
    )
    kinds = [data.kind(i) for i in range(len(data))]
    assert len(data) == len(blocks)
    assert abs(kinds.count("mqar") / len(kinds) - 0.3) < 0.08
    assert abs(kinds.count("induction") / len(kinds) - 0.2) < 0.08
    vocabulary = mqar_vocabulary(VOCAB)
    for i, kind in enumerate(kinds[:120]):
        row = data[i]
        ids, labels = row["input_ids"], row["labels"]
        assert ids.shape == labels.shape == (48,) and ids.dtype == labels.dtype == torch.long
        if kind == "text":
            assert torch.equal(ids, blocks[i]) and torch.equal(labels, blocks[i])
            continue
        answered = labels != IGNORE_INDEX
        assert answered.any() and (~answered).any()  # loss on the answers only
        if kind == "mqar":
            pairs = int((torch.isin(ids[:16], torch.from_numpy(vocabulary.keys))).sum())
            assert 2 <= answered.sum() <= 6 and pairs >= 2
            assert torch.isin(labels[answered], torch.from_numpy(vocabulary.values)).all()


def test_mixed_blocks_are_a_function_of_seed_and_index():
    blocks = text_blocks()
    mix = RecallMix(mqar_fraction=0.5, induction_fraction=0.3)
    a, b = MixedBlocks(blocks, mix, VOCAB, seed=3), MixedBlocks(blocks, mix, VOCAB, seed=3)
    for i in (0, 7, 99, 7):  # any order, any repetition: the same row
        assert torch.equal(a[i]["input_ids"], b[i]["input_ids"]) and torch.equal(
            a[i]["labels"], b[i]["labels"]
        )
    other = MixedBlocks(blocks, mix, VOCAB, seed=4)
    assert [a.kind(i) for i in range(50)] != [other.kind(i) for i in range(50)]
    plain = MixedBlocks(blocks, RecallMix(), VOCAB)
    assert all(torch.equal(plain[i]["input_ids"], blocks[i]) for i in range(20))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(mqar_fraction=1.2), "`mqar_fraction` must lie in"),
        (dict(induction_fraction=-0.1), "`induction_fraction` must lie in"),
        (dict(mqar_fraction=0.6, induction_fraction=0.6), "must be < 1"),
        (dict(needle_fraction=0.5, mqar_fraction=0.5), "some text must remain"),
        (dict(mqar_pairs=(4, 2)), "`mqar_pairs` must be"),
    ],
)
def test_recall_mix_refuses_bad_settings(fields, message):
    with pytest.raises(ValueError, match=message):
        RecallMix(**fields)


def test_needle_rows_are_drawn_lazily_from_the_training_text():
    texts = synthetic_texts(count=40)
    tokenizer = small_tokenizer(texts, vocab_size=400)
    blocks = pack(texts, tokenizer, 256)
    with pytest.raises(ValueError, match="needles: a NeedleRows is needed"):
        MixedBlocks(blocks, RecallMix(needle_fraction=0.5), len(tokenizer))
    data = MixedBlocks(
        blocks, RecallMix(needle_fraction=0.5), len(tokenizer), seed=2,
        needles=NeedleRows(blocks.reshape(-1), tokenizer, 256, needle=NeedleSpec(needle_digits=3)),
    )  # fmt: skip
    needle_rows = [i for i in range(len(data)) if data.kind(i) == "needle"]
    assert needle_rows and len(needle_rows) < len(data)
    row = data[needle_rows[0]]
    assert torch.equal(row["input_ids"], row["labels"]) and row["input_ids"].shape == (256,)
    assert "The magic number of" in tokenizer.decode(row["input_ids"].tolist())
    assert torch.equal(data[needle_rows[0]]["input_ids"], row["input_ids"])  # the same row every time


def test_mixed_blocks_refuse_blocks_too_short_for_their_rows():
    with pytest.raises(ValueError, match="rows of 24 tokens cannot hold MQAR rows .* at least 32"):
        MixedBlocks(text_blocks(length=24), RecallMix(mqar_fraction=0.5, mqar_pairs=(2, 8)), VOCAB)
    with pytest.raises(ValueError, match="rows of 8 tokens cannot hold induction rows .* at least 12"):
        MixedBlocks(text_blocks(length=8), RecallMix(induction_fraction=0.5), VOCAB)


class RecallOracle(nn.Module):
    """Answers every query from the pairs at the start of the row (``wrong``: a wrong value)."""

    def __init__(self, wrong: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.wrong = wrong

    def forward(self, input_ids, **kwargs):
        filler = mqar_vocabulary(VOCAB).filler
        logits = torch.zeros(*input_ids.shape, VOCAB)
        for b, row in enumerate(input_ids.tolist()):
            block = row.index(filler) // 2 * 2  # the pairs end where the filler (or a first query) starts
            table = dict(zip(row[0:block:2], row[1:block:2]))
            for t in range(block, len(row)):
                if row[t] in table:
                    logits[b, t, (table[row[t]] + self.wrong) % VOCAB] = 1.0
        return SimpleNamespace(logits=logits)


def test_recall_probe_scores_an_oracle_and_a_wrong_model():
    probe = RecallProbe(mqar_vocabulary(VOCAB), 48)
    assert probe.accuracy(RecallOracle()) == 1.0
    assert probe.accuracy(RecallOracle(wrong=True)) == 0.0


def test_steps_to_recall_is_the_first_evaluation_at_the_threshold():
    assert steps_to_recall([100, 200, 300, 400], [0.1, 0.95, 0.8, 0.99]) == 200
    assert steps_to_recall([100, 200], [0.5, 0.89]) is None
    assert steps_to_recall([100, 200], [0.5, 0.7], threshold=0.6) == 200


def test_training_with_recall_rows_logs_mqar_accuracy(tmp_path):
    texts = synthetic_texts()
    tokenizer = small_tokenizer(texts)
    blocks = pack(texts, tokenizer, 48)
    data = MixedBlocks(
        blocks[:-8],
        RecallMix(mqar_fraction=0.5, induction_fraction=0.25, mqar_pairs=(2, 4)),
        len(tokenizer),
        seed=0,
    )
    config = get_preset("micro").model_config("softmax", vocab_size=len(tokenizer))
    settings = TrainingSettings(**{**RECIPE, "output_dir": str(tmp_path), "max_steps": 4, "eval_steps": 2,
                                   "save_steps": 4, "logging_steps": 1, "per_device_train_batch_size": 8,
                                   "warmup_steps": 1, "report_to": "none"})  # fmt: skip
    train_model(config, data, blocks[-8:], tokenizer, settings)
    steps, accuracies = column(read_metrics(tmp_path / METRICS_CSV), "eval_mqar_accuracy")
    assert steps == [2, 4] and all(0.0 <= a <= 1.0 for a in accuracies)
    # Plain text blocks: no probe, the column stays empty.
    train_model(config, Blocks(blocks[:-8]), blocks[-8:], tokenizer,
                TrainingSettings(**{**settings.to_dict(), "output_dir": str(tmp_path / "plain")}))  # fmt: skip
    assert column(read_metrics(tmp_path / "plain" / METRICS_CSV), "eval_mqar_accuracy") == ([], [])
