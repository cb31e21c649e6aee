"""Standard softmax attention's float64-exact reference: the eager attention of the matched baseline and of DIFF V2
(which transformers' attention functions are tested against), and the analysis path of logit hooks."""

from __future__ import annotations

from collections.abc import Callable

import torch

from difftransformer.ops.common import build_attend_mask
from difftransformer.ops.reference import masked_softmax


def check_softmax_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Validate (B, H, T, d), (B, H_kv, S, d), (B, H_kv, S, d_v); return (batch, heads, kv_heads, T, S)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4-D (batch, heads, seq, dim); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    batch, heads, q_len, _ = q.shape
    if k.shape[0] != batch or v.shape[0] != batch or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must be (batch={batch}, H_kv, S, {q.shape[-1]}); got {tuple(k.shape)}")
    if tuple(v.shape[1:3]) != tuple(k.shape[1:3]):
        raise ValueError(f"v must have k's heads and length {tuple(k.shape[1:3])}; got {tuple(v.shape)}")
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of KV heads ({kv_heads})")
    if q_len > kv_len:
        raise ValueError(f"query length ({q_len}) cannot exceed key length ({kv_len})")
    return batch, heads, kv_heads, q_len, kv_len


def softmax_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    logits_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialized ``softmax(Q K^T s) V``; returns the output (B, H, T, d_v) and the map (B, H, T, S).

    Computed in float32 (float64 for float64 inputs). ``logits_hook`` sees the scaled logits (B, H, T, S)
    before masking and its result replaces them.
    """
    batch, heads, kv_heads, q_len, kv_len = check_softmax_inputs(q, k, v)
    n_rep = heads // kv_heads
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    compute_dtype = torch.promote_types(q.dtype, torch.float32)
    mask = build_attend_mask(batch, q_len, kv_len, causal=causal, attn_mask=attn_mask, device=q.device)
    keys = k.to(compute_dtype).repeat_interleave(n_rep, dim=1)
    logits = (q.to(compute_dtype) @ keys.transpose(-1, -2)) * scale
    if logits_hook is not None:
        logits = logits_hook(logits)
    probs = masked_softmax(logits, mask)
    out = probs @ v.to(compute_dtype).repeat_interleave(n_rep, dim=1)
    return out.to(q.dtype), probs
