"""The models against an independent float64 implementation, the cache, generation and the HF plumbing."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import safetensors.torch
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, StaticCache

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM, DiffTransformerModel
from difftransformer.layers import SplitHeadAttention, attention_logits_hook
from difftransformer.models import matched_config
from helpers import random_model, tiny_config
from kind_table import ALL_FIELDS
from naive_model import checkpoint_state, naive_causal_lm

DIFF_VARIANTS = [
    dict(num_attention_heads=heads, num_key_value_heads=kv, rope_style=rope, subln=subln)
    for heads, kv in [(2, 2), (2, 1)]
    for rope in ("interleaved", "half")
    for subln in ("affine", "plain", "none")
]
OTHER_VARIANTS = [
    *ALL_FIELDS.values(),
    dict(attention="softmax", num_attention_heads=4, num_key_value_heads=4),
    dict(attention="softmax", num_attention_heads=4, num_key_value_heads=2, rope_style="half"),
    dict(attention="diff_v2", num_attention_heads=4, num_key_value_heads=4),
    dict(attention="diff", lambda_init=0.5),
    dict(attention="diff", causal=False),
    dict(attention="diff", tie_word_embeddings=True),
    dict(attention="gda", num_attention_heads=3, gda_ratio=3, num_key_value_heads=1),
    dict(
        attention="gda",
        num_attention_heads=4,
        gda_ratio=2,
        num_key_value_heads=2,
        map_dim=6,
        rope_style="half",
    ),
    dict(attention="gda", num_attention_heads=4, gda_ratio=2, num_key_value_heads=1, map_dim=4, subln="none"),
    dict(
        attention="gda", num_attention_heads=2, gda_ratio=2, num_key_value_heads=1, map_dim=8, lambda_init=0.5
    ),
    dict(attention="gated", num_attention_heads=4, num_key_value_heads=2, rope_style="half"),
    dict(
        attention="motif", num_attention_heads=4, num_key_value_heads=1, sliding_window=5, rope_style="half"
    ),
]
GDA = dict(attention="gda", num_attention_heads=4, gda_ratio=2, num_key_value_heads=2, map_dim=6)
ALL_KINDS = list(ALL_FIELDS.values())


def variant_id(fields: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in fields.items())


@pytest.mark.parametrize("fields", DIFF_VARIANTS + OTHER_VARIANTS, ids=variant_id)
def test_logits_equal_independent_float64_implementation(fields):
    model = random_model(seed=len(str(fields)), **fields)
    ids = torch.randint(0, model.config.vocab_size, (2, 11))
    logits = model(ids).logits
    for b in range(2):
        expected = naive_causal_lm(checkpoint_state(model), model.config, ids[b])
        torch.testing.assert_close(logits[b], expected, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_float32_model_is_close_to_float64(fields):
    model64 = random_model(seed=1, **fields)
    model32 = random_model(seed=1, dtype=torch.float32, **fields)
    ids = torch.randint(0, 97, (2, 16))
    torch.testing.assert_close(model32(ids).logits.double(), model64(ids).logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("fields", [ALL_KINDS[0], GDA], ids=variant_id)
@pytest.mark.parametrize("backend", ["reference", "sdpa", "blocked", "decode"])
def test_every_diff_backend_gives_the_same_model(backend, fields):
    ids = torch.randint(0, 97, (2, 9))
    auto = random_model(seed=2, **fields)
    forced = random_model(seed=2, attention_backend=backend, **fields)
    torch.testing.assert_close(forced(ids).logits, auto(ids).logits, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_every_attention_implementation_gives_the_same_model(fields, implementation):
    ids = torch.randint(0, 97, (2, 9))
    default = random_model(seed=2, **fields)
    forced = random_model(seed=2, **fields)
    forced.set_attn_implementation(implementation)
    assert forced.config._attn_implementation == implementation
    torch.testing.assert_close(forced(ids).logits, default(ids).logits, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize(
    "fields", [DIFF_VARIANTS[4], DIFF_VARIANTS[9], dict(attention="diff", causal=False), GDA], ids=variant_id
)
def test_float32_model_on_the_fused_cpu_kernel_matches_float64(fields):
    """The path training takes on CPU: logits and every parameter gradient against the float64 model."""
    model64 = random_model(seed=6, **fields)
    model32 = random_model(seed=6, dtype=torch.float32, attention_backend="fused_cpu", **fields)
    ids = torch.randint(0, 97, (2, 40))
    for model in (model32, model64):
        model(ids, labels=ids).loss.backward()
    torch.testing.assert_close(model32(ids).logits.double(), model64(ids).logits, atol=2e-4, rtol=1e-4)
    for (name, p32), p64 in zip(model32.named_parameters(), model64.parameters()):
        torch.testing.assert_close(p32.grad.double(), p64.grad, atol=2e-4, rtol=2e-3, msg=name)


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_float32_cached_decoding_matches_float64_full_forward(fields):
    """Generation on CPU in float32 (the C++ decode kernel, no mask) step by step against float64."""
    model64 = random_model(seed=7, **fields)
    model32 = random_model(seed=7, dtype=torch.float32, **fields)
    ids = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        out = model32(ids[:, :20], use_cache=True)
        steps = [out.logits]
        for t in range(20, 30):
            out = model32(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1).double(), model64(ids).logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_incremental_decoding_equals_full_forward(fields):
    model = random_model(seed=3, **fields)
    ids = torch.randint(0, 97, (2, 12))
    full = model(ids).logits
    out = model(ids[:, :5], use_cache=True)
    steps = [out.logits]
    for t in range(5, 12):
        out = model(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_static_cache_decoding_equals_full_forward(fields):
    model = random_model(seed=4, **fields)
    ids = torch.randint(0, 97, (1, 10))
    cache = StaticCache(config=model.config, max_cache_len=16)
    out = model(ids[:, :6], past_key_values=cache, use_cache=True)
    steps = [out.logits]
    for t in range(6, 10):
        steps.append(model(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, 1), model(ids).logits, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_greedy_generate_same_with_and_without_cache(fields):
    model = random_model(seed=5, **fields)
    prompt = torch.randint(0, 97, (2, 6))
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with_cache = model.generate(prompt, use_cache=True, **kwargs)
    without = model.generate(prompt, use_cache=False, **kwargs)
    assert with_cache.shape == (2, 14)
    assert torch.equal(with_cache, without)


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_left_padded_batch_matches_each_sequence_alone(fields):
    model = random_model(seed=6, **fields)
    long, short = torch.randint(1, 97, (9,)), torch.randint(1, 97, (5,))
    batch = torch.zeros(2, 9, dtype=torch.long)
    batch[0], batch[1, 4:] = long, short
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    logits = model(batch, attention_mask=mask).logits
    torch.testing.assert_close(logits[0], model(long[None]).logits[0], atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(logits[1, 4:], model(short[None]).logits[0], atol=1e-10, rtol=1e-9)
    generated = model.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    alone = model.generate(short[None], max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(generated[1, 9:], alone[0, 5:])


def test_parameter_counts_differ_by_lambda_vectors_and_gain():
    for subln, per_layer in [("affine", 6), ("plain", 4), ("none", 4)]:
        config = tiny_config(num_hidden_layers=4, num_key_value_heads=1, subln=subln)
        diff = DiffTransformerForCausalLM(config).num_parameters()
        base = DiffTransformerForCausalLM(config.matched_baseline()).num_parameters()
        assert diff - base == 4 * per_layer * config.map_head_dim
    v2 = tiny_config(attention="diff_v2", num_attention_heads=4, num_key_value_heads=2)
    d, heads = v2.head_dim, v2.num_attention_heads
    extra = (
        DiffTransformerForCausalLM(v2).num_parameters()
        - DiffTransformerForCausalLM(v2.matched_baseline()).num_parameters()
    )
    assert extra == v2.num_hidden_layers * v2.hidden_size * heads * (d + 1)
    gated = tiny_config(attention="gated", num_attention_heads=4, num_key_value_heads=2)
    extra = (
        DiffTransformerForCausalLM(gated).num_parameters()
        - DiffTransformerForCausalLM(gated.matched_baseline()).num_parameters()
    )
    assert extra == gated.num_hidden_layers * gated.hidden_size * gated.num_attention_heads * gated.head_dim
    # GDA at ratio 3 matched to 4 heads of width 8 (d_model 32): 3 signal heads and 1 noise map (q_proj as the
    # baseline's), o_proj reads 3 heads of 16 (48 columns, the baseline's 32), one KV group (16 K and 16 V rows, the
    # baseline's 32 each), lambda vectors (4 x 8) and the gain (16)
    baseline = tiny_config(attention="softmax", num_attention_heads=4)
    gda = matched_config(baseline, "gda", gda_ratio=3)
    extra = (
        DiffTransformerForCausalLM(gda).num_parameters()
        - DiffTransformerForCausalLM(baseline).num_parameters()
    )
    per_layer = (48 - 32) * 32 + 2 * (16 - 32) * 32 + 4 * 8 + 16
    assert extra == gda.num_hidden_layers * per_layer


def test_matched_baseline_doubles_heads_and_keeps_the_rest():
    config = tiny_config(num_attention_heads=2, num_key_value_heads=1, rope_style="half")
    base = config.matched_baseline()
    assert (base.attention, base.num_attention_heads, base.num_key_value_heads) == ("softmax", 4, 2)
    # DIFF V1's heads (and cache entries) are 2d wide, the baseline's d: each map is the baseline's head.
    assert base.head_dim == config.map_head_dim == config.head_dim // 2 and base.rope_style == "half"
    assert (
        base.intermediate_size == config.intermediate_size
        and base.num_hidden_layers == config.num_hidden_layers
    )


def test_lambda_init_schedule_and_lambda_std():
    config = tiny_config(hidden_size=256, num_attention_heads=2, num_hidden_layers=12, lambda_std=0.25)
    model = DiffTransformerForCausalLM(config)
    attns = [layer.self_attn for layer in model.model.layers]
    expected = [0.8 - 0.6 * math.exp(-0.3 * layer) for layer in range(12)]
    assert [a.lambda_init for a in attns] == pytest.approx(expected, abs=1e-12)
    assert attns[0].lambda_init == pytest.approx(0.2) and attns[1].lambda_init == pytest.approx(
        0.35555, abs=1e-4
    )
    vectors = torch.cat(
        [getattr(a.lambda_vectors, n).detach() for a in attns for n in ("q1", "k1", "q2", "k2")]
    )
    assert vectors.dtype == torch.float32 and vectors.numel() == 12 * 4 * 64
    assert vectors.std().item() == pytest.approx(0.25, rel=0.06)
    assert abs(vectors.mean().item()) < 0.02
    constant = DiffTransformerForCausalLM(tiny_config(lambda_init=0.8))
    assert all(layer.self_attn.lambda_init == 0.8 for layer in constant.model.layers)


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_gradients_reach_every_parameter(fields):
    model = random_model(seed=7, dtype=torch.float32, **fields).train()
    ids = torch.randint(0, 97, (2, 10))
    model(ids, labels=ids).loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_gradient_checkpointing_gives_the_same_gradients():
    model = random_model(seed=7, dtype=torch.float32, num_key_value_heads=1).train()
    ids = torch.randint(0, 97, (2, 10))
    model(ids, labels=ids).loss.backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.gradient_checkpointing_enable()
    model(ids, labels=ids).loss.backward()
    for before, after in zip(plain, (p.grad for p in model.parameters())):
        torch.testing.assert_close(after, before)


def test_combined_maps_rows_sum_to_one_minus_lambda():
    model = random_model(seed=8, num_key_value_heads=1)
    out = model(torch.randint(0, 97, (2, 7)), output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 3 and len(out.hidden_states) == 4
    for layer, maps in zip(model.model.layers, out.attentions):
        assert maps.shape == (2, 2, 7, 7)
        lam = layer.self_attn.lambda_full().double()
        torch.testing.assert_close(maps.sum(-1), (1 - lam).expand(2, 2, 7))


def test_logits_hook_sees_every_component_map_and_its_result_is_used():
    model = random_model(seed=9, num_key_value_heads=1)
    ids = torch.randint(0, 97, (1, 6))
    plain = model(ids).logits
    seen = []

    def record(module, logits):
        seen.append((module.layer_idx, tuple(logits.shape)))
        return logits

    with attention_logits_hook(model, record):
        torch.testing.assert_close(model(ids).logits, plain)
    assert seen == [(layer, (1, 4, 6, 6)) for layer in range(3)]
    with attention_logits_hook(model, lambda module, logits: logits * 0):
        flattened = model(ids).logits
    assert not torch.allclose(flattened, plain)
    assert all(m.logits_hook is None for m in model.modules() if isinstance(m, SplitHeadAttention))


def test_save_and_load_round_trip_bit_exactly(tmp_path):
    model = random_model(seed=10, dtype=torch.float32, num_key_value_heads=1)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert AutoConfig.from_pretrained(tmp_path).model_type == "difftransformer"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded, DiffTransformerForCausalLM)
    original, restored = model.state_dict(), loaded.state_dict()
    assert original.keys() == restored.keys()
    assert all(torch.equal(original[k], restored[k]) for k in original)
    ids = torch.randint(0, 97, (1, 8))
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert isinstance(AutoModel.from_pretrained(tmp_path), DiffTransformerModel)


def test_checkpoint_names_are_the_llama_familys_and_the_lambda_submodules(tmp_path):
    """On disk the names are the Llama family's, and the lambda vectors keep their in-memory names (their own float32
    submodule); transformers' "original format" (``revert_weight_conversion``, what the DiffLlama conversion reads)
    gives DiffLlama's lambda names, for a new model and for a loaded one alike."""
    model = random_model(num_key_value_heads=1)
    assert "model.layers.0.self_attn.lambda_vectors.k2" in model.state_dict()
    model.save_pretrained(tmp_path)
    names = set(safetensors.torch.load_file(tmp_path / "model.safetensors"))
    for expected in [
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.lambda_vectors.k2",
        "model.layers.0.self_attn.subln.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    ]:
        assert expected in names
    assert names == set(model.state_dict())
    for source in (model, DiffTransformerForCausalLM.from_pretrained(tmp_path)):
        original = set(checkpoint_state(source))
        assert "model.layers.0.self_attn.lambda_k2" in original and not any(
            "lambda_vectors" in n for n in original
        )
    model.save_pretrained(tmp_path / "original", save_original_format=True)
    names = set(safetensors.torch.load_file(tmp_path / "original" / "model.safetensors"))
    assert "model.layers.0.self_attn.lambda_k2" in names
    restored = DiffTransformerForCausalLM.from_pretrained(
        tmp_path / "original", dtype=torch.float64
    ).state_dict()
    assert all(
        torch.equal(restored[name], value.to(restored[name].dtype))
        for name, value in model.state_dict().items()
    )
    assert "model.layers.2.self_attn.lambda_proj.weight" in set(
        random_model(attention="diff_v2").state_dict()
    )


@pytest.mark.parametrize(
    "fields, field_named",
    [
        (dict(hidden_size=30), "hidden_size"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads"),
        (dict(hidden_size=24, num_attention_heads=4), "rotary width"),
        (dict(attention="linear"), "attention"),
        (dict(rope_style="neox"), "rope_style"),
        (dict(subln="layernorm"), "subln"),
        (dict(lambda_init="linear"), "lambda_init"),
    ],
)
def test_bad_config_names_the_field(fields, field_named):
    with pytest.raises(ValueError, match=field_named):
        tiny_config(**fields)


def test_bad_inputs_are_refused():
    model = random_model()
    with pytest.raises(ValueError, match="vocab_size=97"):
        model(torch.tensor([[1, 97]]))
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.ones(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 6))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.ones(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 1, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="exactly one"):
        model()


def test_config_round_trips_through_json(tmp_path):
    config = DiffTransformerConfig(
        attention="diff_v2", num_attention_heads=8, lambda_init=0.5, rope_style="half"
    )
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert loaded.to_diff_dict() == config.to_diff_dict()
    assert (loaded.attention, loaded.lambda_init, loaded.rope_style, loaded.head_dim) == (
        "diff_v2",
        0.5,
        "half",
        32,
    )


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_return_dict_false_gives_tuples(fields):
    model = random_model(seed=11, **fields)
    ids = torch.randint(0, 97, (2, 6))
    full = model(ids, labels=ids)
    as_tuple = model(ids, labels=ids, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], full.loss)
    torch.testing.assert_close(as_tuple[1], full.logits)
    model.config.return_dict = False
    assert isinstance(model(ids), tuple) and isinstance(model.model(ids), tuple)
    assert not isinstance(model(ids, return_dict=True), tuple)


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_bfloat16_load_keeps_only_the_lambda_vectors_in_float32(fields, tmp_path):
    """The scalar lambda's vectors (DIFF V1, GDA, any composition with it) stay float32 (their own module, so FSDP2
    can group them); every other module's parameters are uniformly bfloat16; lambda is still computed in float32."""
    model = random_model(seed=12, dtype=torch.float32, **fields)
    model.save_pretrained(tmp_path)
    loaded = DiffTransformerForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    is_diff = model.config.lambda_mode == "scalar"  # the parts with lambda vectors
    assert loaded._keep_in_fp32_modules_strict == ({"lambda_vectors"} if is_diff else set())
    for name, module in loaded.named_modules():
        dtypes = {p.dtype for p in module.parameters(recurse=False)}
        if name.endswith("lambda_vectors"):
            assert dtypes == {torch.float32}, name
        elif dtypes:
            assert dtypes == {torch.bfloat16}, name
    if is_diff:
        attn, original = loaded.model.layers[1].self_attn, model.model.layers[1].self_attn
        assert attn.lambda_full().dtype == torch.float32
        torch.testing.assert_close(attn.lambda_full(), original.lambda_full())
        assert loaded(torch.randint(0, 97, (1, 5))).logits.dtype == torch.bfloat16


def test_diff_v2_returned_maps_are_in_the_graph():
    """The maps DIFF V2 returns are the ones its output is computed from: gradients reach them."""
    model = random_model(seed=13, dtype=torch.float32, attention="diff_v2", num_attention_heads=4,
                         num_key_value_heads=2)  # fmt: skip
    ids = torch.randint(0, 97, (2, 6))
    plain = model(ids).logits
    out = model(ids, output_attentions=True)
    torch.testing.assert_close(out.logits, plain, atol=1e-5, rtol=1e-5)
    maps = out.attentions[0]
    maps.retain_grad()
    out.logits[:, -1].sum().backward()
    assert maps.grad is not None and maps.grad.abs().sum() > 0


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_packed_documents_do_not_attend_across(fields):
    """Several documents in one row, position_ids restarting at each (padding-free collators): every document's
    logits equal running it alone, as transformers' Llama gives; without the restart they would not."""
    model = random_model(seed=14, dtype=torch.float32, **fields)
    docs = [torch.randint(0, 97, (n,)) for n in (5, 7, 4)]
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(doc)) for doc in docs])[None]
    packed = model(ids, position_ids=positions).logits[0]
    start = 0
    for doc in docs:
        alone = model(doc[None]).logits[0]
        torch.testing.assert_close(packed[start : start + len(doc)], alone, atol=1e-5, rtol=1e-5)
        start += len(doc)
    unpacked = model(ids).logits[0]  # consecutive positions: one document, attends across
    assert not torch.allclose(unpacked[5:12], packed[5:12], atol=1e-3)


ROPE_SCALINGS = [
    dict(rope_type="linear", factor=4.0),
    dict(rope_type="dynamic", factor=4.0),
    dict(rope_type="yarn", factor=4.0),
]


@pytest.mark.parametrize("rope", ROPE_SCALINGS, ids=lambda r: r["rope_type"])
def test_rope_scaling_matches_llama_with_the_same_weights(rope):
    """The softmax kind with half rotary is Llama in our names: with a scaled RoPE both give the same logits,
    and the scaling changes them as it changes Llama's (dynamic only past the trained length)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = dict(attention="softmax", num_attention_heads=4, num_key_value_heads=2, rope_style="half",
                  max_position_embeddings=16)  # fmt: skip
    plain = random_model(seed=15, dtype=torch.float32, **fields)
    scaled = random_model(
        seed=15, dtype=torch.float32, rope_parameters={"rope_theta": 100.0, **rope}, **fields
    )
    config = scaled.config
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_hidden_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=config.rms_norm_eps,
            max_position_embeddings=16,
            rope_parameters=dict(config.rope_parameters),
        )  # fmt: skip
    ).eval()
    llama.load_state_dict(scaled.state_dict(), strict=True)
    short, long = torch.randint(0, 97, (1, 10)), torch.randint(0, 97, (1, 40))
    for ids in (short, long):
        torch.testing.assert_close(scaled(ids).logits, llama(ids).logits, atol=1e-5, rtol=1e-5)
    plain_short = random_model(seed=15, dtype=torch.float32, rope_parameters={"rope_theta": 100.0}, **fields)
    same_short = torch.allclose(scaled(short).logits, plain_short(short).logits, atol=1e-5)
    assert same_short == (rope["rope_type"] == "dynamic")
    assert not torch.allclose(scaled(long).logits, plain_short(long).logits, atol=1e-5)
    assert plain.config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_rope_scaling_applies_to_every_kind(fields):
    ids = torch.randint(0, 97, (1, 40))
    base = random_model(seed=16, dtype=torch.float32, max_position_embeddings=16, **fields)
    scaled = random_model(seed=16, dtype=torch.float32, max_position_embeddings=16,
                          rope_parameters={"rope_type": "linear", "factor": 2.0}, **fields)  # fmt: skip
    assert not torch.allclose(base(ids).logits, scaled(ids).logits, atol=1e-4)
    with pytest.raises(ValueError, match="rope_type"):
        tiny_config(rope_parameters={"rope_type": "warp", "factor": 2.0})


def test_old_configs_with_rope_theta_still_load():
    config = tiny_config(rope_theta=500.0)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 500.0}


def test_diff_v1_attn_implementation_picks_the_backend_or_is_refused(monkeypatch, tmp_path):
    """DIFF V1: "eager" runs the materialized reference, "sdpa" (the default) the configured backend,
    "flex_attention" FlexAttention; an implementation it cannot run is refused saying why, never ignored."""
    dispatcher = sys.modules["difftransformer.ops.diff_attention"]
    chosen = []
    choose = dispatcher.choose_backend
    monkeypatch.setattr(dispatcher, "choose_backend", lambda *a: chosen.append(choose(*a)) or chosen[-1])
    model = random_model(seed=17, dtype=torch.float32, attention_backend="blocked", **ALL_KINDS[0])
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 97, (1, 20))
    fast = model(ids).logits
    eager = DiffTransformerForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    torch.testing.assert_close(eager(ids).logits, fast, atol=1e-5, rtol=1e-5)
    assert chosen == ["blocked"] * 3 + ["reference"] * 3
    eager.set_attn_implementation("sdpa")
    torch.testing.assert_close(eager(ids).logits, fast, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="flash-attention kernels take a value as wide"):
        DiffTransformerForCausalLM.from_pretrained(tmp_path, attn_implementation="flash_attention_2")
    with pytest.raises((ValueError, KeyError)):
        DiffTransformerForCausalLM.from_pretrained(tmp_path, attn_implementation="foo")
    model.config._attn_implementation = "flash_attention_2"  # set behind transformers' checks
    with pytest.raises(ValueError, match="attn_implementation must be one of"):
        model(ids)


DISTRIBUTED_CHECK = """
import sys, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig
import difftransformer  # noqa: F401  (registers the Auto classes)

folder, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
torch.manual_seed(0)
ids = torch.randint(0, 97, (2, 12))
if mode == "fsdp":
    # transformers' own FSDP2 (fully_shard per decoder layer; float32-kept modules in groups of their own)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, distributed_config=DistributedConfig(fsdp_size=2)
    )
    lambdas = {p.dtype for n, p in model.named_parameters() if "lambda_vectors" in n}
    others = {p.dtype for n, p in model.named_parameters() if "lambda_vectors" not in n}
    assert lambdas == {torch.float32} and others == {torch.bfloat16}, (lambdas, others)
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    torch.testing.assert_close(loss.detach(), reference(ids, labels=ids).loss.detach(), atol=2e-2, rtol=0)
else:
    model = AutoModelForCausalLM.from_pretrained(folder, tp_plan="auto")
    assert model.model.layers[0].self_attn.q_proj.weight.to_local().shape[0] * 2 == model.config.num_attention_heads * (
        2 if model.config.attention == "diff_v2" else 1) * model.config.head_dim
    with torch.no_grad():
        got = model(ids).logits
        want = AutoModelForCausalLM.from_pretrained(folder)(ids).logits
    # o_proj and down_proj add the shards' partial sums: float32 rounding of another order of addition
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
print("ok", dist.get_rank(), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, fields",
    [
        ("fsdp", dict(attention="diff", num_key_value_heads=1)),
        ("tp", dict(attention="diff", num_key_value_heads=2)),
        ("tp", dict(attention="diff_v2", num_attention_heads=4, num_key_value_heads=2)),
        ("tp", dict(attention="softmax", num_attention_heads=4, num_key_value_heads=2)),
    ],
)
def test_two_process_fsdp2_bfloat16_and_tensor_parallel(mode, fields, tmp_path):
    """On 2 CPU processes (gloo): transformers' FSDP2 trains DIFF V1 in bfloat16 with its float32 lambda vectors
    (their own shard group), and ``tp_plan="auto"`` splits every kind's heads across shards with the logits of
    one process."""
    random_model(seed=1, dtype=torch.float32, **fields).save_pretrained(tmp_path / "model")
    (tmp_path / "check.py").write_text(DISTRIBUTED_CHECK)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(tmp_path / "check.py"),
         str(tmp_path / "model"), mode],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.count("ok") == 2, result.stderr[-3000:]


@pytest.mark.parametrize("fields", ALL_KINDS, ids=variant_id)
def test_cpu_autocast_bfloat16_runs_every_kind(fields):
    """Under CPU autocast the projections give bf16 q, k, v while the rotary tables are float32: q and k keep
    the projections' dtype through the rotation, so the operators see one dtype (the C++ kernel would refuse a
    bf16 v beside float32 q); forward and backward run and stay near float32."""
    model = random_model(seed=18, dtype=torch.float32, **fields).train()
    ids = torch.randint(0, 97, (2, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    torch.testing.assert_close(loss.float(), model(ids, labels=ids).loss, atol=0.05, rtol=0.02)
