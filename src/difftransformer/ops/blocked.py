"""Differential attention at the matched baseline's FLOPs: maps materialized one block of queries at a time.

For each block of queries the two softmax maps are formed in full (that block only), combined into
``A1 - lambda A2`` and multiplied by V once, so the forward pass does the baseline's QK^T and AV work
(docs/performance.md) and never holds more than one (block, S) slice of the maps. Nothing but q, k and v is saved: the
backward pass recomputes each block's maps and needs exactly the baseline's backward work, because
``rowsum(dA_j * A_j)`` (the softmax-gradient correction) comes from the block's own maps.

With causal masking, keys after a block's last query are never touched (bottom-right aligned, as for a KV
cache), which halves the work of a full causal pass like a flash kernel does. Every block is a handful of
large ATen calls, so the path pays off while a block's maps stay in cache (short keys on CPU); past that,
``backend="auto"`` prefers the fused SDPA kernels (see :func:`difftransformer.ops.choose_backend`).
"""

from __future__ import annotations

import torch

from difftransformer.ops.common import build_attend_mask, check_diff_inputs

# Queries per block (times n_rep with GQA). Measured on 2 CPU cores (docs/performance.md).
DEFAULT_BLOCK_QUERIES = 64


def _block_size(n_rep: int, block_queries: int) -> int:
    return max(1, block_queries // n_rep)


def _key_end(t1: int, q_len: int, kv_len: int, causal: bool) -> int:
    """One past the last key that queries [.., t1) may see: bottom-right causal alignment."""
    return min(kv_len, t1 + kv_len - q_len) if causal else kv_len


def _block_mask(
    mask: torch.Tensor | None, causal: bool, t0: int, t1: int, q_len: int, s_end: int, device: torch.device
) -> torch.Tensor | None:
    """(B|1, 1, 1, 1, c, s_end) bool, True = attend, for queries [t0, t1) and keys [0, s_end)."""
    if mask is not None:
        block = mask[..., t0:t1, :s_end]
    elif causal:
        rows = torch.arange(t0, t1, device=device).unsqueeze(-1)
        # keys j visible to query t: j <= t + (S - T); with s_end = t1 + S - T this is j - s_end <= t - t1.
        block = ((torch.arange(s_end, device=device) - s_end) <= (rows - t1))[None, None]
    else:
        return None
    return block.unsqueeze(2).unsqueeze(2)


def _block_softmax(logits: torch.Tensor, mask: torch.Tensor | None, row_guard: bool) -> torch.Tensor:
    """Both maps of one query block: logits (B, h_kv, 2, n_rep, c, s), masked in place, softmaxed."""
    if mask is None:
        return torch.softmax(logits, dim=-1)
    if not row_guard:  # causal only: every query sees key 0, no row is empty
        return torch.softmax(logits.masked_fill_(~mask, float("-inf")), dim=-1)
    # A row with no visible key softmaxes unmasked and is then zeroed (0 output, 0 gradient, no NaN).
    has_key = mask.any(-1, keepdim=True)
    return torch.softmax(logits.masked_fill_(~(mask | ~has_key), float("-inf")), dim=-1).mul_(has_key)


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, dtype: torch.dtype):
    """Scaled q as (B, h_kv, 2, n_rep, T, d); k as contiguous (B, h_kv, 2, 1, S, d); v (B, h_kv, S, 2d)."""
    batch, heads, q_len, width = q.shape
    kv_heads, head_dim = k.shape[1], width // 2
    q6 = q.to(dtype).view(batch, kv_heads, heads // kv_heads, q_len, 2, head_dim).permute(0, 1, 4, 2, 3, 5)
    q6 = q6 * scale
    k5 = k.to(dtype).unflatten(-1, (2, head_dim)).transpose(2, 3).contiguous().unsqueeze(3)
    return q6, k5, v.to(dtype).contiguous()


class _BlockedDiffAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lambda_full, mask, causal, scale, block_queries):
        batch, heads, kv_heads, q_len, kv_len, head_dim = check_diff_inputs(q, k, v)
        n_rep = heads // kv_heads
        dtype = torch.promote_types(q.dtype, torch.float32)
        q6, k5, v4 = _prepare(q, k, v, scale, dtype)
        lam = lambda_full.detach().to(dtype)
        row_guard = mask is not None
        block = _block_size(n_rep, block_queries)
        # (B, T, h_kv, n_rep, 2d): the layout the output projection reads, so no copy after the op.
        out = torch.empty(batch, q_len, kv_heads, n_rep, 2 * head_dim, dtype=dtype, device=q.device)
        for t0 in range(0, q_len, block):
            t1 = min(q_len, t0 + block)
            s_end = _key_end(t1, q_len, kv_len, causal)
            blk_mask = _block_mask(mask, causal, t0, t1, q_len, s_end, q.device)
            logits = q6[..., t0:t1, :] @ k5[..., :s_end, :].transpose(-1, -2)  # (B, g, 2, r, c, s)
            probs = _block_softmax(logits, blk_mask, row_guard)
            combined = torch.addcmul(probs[:, :, 0], probs[:, :, 1], -lam)  # (B, g, r, c, s)
            out[:, t0:t1] = (combined @ v4[:, :, None, :s_end]).permute(0, 3, 1, 2, 4)
        ctx.save_for_backward(q, k, v, lambda_full)
        ctx.setup = (mask, causal, scale, block_queries)
        return out.view(batch, q_len, heads, 2 * head_dim).transpose(1, 2).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, lambda_full = ctx.saved_tensors
        mask, causal, scale, block_queries = ctx.setup
        batch, heads, kv_heads, q_len, kv_len, head_dim = check_diff_inputs(q, k, v)
        n_rep = heads // kv_heads
        dtype = torch.promote_types(q.dtype, torch.float32)
        q6, k5, v4 = _prepare(q, k, v, scale, dtype)
        lam = lambda_full.detach().to(dtype)
        row_guard = mask is not None
        # grad_out (B, h, T, 2d) -> (B, h_kv, n_rep, T, 2d), a view whenever possible.
        d_out = grad_out.to(dtype).reshape(batch, kv_heads, n_rep, q_len, 2 * head_dim)
        dq6 = torch.empty(batch, q_len, kv_heads, n_rep, 2, head_dim, dtype=dtype, device=q.device)
        dk5 = torch.zeros_like(k5)
        dv4 = torch.zeros_like(v4)
        d_lam = torch.zeros((), dtype=dtype, device=q.device)
        sign = torch.stack([torch.ones_like(lam), -lam]).view(1, 1, 2, 1, 1, 1)  # (.., map, r, c, d)
        block = _block_size(n_rep, block_queries)
        for t0 in range(0, q_len, block):
            t1 = min(q_len, t0 + block)
            s_end = _key_end(t1, q_len, kv_len, causal)
            blk_mask = _block_mask(mask, causal, t0, t1, q_len, s_end, q.device)
            q_blk = q6[..., t0:t1, :]
            k_blk = k5[..., :s_end, :]
            probs = _block_softmax(q_blk @ k_blk.transpose(-1, -2), blk_mask, row_guard)  # (B, g, 2, r, c, s)
            combined = torch.addcmul(probs[:, :, 0], probs[:, :, 1], -lam)  # (B, g, r, c, s)
            do_blk = d_out[..., t0:t1, :]  # (B, g, r, c, 2d)
            dv4[:, :, :s_end] += (combined.transpose(-1, -2) @ do_blk).sum(2)
            d_comb = do_blk @ v4[:, :, None, :s_end].transpose(-1, -2)  # (B, g, r, c, s)
            # dA_1 = dC and dA_2 = -lambda dC; the softmax correction rowsum(dA_j * A_j) per map.
            row_dot = (probs * d_comb.unsqueeze(2)).sum(-1, keepdim=True)  # (B, g, 2, r, c, 1): A_j . dC
            d_lam -= row_dot[:, :, 1].sum()
            # Map 2's factor -lambda is applied after the matmuls, on the narrow (.., d) results.
            d_logits = probs.mul_(d_comb.unsqueeze(2) - row_dot)  # (B, g, 2, r, c, s), without -lambda
            dq6[:, t0:t1] = ((d_logits @ k_blk) * sign).permute(0, 4, 1, 3, 2, 5)
            dk5[..., :s_end, :] += (d_logits.transpose(-1, -2) @ q_blk).sum(3, keepdim=True) * sign
        grad_q = dq6.mul_(scale).view(batch, q_len, heads, 2 * head_dim).transpose(1, 2).to(q.dtype)
        grad_k = dk5.squeeze(3).transpose(2, 3).flatten(-2).to(k.dtype)  # q6 carried the scale already
        grad_lam = d_lam.to(lambda_full.dtype) if ctx.needs_input_grad[3] else None
        return grad_q, grad_k, dv4.to(v.dtype), grad_lam, None, None, None, None


def diff_attention_blocked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    block_queries: int = DEFAULT_BLOCK_QUERIES,
) -> torch.Tensor:
    """Same contract as :func:`~difftransformer.ops.diff_attention_reference`, at the baseline's FLOPs.

    Args:
        q: (B, h, T, 2d); k, v: (B, h_kv, S, 2d); lambda_full: scalar (a 0-d tensor gets a gradient).
        causal, attn_mask, scale: as for the reference.
        block_queries: queries per block (fewer with GQA: n_rep heads share a block's keys).

    Returns:
        (B, h, T, 2d) in q's dtype. Its memory is laid out as (B, T, h, 2d), so ``out.transpose(1, 2)``
        is contiguous and the output projection reads it without a copy.
    """
    batch, heads, kv_heads, q_len, kv_len, head_dim = check_diff_inputs(q, k, v)
    if not isinstance(block_queries, int) or block_queries < 1:
        raise ValueError(f"block_queries must be a positive integer; got {block_queries!r}")
    mask = None
    if attn_mask is not None:
        mask = build_attend_mask(batch, q_len, kv_len, causal=causal, attn_mask=attn_mask, device=q.device)
    if not isinstance(lambda_full, torch.Tensor):
        lambda_full = torch.tensor(
            float(lambda_full), dtype=torch.promote_types(q.dtype, torch.float32), device=q.device
        )
    scale = head_dim**-0.5 if scale is None else float(scale)
    return _BlockedDiffAttention.apply(q, k, v, lambda_full, mask, causal, scale, block_queries)
