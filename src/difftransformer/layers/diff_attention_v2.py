"""DIFF V2 attention (the authors' 2026 revision, docs/architecture.md): 2h query heads over the baseline's K/V,
paired by a per-token sigmoid lambda."""

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
    ) -> None:
        super().__init__(
            hidden_size, num_heads, num_kv_heads, layer_idx, rope_style=rope_style, causal=causal
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
        backend: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...] | None]:
        """hidden_states (B, T, d_model) -> (B, T, d_model), and the combined map (B, h, T, S) or None;
        with ``output_component_maps``, (combined, A_{2i}, A_{2i+1}) each (B, h, T, S). Returned maps are the
        ones the output is computed from (so gradients reach them)."""
        batch, q_len, _ = hidden_states.shape
        q, k, v = self.project(hidden_states, position_embeddings)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        lambdas = self.lambda_proj(hidden_states).transpose(1, 2).unsqueeze(-1)  # (B, h, T, 1)
        gate = torch.sigmoid(lambdas.to(torch.promote_types(lambdas.dtype, torch.float32)))
        if output_attentions or output_component_maps:
            _, probs = self.attend(q, k, v, attention_mask, True, backend)
            first, second = probs.unflatten(1, (-1, 2)).unbind(2)
            combined = first - gate.to(probs.dtype) * second
            groups = combined.shape[1] // v.shape[1]  # the pair's GQA group: head i reads KV head i // groups
            out = (combined @ v.to(combined.dtype).repeat_interleave(groups, dim=1)).to(q.dtype)
        else:
            out, _ = self.attend(q, k, v, attention_mask, False, backend)
            pairs = out.unflatten(1, (-1, 2))
            out = pairs[:, :, 0] - gate.to(out.dtype) * pairs[:, :, 1]
        out = self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))
        if not (output_attentions or output_component_maps):
            return out, None
        return out, (combined, first, second) if output_component_maps else combined
