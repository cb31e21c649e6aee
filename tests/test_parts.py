"""The space of attention parts (layers/parts.py): every combination of map layout, signal heads per noise map,
lambda, per-head norm, output gate and window, as one attention module, against the float64 reference that builds
each part from its formula (tests/naive_model.attention_reference), forward and backward, with padding and windows
(hypothesis for the combinations and shapes); the refusal of combinations without meaning; windows through the model
(transformers' masks, the KV cache past the window's edge)."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from difftransformer import DiffTransformerConfig
from difftransformer.layers import RotaryEmbedding
from difftransformer.layers.parts import LAMBDA_RENAMINGS, AttentionParts
from difftransformer.models.modeling import LAYOUTS
from helpers import random_model, randomize
from kind_table import COMPOSITION_FIELDS
from naive_model import attention_reference, visible_keys

# checkpoint names of the scalar lambda's vectors, as the reference reads them
CHECKPOINT_NAMES = {new: old for old, new in LAMBDA_RENAMINGS.items()}


@st.composite
def parts_problems(draw):
    """A configuration anywhere in the space (small shapes), the batch, length, layer and seed."""
    layout = draw(st.sampled_from(["split", "whole"]))
    differential = layout == "split" or draw(st.booleans())
    ratio = draw(st.integers(1, 3)) if differential else None
    kv_heads = draw(st.integers(1, 2))
    heads = (
        kv_heads * draw(st.integers(1, 2)) * (ratio or 1)
        if differential
        else kv_heads * draw(st.integers(1, 3))
    )
    width = draw(st.sampled_from([2, 4, 6]))
    window = draw(st.one_of(st.none(), st.integers(1, 6)))
    fields = dict(
        attention={"split": "diff", "whole": "diff_v2"}[layout] if differential else "softmax",
        map_layout=layout,
        gda_ratio=ratio,
        lambda_mode=draw(st.sampled_from(["scalar", "token"])) if differential else None,
        subln=draw(st.sampled_from(["affine", "plain", "none"])),
        output_gate=draw(st.sampled_from(["none", "elementwise"])),
        sliding_window=window,
        sliding_window_period=draw(st.integers(0, 2)) if window is not None else None,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rope_style=draw(st.sampled_from(["interleaved", "half"])),
        lambda_init=draw(st.sampled_from(["depth", 0.5])),
    )
    if layout == "split":
        fields.update(map_dim=width, hidden_size=20)
        backends = ["auto", "reference", "sdpa", "decode"] + (
            ["blocked"] if fields["lambda_mode"] == "scalar" else []
        )
        fields["attention_backend"] = draw(st.sampled_from(backends))
    else:
        fields["hidden_size"] = heads * width
    return (
        fields,
        draw(st.integers(1, 2)),
        draw(st.integers(1, 9)),
        draw(st.integers(0, 2)),
        draw(st.integers(0, 2**16)),
    )


def reference_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters under their checkpoint names (the reference's), as the same tensors (autograd)."""
    return {
        CHECKPOINT_NAMES.get(name, name).replace("lambda_vectors.", "lambda_"): param
        for name, param in module.named_parameters()
    }


@settings(max_examples=120, deadline=None)
@given(problem=parts_problems())
def test_every_combination_of_parts_matches_the_float64_reference_forward_and_backward(problem):
    fields, batch, q_len, layer_idx, seed = problem
    config = DiffTransformerConfig(vocab_size=11, num_hidden_layers=3, **fields)
    config._attn_implementation = ("eager", "sdpa")[seed % 2]
    module = LAYOUTS[config.map_layout](config, layer_idx).double()
    randomize(module, seed)
    assert module.sliding_window == (config.sliding_window if config.parts.windowed(layer_idx) else None)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, q_len, config.hidden_size, generator=gen, dtype=torch.float64).requires_grad_()
    positions = torch.arange(q_len)
    cos, sin = RotaryEmbedding(dim=config.map_head_dim)(x, positions[None].expand(batch, -1))
    # the mask transformers builds for this layer: causal, its window, and random padding of keys
    padding = torch.rand(batch, q_len, generator=gen) > 0.3
    padding[:, -1] = True
    visible = torch.stack(
        [visible_keys(q_len, True, module.sliding_window, padding[b]) for b in range(batch)]
    )
    out, _ = module(x, (cos, sin), attention_mask=visible[:, None])
    weights = reference_weights(module)
    expected = torch.stack(
        [attention_reference(config, weights, x[b], layer_idx, positions, visible[b]) for b in range(batch)]
    )
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
    upstream = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    inputs = [x, *module.parameters()]
    for got, want in zip(
        torch.autograd.grad(out, inputs, upstream, allow_unused=True),
        torch.autograd.grad(expected, inputs, upstream, allow_unused=True),
        strict=True,
    ):
        if want is None:
            assert got is None or not got.any()
        else:
            torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize(
    "fields, conflict",
    [
        (dict(attention="softmax", map_layout="split"), "map_layout='split' splits each head"),
        (dict(attention="gated", lambda_mode="token"), "lambda_mode='token' weighs a noise map"),
        (dict(attention="diff_v2", lambda_mode="both"), "lambda_mode must be one of"),
        (dict(attention="diff", subln="layer"), "subln must be one of"),
        (dict(attention="motif", output_gate="headwise"), "output_gate must be one of"),
        (dict(attention="diff_v2", gda_ratio=0), "gda_ratio (signal heads per noise map) must be a positive"),
        (dict(attention="softmax", sliding_window=0), "sliding_window must be a positive integer"),
        (
            dict(attention="softmax", sliding_window_period=2),
            "sliding_window_period=2 picks the windowed layers",
        ),
        (dict(attention="diff_v2", sliding_window=8, causal=False), "sliding_window=8 needs causal=True"),
    ],
)
def test_a_combination_without_meaning_is_refused_in_one_line_naming_it(fields, conflict):
    with pytest.raises(ValueError, match=re.escape(conflict)) as refused:
        DiffTransformerConfig(num_attention_heads=4, **fields)
    assert "\n" not in str(refused.value)


def test_a_configuration_holds_and_saves_its_resolved_parts(tmp_path):
    """A part left unset takes the kind's value; the saved config.json names every part, and a part set moves the
    kind along it alone."""
    motif = DiffTransformerConfig(attention="motif", num_attention_heads=8, num_key_value_heads=2)
    assert motif.parts == AttentionParts(
        noise_ratio=4, lambda_mode="token", gate="elementwise", window=129, window_period=4
    )
    assert motif.layer_types == [
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
    ]
    motif.save_pretrained(tmp_path)
    saved = (tmp_path / "config.json").read_text()
    for field in (
        '"map_layout": "whole"',
        '"gda_ratio": 4',
        '"output_gate": "elementwise"',
        '"sliding_window": 129',
    ):
        assert field in saved
    ungated = DiffTransformerConfig(
        attention="motif", num_attention_heads=8, num_key_value_heads=2, output_gate="none"
    )
    assert ungated.parts == AttentionParts(noise_ratio=4, lambda_mode="token", window=129, window_period=4)


@pytest.mark.parametrize(
    "name", [name for name, fields in COMPOSITION_FIELDS.items() if fields.get("sliding_window")]
)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_windowed_models_decode_past_the_window_as_they_compute_the_whole_row(name, implementation):
    """A KV cache (transformers' sliding-window cache layers on the windowed layers) decoding token by token past the
    window's edge gives the logits of a full forward of the whole row, with left padding; and the model's logits are
    the float64 reference's (the window applied by transformers' masks)."""
    model = random_model(seed=3, dtype=torch.float32, **COMPOSITION_FIELDS[name])
    model.set_attn_implementation(implementation)
    window = model.config.sliding_window
    ids = torch.randint(3, 97, (2, 3 * window + 2), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        cache = DynamicCache(config=model.config)
        assert [type(layer).__name__ for layer in cache.layers] == [
            "DynamicSlidingWindowLayer" if kind == "sliding_attention" else "DynamicLayer"
            for kind in model.config.layer_types
        ]
        prefix = 3
        steps = [model(ids[:, :prefix], attention_mask=mask[:, :prefix], past_key_values=cache).logits]
        for t in range(prefix, ids.shape[1]):
            steps.append(
                model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache).logits
            )
    torch.testing.assert_close(torch.cat(steps, dim=1)[0], full[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat(steps, dim=1)[1, 2:], full[1, 2:], atol=2e-5, rtol=1e-4)
