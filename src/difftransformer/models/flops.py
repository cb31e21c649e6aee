"""Compute of a configuration, counted from its shapes and parts: the multiply-adds of its matrix products (2 FLOPs
each) per token, for training (forward and backward: 3x the forward, as in Kaplan et al.'s 6N) on causal rows and for
a decode step after a number of cached tokens.

Counted per token and layer: every projection (q with its noise and gate rows, k, v, o, lambda_proj), the SwiGLU
(three d_model x intermediate products) and the LM head; in the attention, each query map's logits (2 d a key) and
each output's weighted sum of values (2 x the value width a key), over the keys a query sees: t + 1 at position t,
at most the window on a windowed layer. A split-layout head forms two d-wide maps and one combined map over its
2d-wide value (the paper's materialized count, which the fused kernels keep); GDA's noise maps are counted once, as
the declaration forms them. Elementwise work (softmax, the subtraction, norms, gates, rotary) is left out: it is
linear in the width and small beside the products.
"""

from __future__ import annotations

from dataclasses import dataclass

from difftransformer.models.configuration import DiffTransformerConfig


@dataclass(frozen=True)
class Flops:
    """FLOPs per token of one configuration, by where they are spent."""

    projections: float
    attention: float
    mlp: float
    head: float

    @property
    def total(self) -> float:
        return self.projections + self.attention + self.mlp + self.head


def mean_keys(block_size: int, window: int | None) -> float:
    """Keys a causal query sees, averaged over the positions of a ``block_size``-token row."""
    if window is None or window >= block_size:
        return (block_size + 1) / 2
    # positions 0 .. window-1 see t + 1 keys; the rest see the window
    return (window * (window + 1) / 2 + (block_size - window) * window) / block_size


def forward_flops(config: DiffTransformerConfig, keys: list[float]) -> Flops:
    """Forward FLOPs per token of ``config`` when a query of layer i sees ``keys[i]`` keys."""
    d_model, d, layers = config.hidden_size, config.map_head_dim, config.num_hidden_layers
    parts, heads = config.parts, config.num_attention_heads
    split = config.differential_heads
    out_width = config.head_dim  # a head's output (2d split, d whole)
    query_maps = config.query_heads
    q_rows = query_maps * d + (heads * out_width if parts.gate == "elementwise" else 0)
    kv_rows = 2 * config.num_key_value_heads * config.head_dim
    lam_rows = heads if parts.lambda_mode == "token" else 0
    projections = 2 * d_model * (q_rows + kv_rows + lam_rows + heads * out_width)
    # logits of every query map (d wide); weighted values: one combined map a head over the 2d value (split), or
    # one a query map over the d-wide value (whole)
    per_key = 2 * query_maps * d + 2 * (heads * out_width if split else query_maps * d)
    return Flops(
        projections=projections * layers,
        attention=per_key * sum(keys),
        mlp=2 * 3 * d_model * config.intermediate_size * layers,
        head=2 * d_model * config.vocab_size,
    )


def _window(config: DiffTransformerConfig, layer: int) -> int | None:
    return config.sliding_window if config.parts.windowed(layer) else None


def training_flops(config: DiffTransformerConfig, block_size: int) -> Flops:
    """FLOPs per trained token (forward and backward: 3x the forward) of ``config`` on rows of ``block_size``
    tokens."""
    keys = [mean_keys(block_size, _window(config, layer)) for layer in range(config.num_hidden_layers)]
    forward = forward_flops(config, keys)
    return Flops(*(3 * getattr(forward, name) for name in ("projections", "attention", "mlp", "head")))


def decode_flops(config: DiffTransformerConfig, cached: int) -> Flops:
    """FLOPs of one decode step (one new token) of ``config`` after ``cached`` tokens."""
    keys = []
    for layer in range(config.num_hidden_layers):
        window = _window(config, layer)
        keys.append(cached + 1 if window is None else min(cached + 1, window))
    return forward_flops(config, keys)
