"""The kinds compared with DIFF: grouped differential attention (GDA) and gated attention, as modules against
float64 references written from the papers (hypothesis for shapes, forward and backward), GDA at ratio 1 against
DIFF V1 and gated attention against transformers' Qwen3NextAttention on the same weights; and the kinds'
declarations (layers/kinds.py) against what the models build."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.layers import KINDS, GatedAttention, GroupedDiffAttention, RotaryEmbedding
from helpers import random_model, randomize


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """x (T, d) rotated pair by pair with the tables (T, d/2)."""
    half = x.shape[-1] // 2
    out = x.clone()
    for j in range(half):
        a, b = (2 * j, 2 * j + 1) if style == "interleaved" else (j, j + half)
        out[:, a] = x[:, a] * cos[:, j] - x[:, b] * sin[:, j]
        out[:, b] = x[:, a] * sin[:, j] + x[:, b] * cos[:, j]
    return out


def visible_keys(q_len: int, causal: bool, mask: torch.Tensor | None, b: int) -> torch.Tensor:
    visible = torch.ones(q_len, q_len, dtype=torch.bool)
    if causal:
        visible &= torch.ones(q_len, q_len, dtype=torch.bool).tril()
    if mask is not None:
        visible &= mask[b, 0]
    return visible


def softmax_map(q: torch.Tensor, k: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    logits = (q @ k.T / math.sqrt(q.shape[-1])).masked_fill(~visible, -math.inf)
    return torch.softmax(logits, dim=-1)


def gda_reference(module: GroupedDiffAttention, x, cos, sin, mask) -> torch.Tensor:
    """Lim et al. §2.2 head by head: signal head s = jG + i takes Q1 from slot i of query group j and the noise map of
    that group (slot G), both against KV group s // (h / h_kv); DIFF V1's lambda, norm and scale (Ye et al. Eq. 1-3)."""
    config = module.config
    ratio, heads, kv_heads, d = (
        config.gda_ratio,
        config.num_attention_heads,
        config.num_key_value_heads,
        module.map_head_dim,
    )
    batch, q_len, _ = x.shape
    q = (x @ module.q_proj.weight.T).view(batch, q_len, heads // ratio, ratio + 1, d)
    k = (x @ module.k_proj.weight.T).view(batch, q_len, 2 * kv_heads, d)
    v = (x @ module.v_proj.weight.T).view(batch, q_len, kv_heads, 2 * d)
    vectors = module.lambda_vectors
    lam = torch.exp(vectors.q1 @ vectors.k1) - torch.exp(vectors.q2 @ vectors.k2) + module.lambda_init
    out = []
    for b in range(batch):
        visible = visible_keys(q_len, config.causal, mask, b)
        heads_out = []
        for s in range(heads):
            group, member = divmod(s, ratio)
            g = s // (heads // kv_heads)
            maps = [
                softmax_map(rope(query, cos[b], sin[b], config.rope_style), rope(k[b, :, 2 * g + c], cos[b], sin[b], config.rope_style), visible)
                for c, query in enumerate((q[b, :, group, member], q[b, :, group, ratio]))
            ]  # fmt: skip
            head = (maps[0] - lam * maps[1]) @ v[b, :, g]
            if module.subln is not None:
                head = head / torch.sqrt(head.pow(2).mean(-1, keepdim=True) + config.subln_eps)
                head = head if module.subln.weight is None else head * module.subln.weight
            heads_out.append(head * (1 - module.lambda_init))
        out.append(torch.cat(heads_out, dim=-1))
    return torch.stack(out) @ module.o_proj.weight.T


def gated_reference(module: GatedAttention, x, cos, sin, mask) -> torch.Tensor:
    """Qiu et al. Eq. 5 at position G1 head by head: softmax attention's output times sigmoid(x W_gate), with q_proj
    holding each head's query then its gate."""
    config = module.config
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    batch, q_len, _ = x.shape
    q = (x @ module.q_proj.weight.T).view(batch, q_len, heads, 2 * d)
    k = (x @ module.k_proj.weight.T).view(batch, q_len, kv_heads, d)
    v = (x @ module.v_proj.weight.T).view(batch, q_len, kv_heads, d)
    out = []
    for b in range(batch):
        visible = visible_keys(q_len, config.causal, mask, b)
        heads_out = []
        for i in range(heads):
            g = i // (heads // kv_heads)
            query, gate = q[b, :, i, :d], q[b, :, i, d:]
            attention = softmax_map(
                rope(query, cos[b], sin[b], config.rope_style), rope(k[b, :, g], cos[b], sin[b], config.rope_style), visible
            )  # fmt: skip
            heads_out.append((attention @ v[b, :, g]) * torch.sigmoid(gate))
        out.append(torch.cat(heads_out, dim=-1))
    return torch.stack(out) @ module.o_proj.weight.T


@st.composite
def gda_problems(draw):
    kv_heads = draw(st.integers(1, 2))
    noise = kv_heads * draw(st.integers(1, 2))
    return (
        dict(
            attention="gda",
            gda_ratio=(ratio := draw(st.integers(1, 3))),
            num_attention_heads=noise * ratio,
            num_key_value_heads=kv_heads,
            map_dim=draw(st.sampled_from([2, 4, 8])),
            rope_style=draw(st.sampled_from(["interleaved", "half"])),
            subln=draw(st.sampled_from(["affine", "plain", "none"])),
            causal=draw(st.booleans()),
            attention_backend=draw(st.sampled_from(["auto", "reference", "sdpa", "blocked", "decode"])),
        ),
        draw(st.integers(1, 2)),
        draw(st.integers(1, 9)),
        draw(st.booleans()),
        draw(st.integers(0, 2**16)),
    )


@st.composite
def gated_problems(draw):
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 3))
    return (
        dict(
            attention="gated",
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            hidden_size=heads * draw(st.sampled_from([2, 4, 8])),
            rope_style=draw(st.sampled_from(["interleaved", "half"])),
            causal=draw(st.booleans()),
        ),
        draw(st.integers(1, 2)),
        draw(st.integers(1, 9)),
        draw(st.booleans()),
        draw(st.integers(0, 2**16)),
    )


def module_inputs(module: nn.Module, batch: int, q_len: int, masked: bool, seed: int):
    """Random float64 hidden states, the rotary tables of positions 0.. and, if ``masked``, a bool (B, 1, T, T) mask
    hiding random keys (each query keeps itself), with every parameter randomised."""
    randomize(module, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(
        batch, q_len, module.config.hidden_size, generator=gen, dtype=torch.float64
    ).requires_grad_()
    rotary = RotaryEmbedding(dim=module.config.map_head_dim)
    cos, sin = rotary(x, torch.arange(q_len)[None].expand(batch, -1))
    mask = None
    if masked:
        mask = (torch.rand(batch, 1, q_len, q_len, generator=gen) > 0.4) | torch.eye(q_len, dtype=torch.bool)
        if module.config.causal:
            mask &= torch.ones(q_len, q_len, dtype=torch.bool).tril()
    return x, cos, sin, mask


def assert_forward_and_backward_match(module, reference, x, cos, sin, mask, seed):
    out, _ = module(x, (cos, sin), attention_mask=mask)
    expected = reference(module, x, cos, sin, mask)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    inputs = [x, *module.parameters()]
    for got, want in zip(
        torch.autograd.grad(out, inputs, upstream),
        torch.autograd.grad(expected, inputs, upstream),
        strict=True,
    ):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)


@given(problem=gda_problems())
def test_gda_module_matches_the_float64_reference_forward_and_backward(problem):
    fields, batch, q_len, masked, seed = problem
    config = DiffTransformerConfig(hidden_size=20, vocab_size=11, num_hidden_layers=3, **fields)
    module = GroupedDiffAttention(config, layer_idx=seed % 3).double()
    x, cos, sin, mask = module_inputs(module, batch, q_len, masked, seed)
    assert_forward_and_backward_match(module, gda_reference, x, cos, sin, mask, seed)


@given(problem=gated_problems())
def test_gated_module_matches_the_float64_reference_forward_and_backward(problem):
    fields, batch, q_len, masked, seed = problem
    config = DiffTransformerConfig(vocab_size=11, num_hidden_layers=1, **fields)
    module = GatedAttention(config, layer_idx=0).double()
    module.config._attn_implementation = ("eager", "sdpa")[seed % 2]
    x, cos, sin, mask = module_inputs(module, batch, q_len, masked, seed)
    assert_forward_and_backward_match(module, gated_reference, x, cos, sin, mask, seed)


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
    matched = KINDS["gda"].match(diff.config.matched_baseline(), gda_ratio=1)
    assert dataclasses.replace(matched, attention="diff").to_dict() == diff.config.to_dict()


def qwen3_next_pair(
    kv_heads: int, seed: int
) -> tuple[Qwen3NextAttention, GatedAttention, Qwen3NextRotaryEmbedding]:
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
    ours = GatedAttention(config, layer_idx=0).double()
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


def test_every_kind_is_declared_once_and_the_models_follow_the_declaration():
    """Each declaration's layer is what the model builds, its float32 list and TP entries are the model's, its fields
    are refused on the other kinds, and the matched baseline of its matching rule's output is the baseline (where
    the rule does not round)."""
    baseline = DiffTransformerConfig(
        attention="softmax", hidden_size=64, num_attention_heads=8, num_key_value_heads=4, vocab_size=11,
        num_hidden_layers=1,
    )  # fmt: skip
    for name, kind in KINDS.items():
        config = kind.match(baseline)
        model = DiffTransformerForCausalLM(config)
        assert type(model.model.layers[0].self_attn) is kind.layer, name
        assert set(model._keep_in_fp32_modules_strict) == set(kind.keep_in_fp32), name
        assert set(kind.tp_plan) <= set(config.base_model_tp_plan), name
        for key in kind.tp_plan:
            assert any(
                param.startswith(key.replace("*", "0")) for param, _ in model.model.named_parameters()
            ), key
        assert config.kind_facts() == kind.facts()
        assert config.matched_baseline().to_diff_dict() == baseline.to_diff_dict(), name
        for other in KINDS.values():
            for field in other.fields:
                if other is not kind:
                    with pytest.raises(ValueError, match=f"{field} is for attention='{other.name}' only"):
                        dataclasses.replace(config, **{field: 2})


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
    config = KINDS["gda"].match(baseline, gda_ratio=ratio)
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


def test_every_declared_serving_layer_is_in_the_vllm_plugin():
    """The vLLM plugin (a distribution of its own that cannot import the package) picks each layer's attention by
    the name the kind declares, from its copy of the configuration: each declared name is a key of its
    ``ATTENTIONS`` (read from its source, without vLLM), and the plugin tests no kind by name."""
    plugin = (
        Path(__file__).resolve().parents[1] / "serving" / "vllm" / "src" / "difftransformer_vllm" / "model.py"
    )
    tree = ast.parse(plugin.read_text())
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "ATTENTIONS"
    )
    assert {key.value for key in table.keys} == {kind.serving for kind in KINDS.values()}
    compared = {
        constant.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        for constant in ast.walk(node)
        if isinstance(constant, ast.Constant)
    }
    assert not set(KINDS) & compared, set(KINDS) & compared
