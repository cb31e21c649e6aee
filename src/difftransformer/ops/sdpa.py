"""Differential attention on PyTorch's fused SDPA kernels.

Stock kernels want V as wide as Q and K, so V (width 2d) is split into its two d-wide halves and each half
takes one SDPA call over all 2h component maps: twice the matched baseline's attention work (docs/performance.md), but
no (T, S) map is ever materialized and every call stays on the fused kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from difftransformer.ops.common import build_attend_mask, check_diff_inputs


def diff_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Same contract as :func:`diff_attention_reference`, without maps: returns (B, h, T, 2d)."""
    batch, heads, kv_heads, q_len, kv_len, head_dim = check_diff_inputs(q, k, v, lambda_full)
    # Component maps as 2h ordinary heads, first all Q1 then all Q2 (and K1s then K2s): SDPA's GQA rule
    # (query head j reads KV head j // n_rep) then pairs Q1 of head i with K1 of its group, Q2 with K2.
    q_maps = torch.cat([q[..., :head_dim], q[..., head_dim:]], dim=1)
    k_maps = torch.cat([k[..., :head_dim], k[..., head_dim:]], dim=1)
    use_is_causal = causal and attn_mask is None and q_len == kv_len
    mask = None
    if not use_is_causal:
        mask = build_attend_mask(batch, q_len, kv_len, causal=causal, attn_mask=attn_mask, device=q.device)

    def attend(v_half: torch.Tensor) -> torch.Tensor:
        # K1 and K2 of a group read the same V.
        return F.scaled_dot_product_attention(
            q_maps,
            k_maps,
            torch.cat([v_half, v_half], dim=1),
            attn_mask=mask,
            is_causal=use_is_causal,
            scale=scale,
            enable_gqa=heads != kv_heads,
        )

    out = torch.cat([attend(v[..., :head_dim]), attend(v[..., head_dim:])], dim=-1)  # (B, 2h, T, 2d)
    if isinstance(lambda_full, torch.Tensor):
        lambda_full = lambda_full.to(out.dtype)
    return out[:, :heads] - lambda_full * out[:, heads:]
