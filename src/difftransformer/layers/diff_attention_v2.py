"""DIFF V2 attention (SPEC §3): 2h query heads over the baseline's K/V, paired by a per-token sigmoid lambda."""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache

from difftransformer.layers.rotary import RopeStyle
from difftransformer.layers.softmax_attention import SoftmaxAttention


class DiffAttentionV2(SoftmaxAttention):
    """Head i's output is ``attn_{2i} - sigmoid(lambda_i(x)) * attn_{2i+1}``.

    k_proj and v_proj are the baseline's (h_kv heads of width d = hidden_size / h); q_proj yields 2h heads;
    ``lambda_proj`` (d_model -> h, no bias) gives lambda per token and head. Query heads 2i and 2i+1 always fall
    in the same GQA group (2h / h_kv is even), so both maps read the same K and V. No per-head norm and no
    lambda_init. Extra parameters over the baseline: q_proj's h*d*d_model more rows plus lambda_proj's
    h*d_model, i.e. d_model * h * (d + 1) per layer.
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
        backend: str = "auto",
    ) -> None:
        super().__init__(
            hidden_size,
            num_heads,
            num_kv_heads,
            layer_idx,
            rope_style=rope_style,
            causal=causal,
            backend=backend,
        )
        self.q_proj = nn.Linear(hidden_size, 2 * num_heads * self.head_dim, bias=False)
        self.lambda_proj = nn.Linear(hidden_size, num_heads, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        output_component_maps: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...] | None]:
        """hidden_states (B, T, d_model) -> (B, T, d_model), and the combined map (B, h, T, S) or None;
        with ``output_component_maps``, (combined, A_{2i}, A_{2i+1}) each (B, h, T, S)."""
        batch, q_len, _ = hidden_states.shape
        q, k, v = self.project(hidden_states, position_embeddings, 2 * self.num_heads)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        out, probs = self.attend(q, k, v, attention_mask, output_attentions or output_component_maps)
        lambdas = self.lambda_proj(hidden_states).transpose(1, 2).unsqueeze(-1)  # (B, h, T, 1)
        gate = torch.sigmoid(lambdas.to(torch.promote_types(lambdas.dtype, torch.float32)))
        pairs = out.unflatten(1, (self.num_heads, 2))
        out = pairs[:, :, 0] - gate.to(out.dtype) * pairs[:, :, 1]
        out = self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))
        if probs is None:
            return out, None
        first, second = probs.unflatten(1, (self.num_heads, 2)).unbind(2)
        combined = first - gate.to(probs.dtype) * second
        return out, (combined, first, second) if output_component_maps else combined
