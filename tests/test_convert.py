"""Exact conversion to and from transformers' DiffLlama."""

from __future__ import annotations

import pytest
import torch
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

from difftransformer import DiffTransformerForCausalLM
from difftransformer.cli import main as cli_main
from difftransformer.convert import ConversionError, from_diffllama, to_diffllama
from helpers import random_model


def random_diffllama(kv_heads: int, seed: int = 0) -> DiffLlamaForCausalLM:
    torch.manual_seed(seed)
    config = DiffLlamaConfig(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        lambda_std_dev=0.3,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    )
    model = DiffLlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.3 * torch.randn_like(param))
    return model.eval()


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("rope_style", ["half", "interleaved"])
def test_from_diffllama_matches_logits_and_round_trips(kv_heads, rope_style):
    diffllama = random_diffllama(kv_heads)
    ids = torch.randint(0, 101, (2, 13))
    ours = from_diffllama(diffllama, rope_style=rope_style)
    assert ours.config.num_attention_heads == 2 and ours.config.num_key_value_heads == kv_heads // 2
    torch.testing.assert_close(ours(ids).logits, diffllama(ids).logits, atol=2e-5, rtol=1e-5)
    back = to_diffllama(ours).state_dict()
    for name, tensor in diffllama.state_dict().items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize(
    "fields", [dict(num_key_value_heads=1), dict(num_key_value_heads=2, rope_style="half")]
)
def test_to_diffllama_matches_logits_with_the_gain_folded(fields):
    ours = random_model(seed=3, dtype=torch.float32, **fields)
    ids = torch.randint(0, 97, (2, 10))
    diffllama = to_diffllama(ours)
    torch.testing.assert_close(diffllama(ids).logits, ours(ids).logits, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("rope", [dict(rope_type="linear", factor=4.0), dict(rope_type="yarn", factor=4.0)])
def test_rope_scaling_converts_with_the_model(rope):
    """A scaled RoPE goes across as it is: the same logits past the trained length, both ways."""
    ours = random_model(seed=5, dtype=torch.float32, num_key_value_heads=1, max_position_embeddings=16,
                        rope_parameters={"rope_theta": 1000.0, **rope})  # fmt: skip
    ids = torch.randint(0, 97, (1, 40))
    diffllama = to_diffllama(ours)
    assert diffllama.config.rope_parameters["rope_type"] == rope["rope_type"]
    torch.testing.assert_close(diffllama(ids).logits, ours(ids).logits, atol=2e-5, rtol=1e-5)
    back = from_diffllama(diffllama, rope_style="interleaved")
    torch.testing.assert_close(back(ids).logits, ours(ids).logits, atol=2e-5, rtol=1e-5)


def test_plain_model_round_trips_to_identical_tensors():
    ours = random_model(seed=4, dtype=torch.float32, subln="plain", num_key_value_heads=1)
    back = from_diffllama(to_diffllama(ours), rope_style="interleaved").state_dict()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_gda_with_one_signal_head_per_noise_map_converts_as_diff_v1_exactly(kv_heads):
    # GDA at gda_ratio 1 is DIFF V1 in DIFF V1's layout: the same weights give the same DiffLlama, bit for bit
    diff = random_model(seed=5, dtype=torch.float32, num_key_value_heads=kv_heads)
    gda = DiffTransformerForCausalLM(diff.config.__class__(**{**diff.config.to_dict(), "attention": "gda"}))
    assert gda.config.attention == "gda" and gda.config.gda_ratio == 1
    gda.load_state_dict(diff.state_dict(), strict=True)
    from_gda, from_diff = to_diffllama(gda.eval()).state_dict(), to_diffllama(diff).state_dict()
    assert from_gda.keys() == from_diff.keys()
    for name, tensor in from_diff.items():
        assert torch.equal(from_gda[name], tensor), name
    ids = torch.randint(0, 97, (2, 10))
    torch.testing.assert_close(to_diffllama(gda)(ids).logits, gda(ids).logits, atol=2e-5, rtol=1e-5)
    with pytest.raises(ConversionError, match="gda_ratio must be 1 .*got 2"):
        to_diffllama(random_model(attention="gda", gda_ratio=2, hidden_size=48, num_key_value_heads=1))


def test_unconvertible_models_are_refused(tmp_path):
    diffllama = random_diffllama(2)
    diffllama.config.num_key_value_heads = 3  # what a hand-edited checkpoint could say
    with pytest.raises(ConversionError, match="num_key_value_heads must be even"):
        from_diffllama(diffllama)
    for fields, named in [
        (dict(subln="none"), "subln"),
        (dict(lambda_init=0.8), "lambda_init"),
        (dict(attention="softmax", num_attention_heads=4), "map_layout must be 'split'"),
        (dict(subln_eps=1e-6), "subln_eps"),
        # DIFF V1 moved along one part is no longer DiffLlama: each part is named
        (dict(lambda_mode="token"), "lambda_mode must be 'scalar'"),
        (dict(output_gate="elementwise"), "output_gate must be 'none'"),
        (dict(sliding_window=4), "sliding_window must be None"),
        (
            dict(
                attention="diff_v2",
                num_attention_heads=4,
                map_layout="split",
                gda_ratio=1,
                lambda_mode="scalar",
                subln="affine",
            ),
            None,
        ),
    ]:
        if named is None:  # DIFF V1's parts under another kind's name convert
            model = random_model(**fields).eval()
            ids = torch.randint(0, 97, (2, 10))
            torch.testing.assert_close(
                to_diffllama(model)(ids).logits, model(ids).logits, atol=2e-5, rtol=1e-5
            )
            continue
        with pytest.raises(ConversionError, match=named):
            to_diffllama(random_model(**fields))
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_diffllama(tmp_path)


def test_convert_command_on_saved_directories(tmp_path):
    diffllama = random_diffllama(2)
    diffllama.save_pretrained(tmp_path / "diffllama")
    assert (
        cli_main(
            [
                "convert",
                "--from-diffllama",
                str(tmp_path / "diffllama"),
                "--output-dir",
                str(tmp_path / "ours"),
            ]
        )
        == 0
    )
    ours = DiffTransformerForCausalLM.from_pretrained(tmp_path / "ours")
    ids = torch.randint(0, 101, (1, 9))
    torch.testing.assert_close(ours(ids).logits, diffllama(ids).logits, atol=2e-5, rtol=1e-5)
    assert (
        cli_main(
            ["convert", "--to-diffllama", str(tmp_path / "ours"), "--output-dir", str(tmp_path / "back")]
        )
        == 0
    )
    back = DiffLlamaForCausalLM.from_pretrained(tmp_path / "back")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in diffllama.state_dict().items())
