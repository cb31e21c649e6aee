"""The whole-head map layout: whole query heads of width d over the baseline's keys and values, in one call to the
attention implementation ``config._attn_implementation`` names in transformers' attention interface (sdpa, flash
attention, flex attention, the paged implementations of continuous batching, a kernel registered with
``AttentionInterface``; "eager" is the materialized attention below), as Llama's is. The softmax baseline, gated
attention, DIFF V2, Motif's attention and every composition of their parts (layers/parts.py) run here."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from transformers import PreTrainedConfig
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from difftransformer.layers.parts_attention import PartsAttention
from difftransformer.ops.rotary import apply_rotary
from difftransformer.ops.softmax import softmax_attention_reference


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``attn_implementation="eager"``: the materialized map, computed in float32 (float64 for float64 inputs),
    with ``module.logits_hook`` (if set) on the scaled logits. query (B, H, T, d), key and value (B, H_kv, S, d),
    attention_mask bool or additive (B or 1, 1, T, S), or None for the module's causal (bottom-right) or full
    attention. Returns the output (B, T, H, d) and the map (B, H, T, S), as transformers' implementations do.
    Other keywords (``dropout``: these models have none; ``sliding_window``: the mask holds it) are ignored."""
    hook = None if module.logits_hook is None else partial(module.logits_hook, module)
    out, probs = softmax_attention_reference(
        query,
        key,
        value,
        causal=module.is_causal and attention_mask is None,
        attn_mask=attention_mask,
        scale=scaling,
        logits_hook=hook,
    )
    return out.transpose(1, 2), probs


class WholeHeadAttention(PartsAttention):
    """Attention over whole query heads: with noise maps, n groups of G signal heads and one noise head over the
    baseline's K/V (h_kv KV heads dividing n, so a group reads one), each signal head's output

        out_s = attn_s - lambda_s attn_{noise(s)},   attn_j = softmax(Q_j K_g^T / sqrt(d) + mask) V_g,

    lambda the layer's scalar or sigmoid(lambda_proj(x)_s) per token (DIFF V2: G = 1, Ye et al. 2026; Motif's GDLA:
    G = 4 with the output gate); without noise maps each head's ``attn_s`` (the softmax baseline; gated attention
    with the gate, Qiu et al.). Then the per-head norm, the gate and o_proj (h d -> d_model)
    (:meth:`PartsAttention.finish`). q_proj's rows: :mod:`~difftransformer.layers.parts_attention`.

    Args:
        config: the model's configuration (``hidden_size``, ``num_attention_heads`` h, ``num_key_value_heads``,
            ``head_dim`` d, its parts, ``rope_style``, ``causal``); its ``_attn_implementation`` picks the attention
            function at each call, as in transformers' models.
        layer_idx: 0-based depth, the layer's slot in the KV cache (and its window and lambda_init).
    """

    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx, config.head_dim)
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.num_key_value_groups = config.query_heads // config.num_key_value_heads

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The one attention call: (B, T, H_q, d) and the map (B, H_q, T, S) where the implementation gives one.
        Maps are asked of the eager implementation, whatever the configured one (they are what it computes)."""
        implementation = "eager" if output_attentions else self.config._attn_implementation
        if implementation == "flex_attention" and self.sliding_window is not None and q.device.type == "cpu":
            raise ValueError(
                "attn_implementation 'flex_attention' cannot run a sliding-window layer on the CPU: torch 2.13's "
                "inductor fails to compile FlexAttention's windowed block mask there (CppCompileError); use "
                "'sdpa' or 'eager' on the CPU"
            )
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        return attention(
            self, q, k, v, attention_mask, scaling=self.scaling, dropout=0.0, sliding_window=self.sliding_window,
            **kwargs,
        )  # fmt: skip

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        output_component_maps: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...] | None]:
        """hidden_states (B, T, d_model) -> (B, T, d_model), and the map (B, h, T, S) with ``output_attentions``
        (with noise maps the combined map A_s - lambda_s A_noise(s), from which the output is then computed, so
        gradients reach it); with ``output_component_maps``, (combined, A_s, A_noise(s)), each (B, h, T, S).
        ``attention_mask`` is the mask transformers' ``masking_utils`` builds for the implementation and this
        layer's window; other keywords (a paged cache and its indices in continuous batching) go to the attention
        function."""
        batch, q_len, _ = hidden_states.shape
        queries, gate = self.query_groups(hidden_states)  # (B, T, n, G [+ 1], d)
        cos, sin = position_embeddings[0].unsqueeze(2), position_embeddings[1].unsqueeze(2)
        q = apply_rotary(queries.flatten(2, 3), cos, sin, self.rope_style).transpose(1, 2)
        k = self.k_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        k = apply_rotary(k, cos, sin, self.rope_style).transpose(1, 2)
        v = self.v_proj(hidden_states).view(batch, q_len, -1, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        maps = output_attentions or output_component_maps
        out, probs = self.attend(q, k, v, attention_mask, maps, **kwargs)  # (B, T, H_q, d), (B, H_q, T, S)
        if not self.parts.differential:
            return self.finish(out, gate), probs if maps else None
        weight = self.noise_weight(hidden_states)  # a scalar, or (B, T, h)
        if maps:
            groups = probs.unflatten(1, (-1, self.ratio + 1))  # (B, n, G + 1, T, S); n of this shard
            first, noise = groups[:, :, :-1], groups[:, :, -1:]
            if isinstance(weight, torch.Tensor) and weight.dim():
                weight = weight.transpose(1, 2).unflatten(1, (-1, self.ratio)).unsqueeze(-1).to(probs.dtype)
            combined = (first - weight * noise).flatten(1, 2)  # (B, h, T, S)
            # each signal head's KV head: its query head's, query heads ordered group by group
            query_head = torch.arange(first.shape[1] * self.ratio, device=q.device)
            query_head = query_head + query_head // self.ratio
            values = v.to(combined.dtype)[:, query_head // self.num_key_value_groups]
            out = (combined @ values).transpose(1, 2).to(q.dtype)  # (B, T, h, d)
            result = (combined, first.flatten(1, 2), noise.expand_as(first).flatten(1, 2))
        else:
            groups = out.unflatten(2, (-1, self.ratio + 1))  # (B, T, n, G + 1, d)
            first, noise = groups[:, :, :, :-1], groups[:, :, :, -1:]
            if isinstance(weight, torch.Tensor) and weight.dim():
                weight = weight.unflatten(2, (-1, self.ratio)).unsqueeze(-1)
            if isinstance(weight, torch.Tensor):
                weight = weight.to(out.dtype)
            out = (first - weight * noise).flatten(2, 3)  # (B, T, h, d)
        output = self.finish(out, gate)
        if not maps:
            return output, None
        return output, result if output_component_maps else result[0]
