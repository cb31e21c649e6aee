"""The FLOPs a configuration's parts declare (models/flops.py) against the matrix products a forward pass runs,
counted by PyTorch's FlopCounterMode on the materialized attention (every key of every query: a bidirectional
model, so the causal count's halving is tested apart), for every kind and composition whose materialized attention
forms each map once (the whole layout, and the split layout at one signal head a noise map: the reference forms a
GDA noise map once for each of its signal heads)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from difftransformer import DiffTransformerForCausalLM
from difftransformer.models import decode_flops, matched_config, training_flops
from difftransformer.models.flops import forward_flops, mean_keys
from helpers import tiny_config
from kind_table import ALL_FIELDS, BASELINE

COUNTED = {
    name: fields
    for name, fields in ALL_FIELDS.items()
    if tiny_config(**fields).parts.layout == "whole" or (tiny_config(**fields).parts.noise_ratio or 1) == 1
}


@pytest.mark.parametrize("name", list(COUNTED))
def test_declared_flops_are_the_products_a_forward_runs(name):
    # bidirectional, so no layer may be windowed: period 1 windows none
    config = tiny_config(**{**COUNTED[name], "causal": False, "sliding_window_period": 1})
    config._attn_implementation = "eager"
    if config.differential_heads:
        config.attention_backend = "reference"
    model = DiffTransformerForCausalLM(config).eval()
    length = 13
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(0, config.vocab_size, (1, length)))
    declared = forward_flops(config, [length] * config.num_hidden_layers).total
    assert counter.get_total_flops() == declared * length  # the counter counts the whole row


def test_the_causal_and_windowed_keys():
    """A causal row of T tokens: (T + 1) / 2 keys a query on average; within a window of W: the first W positions
    see 1..W keys, the rest W."""
    for length in (1, 7, 64):
        assert mean_keys(length, None) == sum(t + 1 for t in range(length)) / length
        for window in (1, 3, 64, 100):
            assert mean_keys(length, window) == pytest.approx(
                sum(min(t + 1, window) for t in range(length)) / length
            )


def test_training_is_three_forwards_and_decode_reads_the_window():
    motif = matched_config(tiny_config(**BASELINE), "motif", sliding_window=5)
    forward = forward_flops(motif, [mean_keys(64, 5 if motif.parts.windowed(i) else None) for i in range(3)])
    assert training_flops(motif, 64).total == pytest.approx(3 * forward.total)
    long, short = decode_flops(motif, 1000), decode_flops(motif, 10)
    # only the full layer (layer 0) reads more keys as the cache grows; the windowed ones read 5
    per_key = (long.attention - short.attention) / (1001 - 11)
    assert long.attention == pytest.approx(per_key * (1001 + 5 + 5))
