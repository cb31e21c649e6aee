"""Exact conversion between our softmax baseline and transformers' Llama."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from difftransformer import DiffTransformerForCausalLM
from difftransformer.cli import main as cli_main
from difftransformer.convert import ConversionError, from_llama, to_llama
from difftransformer.data.tokenizer import train_tokenizer
from helpers import random_model


def random_llama(kv_heads: int, seed: int = 0, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    )
    model = LlamaForCausalLM(LlamaConfig(**{**fields, **overrides}))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.3 * torch.randn_like(param))
            else:
                param.mul_(10.0)  # init_range 0.02 would leave every logit near 0
    return model.eval()


def assert_same_logits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal to float32 rounding: within 1e-5 of the logits' range (different kernels, same arithmetic)."""
    torch.testing.assert_close(got, want, atol=1e-5 * float(want.abs().max()), rtol=0)


def assert_same_state(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("rope_style", ["half", "interleaved"])
def test_from_llama_matches_logits_and_round_trips(kv_heads, rope_style):
    llama = random_llama(kv_heads)
    ids = torch.randint(0, 101, (2, 21))
    ours = from_llama(llama, rope_style=rope_style)
    assert ours.config.attention == "softmax" and ours.config.rope_style == rope_style
    assert (ours.config.num_attention_heads, ours.config.num_key_value_heads) == (4, kv_heads)
    with torch.no_grad():
        assert_same_logits(ours(ids).logits, llama(ids).logits)
    assert_same_state(to_llama(ours).state_dict(), llama.state_dict())


@pytest.mark.parametrize("kv_heads", [4, 1])
@pytest.mark.parametrize("rope_style", ["half", "interleaved"])
def test_to_llama_matches_logits_generates_alike_and_round_trips(kv_heads, rope_style):
    ours = random_model(
        seed=5,
        dtype=torch.float32,
        attention="softmax",
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        rope_style=rope_style,
    )
    llama = to_llama(ours)
    assert type(llama) is LlamaForCausalLM and llama.config.head_dim == ours.config.head_dim
    ids = torch.randint(0, 97, (2, 19))
    with torch.no_grad():
        assert_same_logits(llama(ids).logits, ours(ids).logits)
        options = dict(max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids[:, :5]))
        assert torch.equal(llama.generate(ids[:, :5], **options), ours.generate(ids[:, :5], **options))
    assert_same_state(from_llama(llama, rope_style=rope_style).state_dict(), ours.state_dict())


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16},
    ],
    ids=lambda rope: rope["rope_type"],
)
def test_rope_scaling_is_carried_across(rope):
    rope = {**rope, "rope_theta": 500.0}
    llama = random_llama(2, rope_parameters=rope, max_position_embeddings=16)
    ids = torch.randint(0, 101, (2, 27))  # past max_position_embeddings: dynamic scaling rescales
    ours = from_llama(llama, rope_style="interleaved")
    assert ours.config.rope_parameters == llama.config.rope_parameters
    with torch.no_grad():
        assert_same_logits(ours(ids).logits, llama(ids).logits)
        plain = from_llama(random_llama(2, max_position_embeddings=16), rope_style="interleaved")
        assert not torch.allclose(plain(ids).logits, ours(ids).logits, atol=1e-3)  # the scaling matters here
    back = to_llama(ours)
    assert back.config.rope_parameters == llama.config.rope_parameters
    assert_same_state(back.state_dict(), llama.state_dict())


def test_tied_embeddings_and_bfloat16_round_trip():
    llama = random_llama(2, tie_word_embeddings=True).to(torch.bfloat16)
    ours = from_llama(llama, rope_style="interleaved")
    assert ours.config.tie_word_embeddings and ours.dtype == torch.bfloat16
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    assert_same_state(to_llama(ours).state_dict(), llama.state_dict())


def test_unconvertible_models_are_refused(tmp_path):
    with pytest.raises(ConversionError, match="DiffLlama"):
        to_llama(random_model(attention="diff"))
    with pytest.raises(ConversionError, match="no counterpart in transformers"):
        to_llama(random_model(attention="diff_v2", num_attention_heads=4))
    with pytest.raises(ConversionError, match="causal"):
        to_llama(random_model(attention="softmax", num_attention_heads=4, causal=False))
    for overrides, field in [
        (dict(attention_bias=True), "attention_bias"),
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(head_dim=8), "head_dim"),
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(attention_dropout=0.1), "attention_dropout"),
    ]:
        with pytest.raises(ConversionError, match=field):
            from_llama(random_llama(2, **overrides))
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_llama(tmp_path)
    with pytest.raises(ValueError, match="rope_style"):
        from_llama(random_llama(2), rope_style="neox")


def test_cli_converts_both_ways_with_the_tokenizer(tmp_path, capsys):
    ours = random_model(seed=2, dtype=torch.float32, attention="softmax", num_attention_heads=4)
    ours.save_pretrained(tmp_path / "ours")
    train_tokenizer(["all the world's a stage " * 10], vocab_size=300).save_pretrained(tmp_path / "ours")
    assert (
        cli_main(["convert", "--to-llama", str(tmp_path / "ours"), "--output-dir", str(tmp_path / "llama")])
        == 0
    )
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    assert config["model_type"] == "llama" and "auto_map" not in config
    assert (tmp_path / "llama" / "tokenizer.json").is_file()
    llama = AutoModelForCausalLM.from_pretrained(tmp_path / "llama")  # native: no custom code at all
    assert type(llama) is LlamaForCausalLM
    assert (
        cli_main(
            [
                "convert",
                "--from-llama",
                str(tmp_path / "llama"),
                "--output-dir",
                str(tmp_path / "back"),
                "--rope-style",
                "interleaved",
            ]
        )
        == 0
    )
    back = DiffTransformerForCausalLM.from_pretrained(tmp_path / "back")
    assert_same_state(back.state_dict(), ours.state_dict())
    assert "auto_map" in json.loads((tmp_path / "back" / "config.json").read_text())

    random_model(attention="diff_v2", num_attention_heads=4).save_pretrained(tmp_path / "v2")
    capsys.readouterr()
    assert cli_main(["convert", "--to-llama", str(tmp_path / "v2"), "--output-dir", str(tmp_path / "x")]) == 2
    assert "DIFF V2 has no counterpart in transformers" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
