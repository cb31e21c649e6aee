"""One entry point for differential attention, dispatching to a backend."""

from __future__ import annotations

from typing import Literal

import torch

from difftransformer.ops.reference import diff_attention_reference
from difftransformer.ops.sdpa import diff_attention_sdpa

Backend = Literal["auto", "reference", "sdpa"]
BACKENDS: tuple[str, ...] = ("auto", "reference", "sdpa")


def diff_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Differential attention over the SPEC layout.

    Args:
        q: (B, h, T, 2d), Q1 | Q2 of each head (the paired layout, see ops.common).
        k: (B, h_kv, S, 2d), K1 | K2 of each KV group.
        v: (B, h_kv, S, 2d).
        lambda_full: scalar lambda of the layer.
        causal: causal mask, aligned bottom-right when T < S (KV cache).
        attn_mask: bool (True = attend) or additive float, broadcastable to (B, 1, T, S).
        scale: logit scale, default 1 / sqrt(d).
        backend: "reference" (materialized maps, exact), "sdpa" (fused kernels), or "auto".

    Returns:
        (B, h, T, 2d): head i's output ``(A1 - lambda A2) V_g`` before the per-head norm.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if backend == "reference":
        return diff_attention_reference(
            q, k, v, lambda_full, causal=causal, attn_mask=attn_mask, scale=scale
        )[0]
    return diff_attention_sdpa(q, k, v, lambda_full, causal=causal, attn_mask=attn_mask, scale=scale)
