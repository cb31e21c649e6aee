"""Shape checks and mask construction shared by every differential-attention backend.

Layout ("paired": the authors' adjacent sub-heads, docs/architecture.md "Head layout", viewed two at a time):
q (B, h, T, 2d) with Q1 in ``[..., :d]`` and Q2 in ``[..., d:]``; k (B, h_kv, S, 2d) likewise with K1 | K2;
v (B, h_kv, S, 2d). Head i reads KV group i // (h / h_kv). q, k and v are plain views of the projections'
outputs, and a KV cache stores k and v with the same head count and width, as for a standard attention.

lambda, the second map's weight, is the layer's scalar (a float, or a 0-d tensor that keeps its gradient), or one a
head and query: a (B or 1, h, T, 1) tensor (the per-token lambda of layers/parts.py), which every PyTorch backend
takes and the C++ kernels and the blocked path do not (:func:`per_token`).
"""

from __future__ import annotations

import torch


def per_token(lambda_full: torch.Tensor | float) -> bool:
    """Whether lambda is one a head and query (a tensor with dims), not the layer's scalar."""
    return isinstance(lambda_full, torch.Tensor) and lambda_full.dim() > 0


def check_diff_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lambda_full: torch.Tensor | float = 0.0
) -> tuple[int, int, int, int, int, int]:
    """Validate the paired layout (and a per-token ``lambda_full``'s shape) and return
    ``(batch, heads, kv_heads, q_len, kv_len, d)``."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4-D (batch, heads, seq, 2d); got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    batch, heads, q_len, width = q.shape
    if width % 2:
        raise ValueError(f"q's last dim must be 2d (an even number); got {width}")
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q {batch}, k {k.shape[0]}, v {v.shape[0]}")
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if k.shape[-1] != width:
        raise ValueError(f"k must be (batch, h_kv, kv_len, 2d={width}); got {tuple(k.shape)}")
    if tuple(v.shape[1:]) != (kv_heads, kv_len, width):
        raise ValueError(f"v must be (batch, {kv_heads}, {kv_len}, {width}) like k; got {tuple(v.shape)}")
    if heads % kv_heads:
        raise ValueError(f"differential heads ({heads}) must be a multiple of KV heads ({kv_heads})")
    if q_len > kv_len:
        raise ValueError(f"query length ({q_len}) cannot exceed key length ({kv_len})")
    if per_token(lambda_full) and (
        lambda_full.dim() != 4
        or lambda_full.shape[0] not in (1, batch)
        or lambda_full.shape[1:] != (heads, q_len, 1)
    ):
        raise ValueError(
            f"a per-token lambda must be ({batch} or 1, {heads}, {q_len}, 1); got {tuple(lambda_full.shape)}"
        )
    return batch, heads, kv_heads, q_len, kv_len, width // 2


def additive_to_bool(attn_mask: torch.Tensor) -> torch.Tensor:
    """An additive float mask (0 = attend, -inf or the dtype's min = masked) as a bool mask (True = attend).

    Other values would be a bias, which these operators do not take: refused rather than misread where the check
    costs nothing (a CPU mask, outside ``torch.compile``); on an accelerator reading the answer back would stall the
    device at every call, so there the mask is taken as given.
    """
    masked = attn_mask <= torch.finfo(attn_mask.dtype).min / 2
    if attn_mask.is_cpu and not torch.compiler.is_compiling() and not bool(((attn_mask == 0) | masked).all()):
        raise ValueError(
            "an additive attn_mask may only hold 0 (attend) and -inf or the dtype's minimum (masked); "
            "got other values (a bias): pass a bool mask instead"
        )
    return ~masked


def build_attend_mask(
    batch: int,
    q_len: int,
    kv_len: int,
    *,
    causal: bool,
    attn_mask: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor | None:
    """Boolean mask (B or 1, 1, T, S), True where a query may attend, or None when every key is visible.

    Causal masking is aligned bottom-right: query t sits at absolute position ``S - T + t``, which is what a
    KV cache needs when ``T < S``. ``attn_mask`` is boolean (True = attend) or additive float
    (0 = attend, -inf = masked), of shape (B or 1, 1, T, S).
    """
    if attn_mask is None and (not causal or q_len == 1):
        return None  # a single query sits at the last position and sees every key
    mask = None
    if attn_mask is not None:
        expected = f"({batch} or 1, 1, {q_len}, {kv_len})"
        if (
            attn_mask.dim() != 4
            or attn_mask.shape[0] not in (1, batch)
            or attn_mask.shape[1] != 1
            or tuple(attn_mask.shape[-2:]) != (q_len, kv_len)
        ):
            raise ValueError(f"attn_mask must have shape {expected}; got {tuple(attn_mask.shape)}")
        mask = attn_mask if attn_mask.dtype == torch.bool else additive_to_bool(attn_mask)
    if causal:
        rows = torch.arange(q_len, device=device).unsqueeze(-1) + (kv_len - q_len)
        causal_mask = (torch.arange(kv_len, device=device) <= rows)[None, None]
        mask = causal_mask if mask is None else mask & causal_mask
    return mask
