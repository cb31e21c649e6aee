"""Differential attention for a few queries against a long KV cache, in one fused call reading K and V once.

A decode step is bound by reading the cache, not by arithmetic. Each query sub-head is zero-padded to width
2d (Q1 | 0 for map 1, 0 | Q2 for map 2), so both maps come from ONE SDPA call against the cached k and v as
stored (B, h_kv, S, 2d): no half of k is sliced, nothing is copied, and V is as wide as Q and K, which keeps
the fused kernel. The 2h outputs (A_j V, width 2d) are then combined as A1 V - lambda A2 V. The cache is read
as the matched baseline's step reads its own (same bytes, docs/performance.md); the doubled multiply-adds on the
query side are not what a step waits for. Differentiable (through SDPA), but meant for short query blocks.

Generation on CPU in float32 runs the C++ decode kernel instead (:mod:`difftransformer.ops.fused_cpu`, the
same single read of K and V in C++); :func:`difftransformer.ops.choose_backend` decides which.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from difftransformer.ops.common import build_attend_mask, check_diff_inputs, per_token


def _build_selector(dtype: torch.dtype, device: torch.device, scale: float) -> torch.Tensor:
    # select[c, c'] = scale if c == c' else 0: map c of each query keeps only its own half (and the scale).
    return torch.eye(2, dtype=dtype, device=device).mul_(scale).view(2, 1, 1, 2, 1)


@functools.lru_cache(maxsize=16)
def _cached_selector(dtype: torch.dtype, device: torch.device, scale: float) -> torch.Tensor:
    with torch.inference_mode(False):  # a normal tensor, so a later autograd pass may save it
        return _build_selector(dtype, device, scale)


def _selector(dtype: torch.dtype, device: torch.device, scale: float) -> torch.Tensor:
    # Cached outside torch.compile: a one-token step would otherwise build it twice per layer.
    if torch.compiler.is_compiling():
        return _build_selector(dtype, device, scale)
    return _cached_selector(dtype, device, scale)


def diff_attention_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Same contract as :func:`~difftransformer.ops.diff_attention_reference`, returns (B, h, T, 2d).

    Args:
        q: (B, h, T, 2d) with T small (a decode step or a short block of queries).
        k, v: (B, h_kv, S, 2d), typically a KV cache, read in place.
        lambda_full: the scalar lambda, or per token (B or 1, h, T, 1).
        causal, attn_mask, scale: as for the reference (causal aligned bottom-right).
    """
    batch, heads, kv_heads, q_len, kv_len, head_dim = check_diff_inputs(q, k, v, lambda_full)
    n_rep = heads // kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    select = _selector(q.dtype, q.device, scale)
    # Query heads ordered (group, map, rep): SDPA's GQA rule sends all 2 n_rep of them to their group's k, v.
    q_pad = q.reshape(batch, kv_heads, 1, n_rep, q_len, 2, head_dim) * select  # (B, g, 2, r, T, 2, d)
    mask = None
    if attn_mask is not None or (causal and q_len > 1):  # a single query sees every cached key
        mask = build_attend_mask(batch, q_len, kv_len, causal=causal, attn_mask=attn_mask, device=q.device)
    out = F.scaled_dot_product_attention(
        q_pad.reshape(batch, 2 * heads, q_len, 2 * head_dim), k, v, attn_mask=mask, scale=1.0, enable_gqa=True
    ).reshape(batch, kv_heads, 2, n_rep, q_len, 2 * head_dim)  # SDPA may return any layout
    if isinstance(lambda_full, torch.Tensor):
        lambda_full = lambda_full.to(out.dtype)
    if per_token(lambda_full):  # (B, h, T, 1) as the output's (B, h_kv, n_rep, T, 1)
        lambda_full = lambda_full.unflatten(1, (kv_heads, n_rep))
    return (out[:, :, 0] - lambda_full * out[:, :, 1]).reshape(batch, heads, q_len, 2 * head_dim)
