"""The attention kinds as named points of the space of parts (layers/kinds.py): what each declares and what the
models build from it, the parts' matching rule (models/matching.py), Motif's attention as its sources define it, GDA
at ratio 1 against DIFF V1, and gated attention against transformers' Qwen3NextAttention on the same weights. Every
combination of parts against the float64 reference: tests/test_parts.py."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.layers import KINDS, AttentionParts, RotaryEmbedding, WholeHeadAttention
from difftransformer.layers.parts import MAP_LAYOUTS
from difftransformer.models import matched_config
from difftransformer.models.modeling import LAYOUTS
from helpers import random_model, randomize, tiny_config
from kind_table import ALL_FIELDS, BASELINE
from naive_model import visible_keys


@pytest.mark.parametrize("fields", [dict(num_key_value_heads=2), dict(num_key_value_heads=1, subln="none")])
def test_gda_at_ratio_one_is_diff_v1_on_the_same_weights(fields):
    """gda_ratio=1 reads q_proj as DIFF V1's adjacent Q1 | Q2: the same state dict gives the same logits, bit for
    bit, and the same gradients; and the matching rule at ratio 1 gives DIFF V1's shapes."""
    diff = random_model(seed=3, dtype=torch.float32, num_attention_heads=2, **fields)
    gda = DiffTransformerForCausalLM(dataclasses.replace(diff.config, attention="gda")).eval()
    gda.load_state_dict(diff.state_dict())
    ids = torch.randint(0, 97, (2, 40))
    assert torch.equal(gda(ids).logits, diff(ids).logits)
    for model in (diff, gda):
        model(ids, labels=ids).loss.backward()
    for (name, a), b in zip(diff.named_parameters(), gda.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=0, rtol=0, msg=name)
    matched = matched_config(diff.config.matched_baseline(), "gda", gda_ratio=1, subln=diff.config.subln)
    assert dataclasses.replace(matched, attention="diff").to_dict() == diff.config.to_dict()


def qwen3_next_pair(
    kv_heads: int, seed: int
) -> tuple[Qwen3NextAttention, WholeHeadAttention, Qwen3NextRotaryEmbedding]:
    """transformers' Qwen3NextAttention (full-width rotation, its q/k norms replaced by the identity) and ours with its
    q/k/v/o weights loaded as they are."""
    qwen = Qwen3NextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
    )  # fmt: skip
    qwen._attn_implementation = "sdpa"
    theirs = Qwen3NextAttention(qwen, layer_idx=0).double()
    randomize(theirs, seed)
    theirs.q_norm, theirs.k_norm = nn.Identity(), nn.Identity()
    config = DiffTransformerConfig(
        attention="gated", hidden_size=64, num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=11,
        num_hidden_layers=1, rope_style="half",
    )  # fmt: skip
    ours = WholeHeadAttention(config, layer_idx=0).double()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours, Qwen3NextRotaryEmbedding(qwen)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_gated_attention_is_qwen3_next_attention_without_its_qk_norms_and_partial_rotation(kv_heads):
    """The shared part on the same weights: q_proj's query | gate rows head by head, the sigmoid gate after the
    attention and before o_proj, and GQA. Qwen3-Next's per-head q/k RMSNorms and quarter-width rotation
    are left out of ours (identity here, full rotation there), as they would be a second difference from the
    matched baseline beside the gate."""
    theirs, ours, rotary = qwen3_next_pair(kv_heads, seed=7)
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    positions = torch.arange(9)[None].expand(2, -1)
    cos, sin = RotaryEmbedding(dim=16)(x, positions)
    theirs_cos, theirs_sin = rotary(
        x, positions
    )  # the same angles in their layout, computed in float32 there
    torch.testing.assert_close(theirs_cos, torch.cat([cos, cos], dim=-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(theirs_sin, torch.cat([sin, sin], dim=-1), atol=1e-6, rtol=0)
    expected, _ = theirs(
        x, (torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)), attention_mask=None
    )
    got, _ = ours(x, (cos, sin), attention_mask=None)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", list(ALL_FIELDS))
def test_every_kind_and_composition_builds_what_its_parts_declare(name):
    """The layer is its layout's module, its float32 list and TP entries are its parts', and the matched baseline
    of its matched configuration is the baseline (the table's baseline: no rule rounds)."""
    config = tiny_config(**ALL_FIELDS[name])
    model = DiffTransformerForCausalLM(config)
    parts = config.parts
    assert type(model.model.layers[0].self_attn) is LAYOUTS[parts.layout], name
    assert set(model._keep_in_fp32_modules_strict) == set(parts.keep_in_fp32), name
    assert set(parts.tp_plan) <= set(config.base_model_tp_plan), name
    for key in parts.tp_plan:
        assert any(param.startswith(key.replace("*", "0")) for param, _ in model.model.named_parameters()), (
            key
        )
    window = dict(sliding_window=config.sliding_window, sliding_window_period=config.sliding_window_period)
    baseline = tiny_config(**BASELINE, **window)  # the matched baseline keeps the window
    assert config.matched_baseline().to_dict() == baseline.to_dict(), name


def test_the_kinds_are_the_points_their_sources_define():
    """DIFF V1 (Ye et al. §2.1), GDA (DIFF V1 with groups), DIFF V2 (per-token lambda over whole heads, no norm),
    gated attention (the baseline and the G1 gate) and Motif's GDLA without its low-rank projections: whole signal and
    noise heads, 4 signal heads a noise head, a per-token lambda a signal head, the elementwise gate, no norm, and
    sliding windows on every layer but each 4th from layer 0, of 128 past keys and the query (Motif's "+1")."""
    assert KINDS["diff"].parts == AttentionParts("split", 1, "scalar", "affine")
    assert KINDS["gda"].parts == KINDS["diff"].parts
    assert KINDS["diff_v2"].parts == AttentionParts("whole", 1, "token", "none")
    assert KINDS["gated"].parts == AttentionParts(gate="elementwise")
    assert KINDS["softmax"].parts == AttentionParts()
    motif = KINDS["motif"].parts
    assert motif == AttentionParts(
        "whole", 4, "token", "none", "elementwise", window=128 + 1, window_period=4
    )
    assert [motif.windowed(layer) for layer in range(9)] == [layer % 4 != 0 for layer in range(9)]
    # a windowed query sees itself and window - 1 earlier keys: 129 in all, Motif's sliding_window + 1
    visible = visible_keys(300, True, motif.window)
    assert (
        int(visible[299].sum()) == 129 and bool(visible[299, 299 - 128]) and not bool(visible[299, 299 - 129])
    )


@pytest.mark.parametrize(
    "heads, kv_heads, ratio, signal, noise, kv_groups, map_dim",
    [
        (4, 4, 1, 2, 2, 2, None),  # DIFF V1's shape
        (4, 4, 3, 3, 1, 1, None),  # the retrieval preset: 3 + 1 maps, one KV group for the one noise map
        (4, 4, 4, 4, 1, 1, 16),  # 4 + 1 maps: one more than the baseline's heads, so d is kept by map_dim
        (32, 8, 3, 24, 8, 4, None),  # at scale: the baseline's 32 query heads, DIFF V1's KV groups
        (32, 8, 4, 28, 7, 1, 16),  # 35 maps: whole groups of 5 need more than 32; gcd(4, 7) = 1 KV group
    ],
)
def test_gda_matching_rule(heads, kv_heads, ratio, signal, noise, kv_groups, map_dim):
    baseline = DiffTransformerConfig(
        attention="softmax", hidden_size=heads * 16, num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=11, num_hidden_layers=1,
    )  # fmt: skip
    config = matched_config(baseline, "gda", gda_ratio=ratio)
    assert (config.num_attention_heads, config.noise_heads, config.num_key_value_heads) == (
        signal,
        noise,
        kv_groups,
    )
    assert config.map_head_dim == baseline.head_dim and config.map_dim == map_dim
    model = DiffTransformerForCausalLM(config)
    attention = model.model.layers[0].self_attn
    d, hidden = baseline.head_dim, baseline.hidden_size
    assert attention.q_proj.weight.shape == ((signal + noise) * d, hidden)
    assert attention.o_proj.weight.shape == (hidden, signal * 2 * d)
    assert attention.k_proj.weight.shape == attention.v_proj.weight.shape == (kv_groups * 2 * d, hidden)


@pytest.mark.parametrize(
    "heads, kv_heads, ratio, noise, kv_out",
    [
        (8, 8, 1, 8, 8),  # DIFF V2: the baseline's heads and KV heads, a noise query head each
        (8, 8, 4, 2, 2),  # Motif's G = 4: H / G noise heads over H_kv / G KV heads
        (12, 4, 4, 3, 1),  # G divides H_kv: one KV head for the 3 noise maps
        (8, 2, 4, 2, 2),  # G does not divide H_kv: gcd(H_kv, n)
    ],
)
def test_whole_layout_matching_rule(heads, kv_heads, ratio, noise, kv_out):
    baseline = DiffTransformerConfig(
        attention="softmax", hidden_size=heads * 8, num_attention_heads=heads, num_key_value_heads=kv_heads,
        vocab_size=11, num_hidden_layers=1,
    )  # fmt: skip
    for kind in ("diff_v2", "motif"):
        config = matched_config(baseline, kind, gda_ratio=ratio)
        assert (config.num_attention_heads, config.noise_heads, config.num_key_value_heads) == (
            heads,
            noise,
            kv_out,
        )
        attention = DiffTransformerForCausalLM(config).model.layers[0].self_attn
        gate = heads * 8 if config.output_gate == "elementwise" else 0
        assert attention.q_proj.weight.shape == ((heads + noise) * 8 + gate, heads * 8)
        assert attention.o_proj.weight.shape == (heads * 8, heads * 8)
        assert attention.k_proj.weight.shape == (kv_out * 8, heads * 8)
    with pytest.raises(
        ValueError, match=r"gda_ratio \(3\) must be a positive divisor of the baseline's 8 heads"
    ):
        matched_config(
            DiffTransformerConfig(attention="softmax", hidden_size=64, num_attention_heads=8),
            "motif",
            gda_ratio=3,
        )


def test_every_map_layout_is_in_the_vllm_plugin_and_it_names_no_kind():
    """The vLLM plugin (a distribution of its own that cannot import the package) builds each layer from the parts its
    copy of the configuration resolves: its ``LAYOUTS`` (read from its source, without vLLM) holds every map layout,
    and the plugin tests no kind by name, so every kind and composition is served by its parts."""
    plugin = (
        Path(__file__).resolve().parents[1] / "serving" / "vllm" / "src" / "difftransformer_vllm" / "model.py"
    )
    tree = ast.parse(plugin.read_text())
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "LAYOUTS"
    )
    assert {key.value for key in table.keys} == set(MAP_LAYOUTS)
    compared = {
        constant.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        for constant in ast.walk(node)
        if isinstance(constant, ast.Constant)
    }
    assert not set(KINDS) & compared, set(KINDS) & compared
