"""Gated attention (Qiu et al., "Gated Attention for Large Language Models: Non-linearity, Sparsity, and
Attention-Sink-Free", NeurIPS 2025, arXiv 2505.06708): softmax attention whose output is multiplied, head by head
and element by element, by a sigmoid gate of the layer's input, before the output projection."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from difftransformer.layers.softmax_attention import SoftmaxAttention


class GatedAttention(SoftmaxAttention):
    """The baseline's attention with the paper's best gate: position G1 (the SDPA output, before o_proj), head-specific,
    elementwise, multiplicative, sigmoid (§2.2, Eq. 5: Y' = Y * sigmoid(X W_theta), X the normalised input of the
    layer):

        out = o_proj(concat_i(attn_i(x) * sigmoid(x W_gate_i))), W_gate_i d_model -> d.

    q_proj holds, head by head, the query (d rows) then the gate (d rows): the layout of transformers'
    ``Qwen3NextAttention``, whose q_proj "produces the query and the gate", so its weights load as they are. That
    module also normalises q and k per head and rotates a quarter of each head; this one keeps the matched baseline's
    queries and keys (full-width rotation, no norm), so that the gate is the only difference to the baseline.
    Extra parameters over the baseline: the gate's h * d * d_model rows of q_proj a layer.
    """

    q_blocks_per_head = 2

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, T, d_model) -> (B, T, d_model), and the softmax map (B, h, T, S) with
        ``output_attentions`` (the gate scales the heads' outputs, not the map)."""
        batch, q_len, _ = hidden_states.shape
        queries, gate = self.q_proj(hidden_states).view(batch, q_len, -1, 2 * self.head_dim).chunk(2, dim=-1)
        q, k, v = self.project(hidden_states, position_embeddings, queries)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        out, probs = self.attend(q, k, v, attention_mask, output_attentions, **kwargs)  # (B, T, h, d)
        gate = torch.sigmoid(gate.to(torch.promote_types(gate.dtype, torch.float32))).to(out.dtype)
        out = self.o_proj((out * gate).reshape(batch, q_len, -1))
        return out, probs if output_attentions else None
