"""Differential attention on FlexAttention, which (unlike SDPA) takes a V wider than Q and K.

The 2h component maps become 2h ordinary heads of width d (all Q1s, then all Q2s; K1s then K2s), each reading the
full 2d-wide V of its group, so ONE compiled kernel call gives A1 V and A2 V for every head: the baseline's QK^T
work and 2x its AV work (1.5x in all, docs/performance.md), no V split. Masks (causal aligned bottom-right,
padding) become a block mask, so fully masked tiles are skipped. On an accelerator the call is compiled with
``torch.compile`` (one compile per new shape, docs/performance.md); eager FlexAttention materializes the maps.

FlexAttention has no backward on the CPU in torch 2.13 (measured: NotImplementedError), so there this path
serves inference only and refuses inputs that require grad; on a GPU it trains as well. On the CPU the call also runs
uncompiled: torch 2.13's compiled CPU kernel, with the block mask built here, gave wrong outputs (NaN in some rows)
for causal inputs of 24, 40 and 56 queries and keys, while 32, 41, 48, 64 and 100 were exact
(tests/test_ops_fast.py); eager FlexAttention forms the maps, as the reference does, and is exact.
"""

from __future__ import annotations

import functools

import torch

from difftransformer.ops.common import check_diff_inputs


@functools.cache
def _flex_for(device_type: str):
    """FlexAttention compiled for an accelerator; on the CPU uncompiled (see the module's docstring)."""
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention if device_type == "cpu" else torch.compile(flex_attention)


def diff_attention_flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Same contract as :func:`~difftransformer.ops.diff_attention_reference`, without maps: (B, h, T, 2d).

    ``attn_mask`` is boolean (True = attend), shape (B or 1, 1, T, S), or a ``BlockMask`` over (T, S) shared by
    the heads (as transformers builds for ``attn_implementation="flex_attention"``; ``causal`` is then in it).
    Raises ValueError on the CPU when an input requires grad (no FlexAttention backward there).
    """
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    batch, heads, kv_heads, q_len, kv_len, head_dim = check_diff_inputs(q, k, v, lambda_full)
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError(
            "backend 'flex' has no backward on the CPU (FlexAttention, torch 2.13): run it under torch.no_grad() "
            "or use backend 'fused_cpu' / 'sdpa' for training"
        )
    if isinstance(attn_mask, BlockMask):
        if attn_mask.shape[-2:] != (q_len, kv_len) or attn_mask.shape[1] != 1:
            raise ValueError(
                f"a BlockMask for backend 'flex' must cover (1 head, {q_len} queries, {kv_len} keys); got "
                f"{tuple(attn_mask.shape)}"
            )
        return _flex_maps(q, k, v, lambda_full, attn_mask, scale, heads, kv_heads, head_dim)
    if attn_mask is not None and (
        attn_mask.dtype != torch.bool or attn_mask.dim() != 4 or attn_mask.shape[0] not in (1, batch)
    ):
        raise ValueError(
            f"backend 'flex' takes a bool attn_mask of shape ({batch} or 1, 1, {q_len}, {kv_len}); got "
            f"{attn_mask.dtype} {tuple(attn_mask.shape)}"
        )
    offset = kv_len - q_len
    padding = None if attn_mask is None else attn_mask.expand(batch, 1, q_len, kv_len)

    def keep(b, h, q_idx, kv_idx):
        visible = (q_idx + offset >= kv_idx) if causal else (q_idx >= 0)
        return visible if padding is None else visible & padding[b, 0, q_idx, kv_idx]

    block_mask = None
    if causal or padding is not None:
        block_mask = create_block_mask(
            keep, batch if padding is not None else None, None, q_len, kv_len, device=q.device
        )
    return _flex_maps(q, k, v, lambda_full, block_mask, scale, heads, kv_heads, head_dim)


def _flex_maps(
    q, k, v, lambda_full, block_mask, scale, heads: int, kv_heads: int, head_dim: int
) -> torch.Tensor:
    """One FlexAttention call over the 2h component maps, and A1 V - lambda A2 V."""
    q_maps = torch.cat([q[..., :head_dim], q[..., head_dim:]], dim=1)  # (B, 2h, T, d)
    k_maps = torch.cat([k[..., :head_dim], k[..., head_dim:]], dim=1)  # (B, 2h_kv, S, d)
    v_maps = torch.cat([v, v], dim=1)  # K1 and K2 of a group read the same V
    # GQA rule: map head j reads KV head j // (h / h_kv), so Q1 of head i meets K1 of its group, Q2 meets K2.
    out = _flex_for(q.device.type)(
        q_maps, k_maps, v_maps, block_mask=block_mask, scale=scale, enable_gqa=heads != kv_heads
    )  # (B, 2h, T, 2d)
    if isinstance(lambda_full, torch.Tensor):
        lambda_full = lambda_full.to(out.dtype)
    return out[:, :heads] - lambda_full * out[:, heads:]
