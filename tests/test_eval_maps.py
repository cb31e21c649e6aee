"""The attention task's heatmaps (the paper's figure of attention scores): the panels are the layer's own maps, A1,
A2 and A1 - lambda A2 for DIFF V1, the paired maps and their gated difference for DIFF V2, the softmax map
otherwise, and the PNG that ``eval attention`` writes draws exactly those."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.eval import attention
from difftransformer.eval.maps import attention_maps, heatmap_panels
from helpers import random_model
from kind_table import ALL_FIELDS
from test_eval import char_tokenizer, generated_text  # noqa: F401  (a fixture: one token per character)

IDS = torch.randint(0, 97, (1, 11), generator=torch.Generator().manual_seed(3))


def causal_probabilities(panel: np.ndarray) -> None:
    """A softmax map of a causal prompt: rows sum to 1, nothing above the diagonal."""
    np.testing.assert_allclose(panel.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(panel, 1) == 0)


@pytest.mark.parametrize("head", [None, 1])
def test_diff_v1_panels_are_the_two_maps_and_the_layers_difference(head):
    model = random_model(dtype=torch.float32)
    layers = heatmap_panels(model, IDS, head)
    assert len(layers) == 3
    for layer, panels in zip(model.model.layers, layers):
        lam = float(torch.as_tensor(layer.self_attn.lambda_full()).detach())
        (t1, a1), (t2, a2), (t3, difference) = panels
        assert (t1, t2, t3) == ("A1", "A2", f"A1 - {lam:.3f} A2")
        causal_probabilities(a1)
        causal_probabilities(a2)
        # The difference is the layer's own map (output_attentions), and it is A1 - lambda A2.
        np.testing.assert_allclose(difference, a1 - lam * a2, atol=1e-5)
        assert np.abs(difference).max() > 0.05 and not np.allclose(a1, a2, atol=1e-3)
    combined = attention_maps(model, IDS)[0][0]
    expected = combined.mean(0) if head is None else combined[head]
    np.testing.assert_allclose(layers[0][2][1], expected.numpy(), atol=1e-6)


def test_diff_v2_panels_are_the_paired_maps_and_their_gated_difference():
    model = random_model(dtype=torch.float32, attention="diff_v2", num_attention_heads=4)
    gates = []
    handles = [
        layer.self_attn.lambda_proj.register_forward_hook(
            lambda m, i, out: gates.append(torch.sigmoid(out[0]))
        )
        for layer in model.model.layers
    ]
    layers = heatmap_panels(model, IDS, head=2)
    for handle in handles:
        handle.remove()
    for panels, gate in zip(layers, gates):
        (_, first), (_, second), (title, difference) = panels
        assert title == "A(s) - sigmoid(lambda_s) A(noise(s))"
        causal_probabilities(first)
        causal_probabilities(second)
        per_token = gate[:, 2].detach().numpy()[:, None]  # head 2's gate at every query position
        np.testing.assert_allclose(difference, first - per_token * second, atol=1e-5)


def test_gda_panels_share_each_noise_map_among_its_signal_heads():
    model = random_model(
        dtype=torch.float32, attention="gda", num_attention_heads=3, gda_ratio=3, num_key_value_heads=1
    )
    heads = [heatmap_panels(model, IDS, head) for head in range(3)]
    for layer, per_head in zip(model.model.layers, zip(*heads)):
        lam = float(torch.as_tensor(layer.self_attn.lambda_full()).detach())
        for (t1, a1), (_, a2), (t3, difference) in per_head:
            assert (t1, t3) == ("A1", f"A1 - {lam:.3f} A2")
            causal_probabilities(a1)
            causal_probabilities(a2)
            np.testing.assert_allclose(difference, a1 - lam * a2, atol=1e-5)
        # one noise map for the three signal heads of the group, three different signal maps
        np.testing.assert_array_equal(per_head[0][1][1], per_head[2][1][1])
        assert not np.allclose(per_head[0][0][1], per_head[1][0][1], atol=1e-3)


def test_softmax_and_diffllama_panels():
    softmax = random_model(dtype=torch.float32, attention="softmax", num_attention_heads=4)
    layers = heatmap_panels(softmax, IDS)
    assert [[title for title, _ in panels] for panels in layers] == [["A"]] * 3
    np.testing.assert_allclose(layers[1][0][1], attention_maps(softmax, IDS)[1][0].mean(0).numpy(), atol=1e-6)
    causal_probabilities(layers[1][0][1])
    diffllama = DiffLlamaForCausalLM(
        DiffLlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    ).eval()  # fmt: skip
    layers = heatmap_panels(diffllama, IDS, head=1)
    combined = attention_maps(diffllama, IDS)
    for panels, layer_map in zip(layers, combined):
        (_, a1), (_, a2), (_, difference) = panels
        causal_probabilities(a1)
        np.testing.assert_allclose(difference, layer_map[0, 1].detach().numpy(), atol=1e-5)
    with pytest.raises(ValueError, match=r"`heatmap_head` must lie in \[0, 1\] \(the model's heads\); got 2"):
        heatmap_panels(diffllama, IDS, head=2)  # 4 component heads make 2 differential ones


def test_eval_attention_draws_the_panels_of_its_first_prompt(char_tokenizer, tmp_path, monkeypatch):  # noqa: F811
    torch.manual_seed(0)
    model = DiffTransformerForCausalLM(
        DiffTransformerConfig(vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=48,
                              num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=512)
    ).eval()  # fmt: skip
    drawn = {}
    plot = attention.plot_heatmaps

    def spy(layers, path, subtitle):
        drawn.update(layers=layers, subtitle=subtitle)
        plot(layers, path, subtitle)

    monkeypatch.setattr(attention, "plot_heatmaps", spy)
    asked = []
    panels = attention.heatmap_panels

    def first_prompt(model, ids, head):
        asked.append(ids)
        return panels(model, ids, head)

    monkeypatch.setattr(attention, "heatmap_panels", first_prompt)
    options = attention.AttentionOptions(context_lengths=[200], needles=["1:1"], depths=[0.5, 1.0], samples=2,
                                         needle_digits=3, heatmap_head=1)  # fmt: skip
    attention.run_attention(
        model, char_tokenizer, generated_text(30), options, output_dir=tmp_path, progress=False
    )
    assert (tmp_path / "attention_maps.png").stat().st_size > 0 and len(asked) == 1  # one prompt, the first
    expected = heatmap_panels(model, asked[0], 1)
    assert drawn["subtitle"] == "answer needle at depth 0.5, head 1"
    for got, want in zip(drawn["layers"], expected):
        assert [t for t, _ in got] == [t for t, _ in want]
        for (_, a), (_, b) in zip(got, want):
            np.testing.assert_array_equal(a, b)
    monkeypatch.undo()
    quiet = tmp_path / "quiet"
    options = attention.AttentionOptions(context_lengths=[200], needles=["1:1"], depths=[0.5], samples=1,
                                         needle_digits=3, heatmaps=False)  # fmt: skip
    attention.run_attention(
        model, char_tokenizer, generated_text(30), options, output_dir=quiet, progress=False
    )
    assert (quiet / "attention.png").is_file() and not (quiet / "attention_maps.png").exists()


@pytest.mark.parametrize("name", list(ALL_FIELDS))
def test_every_kind_and_composition_draws_its_own_maps(name):
    """For any point of the space: three panels a layer with noise maps (each signal map, its noise map and the
    layer's own combined map, the one output_attentions returns), one without; the maps are causal probabilities
    (windowed ones too: rows still sum to 1 over the keys a query sees)."""
    model = random_model(dtype=torch.float32, **ALL_FIELDS[name])
    layers = heatmap_panels(model, IDS, head=0)
    combined = attention_maps(model, IDS)
    for panels, layer_map in zip(layers, combined):
        assert len(panels) == (3 if model.config.parts.differential else 1)
        for _, panel in panels[:-1] if len(panels) == 3 else panels:
            causal_probabilities(panel)
        np.testing.assert_allclose(panels[-1][1], layer_map[0, 0].numpy(), atol=1e-6)
