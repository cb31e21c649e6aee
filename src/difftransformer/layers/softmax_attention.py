"""The matched baseline's standard multi-head softmax attention (GQA, rotary, KV cache)."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from transformers.cache_utils import Cache

from difftransformer.layers.hooks import LogitsHook
from difftransformer.layers.rotary import RopeStyle, apply_rotary
from difftransformer.ops import softmax_attention, softmax_attention_reference


class SoftmaxAttention(nn.Module):
    """Llama-style attention over ``num_heads`` heads of width d = hidden_size / num_heads.

    Same interface as :class:`~difftransformer.layers.DiffAttention`; ``output_attentions`` returns the
    softmax map (B, H, T, S). Head counts are read from the projections' outputs (tensor-parallel shards run
    as they are).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        layer_idx: int,
        *,
        rope_style: RopeStyle = "interleaved",
        causal: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.layer_idx = num_heads, num_kv_heads, layer_idx
        self.head_dim = hidden_size // num_heads
        self.rope_style, self.is_causal = rope_style, causal
        self.logits_hook: LogitsHook | None = None
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)

    def project(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project and rotate: q (B, H_q, T, d) with H_q = q_proj's heads, k and v (B, H_kv, T, d)."""
        batch, q_len, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        k = self.k_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        v = self.v_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        cos, sin = position_embeddings[0].unsqueeze(2), position_embeddings[1].unsqueeze(2)
        q = apply_rotary(q, cos, sin, self.rope_style)
        k = apply_rotary(k, cos, sin, self.rope_style)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool,
        backend: str,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Softmax attention over the given heads, (B, H, T, d) and the map or None: the materialized reference
        for maps, logits hooks and ``backend="reference"``, PyTorch's fused SDPA otherwise."""
        causal = self.is_causal and attention_mask is None
        if output_attentions or self.logits_hook is not None or backend == "reference":
            hook = None if self.logits_hook is None else partial(self.logits_hook, self)
            out, probs = softmax_attention_reference(
                q, k, v, causal=causal, attn_mask=attention_mask, logits_hook=hook
            )
            return out, probs if output_attentions else None
        return softmax_attention(q, k, v, causal=causal, attn_mask=attention_mask), None

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        backend: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, T, d_model) -> (B, T, d_model), and the map (B, H, T, S) or None; ``backend``
        "reference" materializes the map, any other takes SDPA."""
        batch, q_len, _ = hidden_states.shape
        q, k, v = self.project(hidden_states, position_embeddings)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        out, probs = self.attend(q, k, v, attention_mask, output_attentions, backend)
        return self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1)), probs
