"""The split-head map layout: DIFF V1's heads (paper section 2.1), each a signal and a noise map of half width over
one 2d-wide value, with G signal heads a noise map (GDA), normalised per head; one differential-attention operator
call a layer."""

from __future__ import annotations

from functools import partial

import torch
from transformers import PreTrainedConfig
from transformers.cache_utils import Cache

from difftransformer.layers.parts_attention import PartsAttention
from difftransformer.ops.diff_attention import diff_attention
from difftransformer.ops.reference import diff_attention_reference
from difftransformer.ops.rotary import QueryRotary, apply_rotary, rotate_queries


class SplitHeadAttention(PartsAttention):
    """Multi-head differential attention with GQA and a KV cache (Ye et al., arXiv 2410.05258, §2.1: Eq. 1 the two
    maps and their difference, Eq. 2 lambda, Eq. 3 the per-head norm and the (1 - lambda_init) scale), with G signal
    heads a noise map (Lim et al., "Grouped Differential Attention", arXiv 2510.06949, §2.2):

        head_s = (softmax(Q1_s K1_g^T / sqrt(d)) - lambda_s softmax(Q2_{s // G} K2_g^T / sqrt(d))) V_g,

    g = s // (h / h_kv) the KV group of both maps, lambda the layer's scalar or sigmoid(lambda_proj(x)_s) per token,
    then the per-head norm over the 2d features, the scale, the gate and o_proj (h 2d -> d_model)
    (:meth:`PartsAttention.finish`). At G = 1 the projections have the matched Transformer's shapes: q d_model -> 2h d,
    k and v d_model -> 2 h_kv d, o 2h d -> d_model.

    The operator reads the queries in the paired layout of :mod:`difftransformer.ops.common` (head s's Q1 | Q2,
    2d wide: at G = 1 a view of q_proj's output, at G > 1 each noise map repeated for its G signal heads, so a noise
    map is formed once for each of its signal heads); each differential head is ``head_dim`` = 2d wide, as its value
    and its cache entries are, and each of its maps reads ``map_head_dim`` = d of it.

    Args:
        config: the model's configuration: ``hidden_size``, ``num_attention_heads`` (h), ``num_key_value_heads``
            (h_kv), ``head_dim`` (2d; an upcycled model's heads are wider than hidden_size / h), its parts,
            ``lambda_init``, ``lambda_std``, ``subln_eps``, ``rope_style``, ``causal``, ``attention_backend``;
            ``_attn_implementation`` picks the operator backend (:func:`~difftransformer.ops.choose_backend`) at each
            call.
        layer_idx: 0-based depth, for lambda_init, the window and the cache.
    """

    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx, config.head_dim)
        self.head_dim = config.head_dim
        self.reset_parameters()  # as earlier versions did: a seed gives the same initial weights

    def queries(self, queries: torch.Tensor) -> torch.Tensor:
        """q_proj's query groups (B, T, n, G + 1, d) -> q (B, h, T, 2d) in the paired layout, unrotated: signal
        head s's Q1 | its noise map's Q2."""
        if self.ratio == 1:
            return queries.flatten(-2).transpose(1, 2)
        signal, noise = queries[..., :-1, :], queries[..., -1:, :]
        return torch.cat((signal, noise.expand_as(signal)), dim=-1).flatten(2, 3).transpose(1, 2)

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
        """
        Args:
            hidden_states: (B, T, d_model).
            position_embeddings: cos, sin of shape (B, T, d/2).
            attention_mask: the mask transformers' ``masking_utils`` builds for the implementation and this layer's
                window: bool or additive (B or 1, 1, T, S), a FlexAttention ``BlockMask``, or None for causal (full
                if not causal).
            past_key_values: a transformers Cache; stores k and v as (B, h_kv, S, 2d). In continuous batching the
                paged cache comes as the keyword ``cache`` with its indices, as transformers' attention functions
                take it.
            output_attentions: return the combined map A1 - lambda A2, (B, h, T, S).
            output_component_maps: return (combined, A1, A2) instead.

        Returns:
            (B, T, d_model), and the maps or None. Maps and a logits hook take the materialized reference.
        """
        batch, q_len, _ = hidden_states.shape
        cos, sin = position_embeddings
        # q goes to the operator unrotated with its rotary embedding (the C++ decode step rotates it in the kernel);
        # k is rotated before the cache, in the projection's (B, T, sub-heads, d) layout, each of K1, K2 a sub-head.
        queries, gate = self.query_groups(hidden_states)
        q = self.queries(queries)  # Q1 | Q2 per head
        k = self.k_proj(hidden_states).view(batch, q_len, -1, self.map_head_dim)
        k = apply_rotary(k, cos.unsqueeze(2), sin.unsqueeze(2), self.rope_style)
        k = k.view(batch, q_len, -1, self.head_dim).transpose(1, 2)  # K1 | K2 per KV head
        v = self.v_proj(hidden_states).view(batch, q_len, -1, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        elif kwargs.get("cache") is not None:  # continuous batching's paged cache
            k, v = kwargs["cache"].update(k, v, self.layer_idx, kwargs)

        if attention_mask is None and self.is_causal and 1 < q_len < k.shape[2]:
            # No mask with more keys than queries: the queries fill a static cache from its first slot (transformers
            # leaves the mask out only then), which SDPA reads as causal from the top left; the operators align
            # causal masks bottom-right, which over the first q_len keys is the same.
            k, v = k[:, :, :q_len], v[:, :, :q_len]
        weight = self.noise_weight(hidden_states)
        if isinstance(weight, torch.Tensor) and weight.dim():  # per token: (B, T, h) -> (B, h, T, 1)
            weight = weight.transpose(1, 2).unsqueeze(-1)
        rotary = QueryRotary(cos, sin, self.rope_style)
        causal = self.is_causal and attention_mask is None
        maps = None
        if output_attentions or output_component_maps or self.logits_hook is not None:
            hook = None if self.logits_hook is None else partial(self.logits_hook, self)
            out, maps = diff_attention_reference(
                rotate_queries(q, rotary), k, v, weight, causal=causal, attn_mask=attention_mask,
                logits_hook=hook, return_maps=output_attentions or output_component_maps,
            )  # fmt: skip
        else:
            out = diff_attention(
                q, k, v, weight, causal=causal, attn_mask=attention_mask, rotary=rotary,
                backend=self.config.attention_backend, implementation=self.config._attn_implementation,
            )  # fmt: skip
        out = self.finish(out.transpose(1, 2), gate)
        if output_component_maps:
            return out, maps
        return out, maps[0] if maps is not None else None
