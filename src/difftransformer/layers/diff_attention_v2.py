"""DIFF V2 attention (the authors' 2026 revision, docs/architecture.md): 2h query heads over the baseline's K/V in
one standard attention call, paired by a per-token sigmoid lambda."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedConfig
from transformers.cache_utils import Cache

from difftransformer.layers.softmax_attention import SoftmaxAttention


class DiffAttentionV2(SoftmaxAttention):
    """Head i's output is ``attn_{2i} - sigmoid(lambda_i(x)) * attn_{2i+1}``.

    k_proj and v_proj are the baseline's (h_kv heads of width d = ``head_dim``); q_proj yields 2h heads, which go
    through the configured attention implementation as one ordinary GQA call (2h / h_kv query heads a KV head);
    ``lambda_proj`` (d_model -> h, no bias) gives lambda per token and head. Query heads 2i and 2i+1 always fall in
    the same GQA group (2h / h_kv is even), so both maps read the same K and V. No per-head norm and no lambda_init.
    Extra parameters over the baseline: q_proj's h*d*d_model more rows plus lambda_proj's h*d_model, i.e.
    d_model * h * (d + 1) per layer.
    """

    q_blocks_per_head = 2
    query_heads_per_head = 2

    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.lambda_proj = nn.Linear(config.hidden_size, config.num_attention_heads, bias=False)

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
        """hidden_states (B, T, d_model) -> (B, T, d_model), and the combined map (B, h, T, S) or None;
        with ``output_component_maps``, (combined, A_{2i}, A_{2i+1}) each (B, h, T, S). Returned maps are the
        ones the output is computed from (so gradients reach them)."""
        q, k, v = self.project(hidden_states, position_embeddings)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        maps = output_attentions or output_component_maps
        out, probs = self.attend(q, k, v, attention_mask, maps, **kwargs)  # (B, T, 2h, d)
        lambdas = self.lambda_proj(hidden_states)  # (B, T, h)
        gate = torch.sigmoid(lambdas.to(torch.promote_types(lambdas.dtype, torch.float32)))
        if maps:
            first, second = probs.unflatten(1, (-1, 2)).unbind(2)  # (B, h, T, S) each
            combined = first - gate.transpose(1, 2).unsqueeze(-1).to(probs.dtype) * second
            # the pair's GQA group: head i reads KV head i // (h / h_kv)
            values = v.to(combined.dtype).repeat_interleave(combined.shape[1] // v.shape[1], dim=1)
            out = (combined @ values).transpose(1, 2).to(q.dtype)  # (B, T, h, d)
        else:
            pairs = out.unflatten(2, (-1, 2))  # (B, T, h, 2, d)
            out = pairs[:, :, :, 0] - gate.unsqueeze(-1).to(out.dtype) * pairs[:, :, :, 1]
        out = self.o_proj(out.reshape(*hidden_states.shape[:-1], -1))
        if not maps:
            return out, None
        return out, (combined, first, second) if output_component_maps else combined
