"""The exact differential attention: both softmax maps materialized, in float32 or wider.

This is the definition every other backend is tested against, and the only path that can return maps or
expose the pre-softmax logits to a hook (analysis, outlier statistics, logit quantization).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from difftransformer.ops.common import build_attend_mask, check_diff_inputs


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim; rows with no visible key give zeros (as PyTorch's SDPA does), not NaN."""
    if mask is None:
        return torch.softmax(logits, dim=-1)
    # Rows without a visible key are computed unmasked and then zeroed, so their gradient is 0, not NaN.
    row_has_key = mask.any(-1, keepdim=True)
    probs = torch.softmax(logits.masked_fill(~(mask | ~row_has_key), float("-inf")), dim=-1)
    return probs * row_has_key


def diff_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    logits_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
    return_maps: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
    """Differential attention ``(softmax(Q1 K1^T s) - lambda softmax(Q2 K2^T s)) V`` per head.

    Args:
        q: (B, h, T, 2d), Q1 | Q2 of each head.
        k: (B, h_kv, S, 2d), K1 | K2 of each KV group; head i reads group i // (h / h_kv).
        v: (B, h_kv, S, 2d).
        lambda_full: the layer's scalar lambda (a 0-d tensor keeps the gradient), or per token (B or 1, h, T, 1).
        causal: mask keys after each query, aligned bottom-right when T < S.
        attn_mask: bool (True = attend) or additive float mask of shape (B or 1, 1, T, S).
        scale: logit scale, default 1 / sqrt(d).
        logits_hook: called on the scaled logits (B, 2h, T, S) (component map 2i = Q1 K1 of head i,
            2i+1 = Q2 K2) before masking; its result replaces them.
        return_maps: also return (combined, map1, map2), each (B, h, T, S).

    Returns:
        (B, h, T, 2d) in q's dtype, and the maps or None. Maps are computed in float32, or float64 for
        float64 inputs.
    """
    batch, heads, kv_heads, q_len, kv_len, head_dim = check_diff_inputs(q, k, v, lambda_full)
    n_rep = heads // kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    compute_dtype = torch.promote_types(q.dtype, torch.float32)
    mask = build_attend_mask(batch, q_len, kv_len, causal=causal, attn_mask=attn_mask, device=q.device)

    q_pairs = q.to(compute_dtype).unflatten(-1, (2, head_dim))  # (B, h, T, 2, d)
    k_pairs = k.to(compute_dtype).unflatten(-1, (2, head_dim)).repeat_interleave(n_rep, dim=1)
    logits = torch.einsum("bhtcd,bhscd->bhcts", q_pairs, k_pairs) * scale  # (B, h, 2, T, S)
    if logits_hook is not None:
        logits = logits_hook(logits.flatten(1, 2)).unflatten(1, (heads, 2))
    probs = masked_softmax(logits, None if mask is None else mask.unsqueeze(1))
    map1, map2 = probs.unbind(2)
    if isinstance(lambda_full, torch.Tensor):
        lambda_full = lambda_full.to(compute_dtype)
    combined = map1 - lambda_full * map2
    out = combined @ v.to(compute_dtype).repeat_interleave(n_rep, dim=1)
    return out.to(q.dtype), (combined, map1, map2) if return_maps else None
