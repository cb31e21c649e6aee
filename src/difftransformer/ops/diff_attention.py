"""One entry point for differential attention, dispatching to a backend."""

from __future__ import annotations

from typing import Literal

import torch

from difftransformer.ops.blocked import diff_attention_blocked
from difftransformer.ops.decode import diff_attention_decode
from difftransformer.ops.flex import diff_attention_flex
from difftransformer.ops.fused_cpu import diff_attention_fused_cpu, fused_cpu_available
from difftransformer.ops.reference import diff_attention_reference
from difftransformer.ops.sdpa import diff_attention_sdpa

Backend = Literal["auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex"]
BACKENDS: tuple[str, ...] = ("auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex")

# Thresholds of backend="auto", measured with `difftransformer bench` (docs/performance.md).
DECODE_MAX_QUERIES = 16  # up to this many queries, reading K and V once beats every fused kernel
BLOCKED_MAX_KEYS_CPU = 512  # on CPU the blocked path beats two SDPA calls up to here (measured at 512)


def choose_backend(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None = None) -> str:
    """The backend ``"auto"`` runs for q (B, h, T, 2d) and k (B, h_kv, S, 2d), by device, dtype and shape.

    - T <= 16 queries (decode, short blocks): "decode", which reads the cache once, as the baseline's step.
    - CPU float32 without a mask (causal or full), outside ``torch.compile``, where the C++ kernel builds:
      "fused_cpu", both maps streamed in one pass (the baseline's backward work, no copies).
    - other CPU float32/float64 with S <= 512 keys: "blocked", the baseline's FLOPs, maps one query block at a time.
    - otherwise "sdpa": stock fused kernels (flash on GPU; on CPU the fused kernel wins for long keys
      even at twice the work, because the blocked path's maps leave the cache).
    """
    q_len, kv_len = q.shape[-2], k.shape[-2]
    if q_len <= DECODE_MAX_QUERIES:
        return "decode"
    on_cpu = q.device.type == "cpu"
    if (
        on_cpu
        and q.dtype == torch.float32
        and attn_mask is None
        and not torch.compiler.is_compiling()
        and fused_cpu_available()
    ):
        return "fused_cpu"
    if on_cpu and q.dtype in (torch.float32, torch.float64) and kv_len <= BLOCKED_MAX_KEYS_CPU:
        return "blocked"
    return "sdpa"


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
        backend: "reference" (materialized maps, exact), "sdpa" (two fused SDPA calls over V's halves),
            "blocked" (the baseline's FLOPs, maps one query block at a time), "decode" (few queries: K and V
            read once), "fused_cpu" (C++ streaming kernel, CPU float32, no attn_mask), "flex" (compiled
            FlexAttention, one call with the 2d-wide V; inference only on the CPU), or "auto"
            (:func:`choose_backend`, which never picks "flex": it is not measured ahead of the others).

    Returns:
        (B, h, T, 2d): head i's output ``(A1 - lambda A2) V_g`` before the per-head norm.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if backend == "auto":
        backend = choose_backend(q, k, attn_mask)
    kwargs = dict(causal=causal, attn_mask=attn_mask, scale=scale)
    if backend == "reference":
        return diff_attention_reference(q, k, v, lambda_full, **kwargs)[0]
    if backend == "blocked":
        return diff_attention_blocked(q, k, v, lambda_full, **kwargs)
    if backend == "decode":
        return diff_attention_decode(q, k, v, lambda_full, **kwargs)
    if backend == "flex":
        return diff_attention_flex(q, k, v, lambda_full, **kwargs)
    if backend == "fused_cpu":
        if attn_mask is not None:
            raise ValueError("backend 'fused_cpu' takes no attn_mask (causal or full only); got a mask")
        return diff_attention_fused_cpu(q, k, v, lambda_full, causal=causal, scale=scale)
    return diff_attention_sdpa(q, k, v, lambda_full, **kwargs)
