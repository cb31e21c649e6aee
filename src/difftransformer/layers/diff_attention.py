"""DIFF V1 attention (paper section 2.1): two softmax maps per head, subtracted, normalised per head."""

from __future__ import annotations

from functools import partial
from typing import Literal

import torch
from torch import nn
from transformers import PreTrainedConfig
from transformers.cache_utils import Cache

from difftransformer.layers.hooks import LogitsHook
from difftransformer.layers.norm import RMSNorm
from difftransformer.ops.diff_attention import diff_attention
from difftransformer.ops.lambda_full import lambda_full
from difftransformer.ops.reference import diff_attention_reference
from difftransformer.ops.rotary import QueryRotary, apply_rotary, rotate_queries

SublnMode = Literal["affine", "plain", "none"]
SUBLN_MODES: tuple[str, ...] = ("affine", "plain", "none")


class LambdaVectors(nn.Module):
    """The four lambda vectors of a DIFF V1 layer, d entries each, kept in float32 whatever the model's dtype.

    A module of their own, so that the float32-kept parameters form their own group wherever parameters are
    grouped by owning module (FSDP2 needs one dtype per group; transformers gives ``_keep_in_fp32_modules``
    their own), and so that PEFT's ``modules_to_save`` and accelerate's offload hooks see every read of them. Saved
    under these names; the Llama-family ``self_attn.lambda_q1`` ... load too (models/modeling.py).

    Args:
        dim: d, the width of one map's queries and keys.
        std: std of their normal init.
    """

    def __init__(self, dim: int, std: float = 0.1) -> None:
        super().__init__()
        self.std = std
        # exp() of a bfloat16 dot product is too coarse for lambda.
        self.q1 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.k1 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.q2 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.k2 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, std) for all four."""
        for vector in (self.q1, self.k1, self.q2, self.k2):
            nn.init.normal_(vector, mean=0.0, std=self.std)

    def forward(self, lambda_init: float) -> torch.Tensor | float:
        """exp(q1 . k1) - exp(q2 . k2) + lambda_init, not clamped (:func:`~difftransformer.ops.lambda_full`)."""
        return lambda_full(self.q1, self.k1, self.q2, self.k2, lambda_init)


class DiffAttention(nn.Module):
    """Multi-head differential attention with GQA and a KV cache (Ye et al., arXiv 2410.05258, §2.1: Eq. 1 the two
    maps and their difference, Eq. 2 lambda, Eq. 3 the per-head norm and the (1 - lambda_init) scale).

    Projections have the matched Transformer's shapes: q d_model -> 2h*d, k and v d_model -> 2h_kv*d,
    o 2h*d -> d_model. Their outputs are read in the paired layout of :mod:`difftransformer.ops.common`
    (head i's Q1 | Q2 are q columns [2i d, (2i+2) d)): each differential head is ``head_dim`` = 2d wide, as
    its value and its cache entries are, and each of its maps reads ``map_head_dim`` = d of it. Head counts are
    read from the projections' outputs, so a tensor-parallel shard of the projections runs as it is. The queries
    come from :meth:`queries`, the one step grouped differential attention changes.

    Args:
        config: the model's configuration: ``hidden_size``, ``num_attention_heads`` (h, half the matched
            Transformer's), ``num_key_value_heads`` (h_kv), ``head_dim`` (2d; an upcycled model's heads are
            wider than hidden_size / h), ``noise_heads`` (h: one second map a head), ``lambda_init`` ("depth" or a
            constant), ``lambda_std``, ``subln`` (per-head RMSNorm with a gain "affine", without "plain", or none
            "none"), ``subln_eps``, ``rope_style``, ``causal``, ``attention_backend``; ``_attn_implementation``
            picks the operator backend (:func:`~difftransformer.ops.choose_backend`) at each call.
        layer_idx: 0-based depth, for lambda_init and the cache.
    """

    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.head_dim
        self.map_head_dim = self.head_dim // 2
        self.lambda_init = config.layer_lambda_init(layer_idx)
        self.out_scale = 1.0 - self.lambda_init  # the paper's fixed output scale, after the per-head norm
        self.rope_style, self.is_causal = config.rope_style, config.causal
        self.logits_hook: LogitsHook | None = None

        hidden, width = config.hidden_size, self.head_dim
        query_maps = config.num_attention_heads + config.noise_heads
        self.q_proj = nn.Linear(hidden, query_maps * self.map_head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, config.num_key_value_heads * width, bias=False)
        self.v_proj = nn.Linear(hidden, config.num_key_value_heads * width, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * width, hidden, bias=False)
        self.lambda_vectors = LambdaVectors(self.map_head_dim, config.lambda_std)
        self.subln = (
            None
            if config.subln == "none"
            else RMSNorm(width, eps=config.subln_eps, elementwise_affine=config.subln == "affine")
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Projections as nn.Linear initialises them, lambda vectors Normal(0, lambda_std), gain ones."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            proj.reset_parameters()
        self.lambda_vectors.reset_parameters()
        if self.subln is not None:
            self.subln.reset_parameters()

    def lambda_full(self) -> torch.Tensor | float:
        """The layer's scalar lambda: exp(q1.k1) - exp(q2.k2) + lambda_init, not clamped."""
        return self.lambda_vectors(self.lambda_init)

    def queries(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """q (B, h, T, 2d) in the paired layout, unrotated: head i's Q1 | Q2, a view of q_proj's output."""
        batch, q_len, _ = hidden_states.shape
        return self.q_proj(hidden_states).view(batch, q_len, -1, self.head_dim).transpose(1, 2)

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
            attention_mask: the mask transformers' ``masking_utils`` builds for the implementation: bool or
                additive (B or 1, 1, T, S), a FlexAttention ``BlockMask``, or None for causal (full if not causal).
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
        q = self.queries(hidden_states)  # Q1 | Q2 per head
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
        rotary = QueryRotary(cos, sin, self.rope_style)
        causal = self.is_causal and attention_mask is None
        maps = None
        if output_attentions or output_component_maps or self.logits_hook is not None:
            hook = None if self.logits_hook is None else partial(self.logits_hook, self)
            out, maps = diff_attention_reference(
                rotate_queries(q, rotary), k, v, self.lambda_full(), causal=causal, attn_mask=attention_mask,
                logits_hook=hook, return_maps=output_attentions or output_component_maps,
            )  # fmt: skip
        else:
            out = diff_attention(
                q, k, v, self.lambda_full(), causal=causal, attn_mask=attention_mask, rotary=rotary,
                backend=self.config.attention_backend, implementation=self.config._attn_implementation,
            )  # fmt: skip
        out = out * self.out_scale if self.subln is None else self.subln(out, self.out_scale)
        out = self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))
        if output_component_maps:
            return out, maps
        return out, maps[0] if maps is not None else None
