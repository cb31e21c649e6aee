"""The matched baseline's multi-head softmax attention (GQA, rotary, KV cache), dispatched as Llama's is: one call
to the implementation ``config._attn_implementation`` names in transformers' attention interface (sdpa, flash
attention, flex attention, the paged implementations of continuous batching, a kernel registered with
``AttentionInterface``), and, for "eager", the materialized attention below."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from transformers import PreTrainedConfig
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from difftransformer.layers.hooks import LogitsHook
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
    Other keywords (``dropout``: these models have none) are ignored."""
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


class SoftmaxAttention(nn.Module):
    """Llama-style attention over ``num_attention_heads`` heads of width ``head_dim``.

    The kinds built on it (DIFF V2, gated attention) say how many d-wide row blocks their ``q_proj`` holds per head
    (:attr:`q_blocks_per_head`) and how many of those are query heads of the one attention call
    (:attr:`query_heads_per_head`); k_proj, v_proj and o_proj are the baseline's.

    Args:
        config: the model's configuration (``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
            ``head_dim``, ``rope_style``, ``causal``); its ``_attn_implementation`` picks the attention function at
            each call, as in transformers' models.
        layer_idx: 0-based depth, the layer's slot in the KV cache.
    """

    #: q_proj's d-wide row blocks per head: the head's query heads, then any gate
    q_blocks_per_head = 1
    #: query heads per head in the attention call
    query_heads_per_head = 1

    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.rope_style, self.is_causal = config.rope_style, config.causal
        heads = config.num_attention_heads
        self.num_key_value_groups = self.query_heads_per_head * heads // config.num_key_value_heads
        self.logits_hook: LogitsHook | None = None
        hidden, width = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, self.q_blocks_per_head * heads * width, bias=False)
        self.k_proj = nn.Linear(hidden, config.num_key_value_heads * width, bias=False)
        self.v_proj = nn.Linear(hidden, config.num_key_value_heads * width, bias=False)
        self.o_proj = nn.Linear(heads * width, hidden, bias=False)

    def project(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        queries: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project and rotate: q (B, H_q, T, d), k and v (B, H_kv, T, d). ``queries`` (B, T, H_q, d) are q_proj's
        query heads where a kind reads more than queries from it (the gate); by default all of q_proj."""
        batch, q_len, _ = hidden_states.shape
        if queries is None:
            queries = self.q_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        k = self.k_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        v = self.v_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        cos, sin = position_embeddings[0].unsqueeze(2), position_embeddings[1].unsqueeze(2)
        q = apply_rotary(queries, cos, sin, self.rope_style)
        k = apply_rotary(k, cos, sin, self.rope_style)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

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
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        return attention(self, q, k, v, attention_mask, scaling=self.scaling, dropout=0.0, **kwargs)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, T, d_model) -> (B, T, d_model), and the map (B, H, T, S) with ``output_attentions``.
        ``attention_mask`` is the mask transformers' ``masking_utils`` builds for the implementation; other keywords
        (a paged cache and its indices in continuous batching) go to the attention function."""
        q, k, v = self.project(hidden_states, position_embeddings)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        out, probs = self.attend(q, k, v, attention_mask, output_attentions, **kwargs)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1)), probs if output_attentions else None
