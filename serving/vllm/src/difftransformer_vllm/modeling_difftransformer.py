# Written by difftransformer 0.1.0 from its sources (src/difftransformer: ops, layers, models), model code 83333dc14f04647c; change the package, not this file.
"""The Differential Transformer (DIFF V1, DIFF V2), the kinds compared with it (GDA, gated attention) and the
matched softmax Transformer as transformers models: every operator, layer and model class they run,
generated from the package's sources named below."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming, WeightTransform
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import can_return_tuple

from .configuration_difftransformer import FULL, LAMBDA_RENAMINGS, SLIDING, DiffTransformerConfig


# ---- difftransformer/ops/common.py -----------------------------------------------------------------------
# Shape checks and mask construction shared by every differential-attention backend.
#
# Layout ("paired": the authors' adjacent sub-heads, docs/architecture.md "Head layout", viewed two at a time):
# q (B, h, T, 2d) with Q1 in ``[..., :d]`` and Q2 in ``[..., d:]``; k (B, h_kv, S, 2d) likewise with K1 | K2;
# v (B, h_kv, S, 2d). Head i reads KV group i // (h / h_kv). q, k and v are plain views of the projections'
# outputs, and a KV cache stores k and v with the same head count and width, as for a standard attention.
#
# lambda, the second map's weight, is the layer's scalar (a float, or a 0-d tensor that keeps its gradient), or one a
# head and query: a (B or 1, h, T, 1) tensor (the per-token lambda of layers/parts.py), which every PyTorch backend
# takes and the C++ kernels and the blocked path do not (:func:`per_token`).
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


# ---- difftransformer/ops/decode.py -----------------------------------------------------------------------
# Differential attention for a few queries against a long KV cache, in one fused call reading K and V once.
#
# A decode step is bound by reading the cache, not by arithmetic. Each query sub-head is zero-padded to width
# 2d (Q1 | 0 for map 1, 0 | Q2 for map 2), so both maps come from ONE SDPA call against the cached k and v as
# stored (B, h_kv, S, 2d): no half of k is sliced, nothing is copied, and V is as wide as Q and K, which keeps
# the fused kernel. The 2h outputs (A_j V, width 2d) are then combined as A1 V - lambda A2 V. The cache is read
# as the matched baseline's step reads its own (same bytes, docs/performance.md); the doubled multiply-adds on the
# query side are not what a step waits for. Differentiable (through SDPA), but meant for short query blocks.
#
# Generation on CPU in float32 runs the C++ decode kernel instead (:mod:`difftransformer.ops.fused_cpu`, the
# same single read of K and V in C++); :func:`difftransformer.ops.choose_backend` decides which.
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


# ---- difftransformer/ops/flex.py -------------------------------------------------------------------------
# Differential attention on FlexAttention, which (unlike SDPA) takes a V wider than Q and K.
#
# The 2h component maps become 2h ordinary heads of width d (all Q1s, then all Q2s; K1s then K2s), each reading the
# full 2d-wide V of its group, so ONE compiled kernel call gives A1 V and A2 V for every head: the baseline's QK^T
# work and 2x its AV work (1.5x in all, docs/performance.md), no V split. Masks (causal aligned bottom-right,
# padding) become a block mask, so fully masked tiles are skipped. The call is compiled with ``torch.compile`` (one
# compile per new shape, docs/performance.md); eager FlexAttention would materialize the maps.
#
# FlexAttention has no backward on the CPU in torch 2.13 (measured: NotImplementedError), so there this path
# serves inference only and refuses inputs that require grad; on a GPU it trains as well.
@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


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
    """The compiled FlexAttention call over the 2h component maps, and A1 V - lambda A2 V."""
    q_maps = torch.cat([q[..., :head_dim], q[..., head_dim:]], dim=1)  # (B, 2h, T, d)
    k_maps = torch.cat([k[..., :head_dim], k[..., head_dim:]], dim=1)  # (B, 2h_kv, S, d)
    v_maps = torch.cat([v, v], dim=1)  # K1 and K2 of a group read the same V
    # GQA rule: map head j reads KV head j // (h / h_kv), so Q1 of head i meets K1 of its group, Q2 meets K2.
    out = _compiled_flex()(
        q_maps, k_maps, v_maps, block_mask=block_mask, scale=scale, enable_gqa=heads != kv_heads
    )  # (B, 2h, T, 2d)
    if isinstance(lambda_full, torch.Tensor):
        lambda_full = lambda_full.to(out.dtype)
    return out[:, :heads] - lambda_full * out[:, heads:]


# ---- difftransformer/ops/native.py -----------------------------------------------------------------------
# Where the operators find the package's C++ kernels for CPU float32 (:mod:`~difftransformer.ops.fused_cpu`).
#
# The operators (:func:`~difftransformer.ops.diff_attention`, :func:`~difftransformer.ops.rms_norm`,
# :func:`~difftransformer.ops.lambda_full`) are written in PyTorch and exact on their own; each asks
# :func:`cpu_kernels_for` whether a C++ kernel can take its inputs. The kernels' module is package-only: in the model
# code a saved folder carries (models/remote_code.py) ``cpp_kernels`` is None, and every operator takes its PyTorch
# path.
CppKernels = None  # package-only (models/remote_code.py): not in this file


cpp_kernels = None  # package-only (models/remote_code.py): not in this file


# Tensors the kernels read as they are: a subclass (FSDP2's DTensor, a fake tensor) has no storage of its own.
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def cpu_kernels_for(*tensors: torch.Tensor) -> CppKernels | None:
    """The C++ kernels if they can run on ``tensors``: all plain float32 CPU tensors, outside ``torch.compile`` (the
    kernels are opaque to it), and built; else None."""
    if cpp_kernels is None or torch.compiler.is_compiling():
        return None
    for tensor in tensors:
        if type(tensor) not in _PLAIN or not tensor.is_cpu or tensor.dtype != torch.float32:
            return None
    return cpp_kernels()


# ---- difftransformer/ops/reference.py --------------------------------------------------------------------
# The exact differential attention: both softmax maps materialized, in float32 or wider.
#
# This is the definition every other backend is tested against, and the only path that can return maps or
# expose the pre-softmax logits to a hook (analysis, outlier statistics, logit quantization).
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


# ---- difftransformer/ops/rotary.py -----------------------------------------------------------------------
# Rotary position embedding as an operator, in both pairings the Differential Transformer world uses.
#
# "interleaved" (the authors' code, GPT-J style) rotates dims (2j, 2j+1) by angle p * theta^(-2j/d);
# "half" (Llama, DiffLlama, NeoX style) rotates dims (j, j + d/2) by the same angle. The tables (cos, sin) come
# from :class:`difftransformer.layers.RotaryEmbedding`.
RopeStyle = Literal["interleaved", "half"]


ROPE_STYLES: tuple[str, ...] = ("interleaved", "half")


_COMPLEX_DTYPES = (torch.float32, torch.float64)  # have a complex counterpart for the fast path


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    """Rotate the last dim of ``x`` (width d); ``cos``/``sin`` broadcast against ``x[..., : d // 2]``. The result
    keeps x's dtype (under autocast, float32 tables would otherwise lift bf16 q and k above their v)."""
    if style == "interleaved":
        if x.dtype in _COMPLEX_DTYPES and cos.dtype == x.dtype and not torch.compiler.is_compiling():
            # Each interleaved pair is one complex number and the rotation one complex product: the same
            # multiply-adds in one kernel instead of seven (3-4x faster here, forward and backward).
            pairs = x.unflatten(-1, (-1, 2))
            if (
                pairs.stride(-1) == 1
                and pairs.storage_offset() % 2 == 0
                and all(stride % 2 == 0 for stride in pairs.stride()[:-1])
            ):
                rotated = torch.view_as_complex(pairs) * torch.complex(cos, sin)
                return torch.view_as_real(rotated).flatten(-2)
        x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).to(x.dtype)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).to(x.dtype)


class QueryRotary(NamedTuple):
    """The rotary embedding of queries given to the operator unrotated: ``cos`` and ``sin`` (B or 1, T, d/2), one
    row per query position, and the pairing. Each d-wide half of a paired-layout query (Q1 | Q2) rotates alone
    (:func:`rotate_queries`); the kernel fuses it where one can (the C++ decode step)."""

    cos: torch.Tensor
    sin: torch.Tensor
    style: RopeStyle


def rotate_queries(q: torch.Tensor, rotary: QueryRotary) -> torch.Tensor:
    """q (B, h, T, 2d) in the paired layout with Q1 and Q2 each rotated by ``rotary``, stored with heads merged
    ((B, T, h, 2d) memory) as the projection gives q, whatever path the rotation takes."""
    cos, sin = rotary.cos[:, :, None, None], rotary.sin[:, :, None, None]
    heads_merged = q.transpose(1, 2).unflatten(-1, (2, -1))
    return apply_rotary(heads_merged, cos, sin, rotary.style).flatten(-2).transpose(1, 2)


# ---- difftransformer/ops/sdpa.py -------------------------------------------------------------------------
# Differential attention on PyTorch's fused SDPA kernels.
#
# Stock kernels want V as wide as Q and K, so V (width 2d) is split into its two d-wide halves and each half
# takes one SDPA call over all 2h component maps: twice the matched baseline's attention work (docs/performance.md), but
# no (T, S) map is ever materialized and every call stays on the fused kernel.
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


# ---- difftransformer/ops/diff_attention.py ---------------------------------------------------------------
# One entry point for differential attention: the single place where a kernel is chosen.
#
# The rule (transformers' one ``ALL_ATTENTION_FUNCTIONS[...]`` lookup; flash-linear-attention's "ops have no hidden
# dispatch"): :func:`choose_backend` names the kernel from transformers' ``attn_implementation``, the requested
# backend and the inputs, and :func:`diff_attention` runs that one kernel. No kernel function chooses another. A layer
# makes one call, passing its queries' rotary embedding as an argument, which the C++ decode step fuses and the
# dispatcher applies before every other kernel. The C++ kernels and the blocked path are package-only
# (:mod:`difftransformer.ops.fused_cpu`, :mod:`difftransformer.ops.blocked`): the model code a saved folder carries
# leaves them out, and there the PyTorch kernels serve every input.
diff_attention_blocked = None  # package-only (models/remote_code.py): not in this file


Backend = Literal["auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex"]


BACKENDS: tuple[str, ...] = ("auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex")


# transformers' attn_implementation -> the backend it runs; "sdpa" (transformers' default) runs the requested
# backend ("auto": chosen per device, dtype and shape below).
IMPLEMENTATIONS = {"sdpa": None, "eager": "reference", "flex_attention": "flex", "paged|eager": "reference"}


# Thresholds of backend="auto", measured with `difftransformer bench` (docs/performance.md).
DECODE_MAX_QUERIES = 16  # up to this many queries, reading K and V once beats every fused kernel


BLOCKED_MAX_KEYS_CPU = 512  # on CPU the blocked path beats two SDPA calls up to here (measured at 512)


# The kernels that take any mask, by name; one signature (q, k, v, lambda_full, *, causal, attn_mask, scale).
_MASKED_KERNELS = {
    "reference": lambda *args, **kwargs: diff_attention_reference(*args, **kwargs)[0],
    "sdpa": diff_attention_sdpa,
    "blocked": diff_attention_blocked,
    "decode": diff_attention_decode,
    "flex": diff_attention_flex,
}


def check_implementation(implementation: str | None) -> None:
    """Raise ValueError, saying why, for an ``attn_implementation`` differential attention cannot run: flash
    attention (its value is as wide as its queries and keys) and functions registered with transformers (one
    softmax map a head, where these kinds subtract two)."""
    if (implementation or "sdpa") in IMPLEMENTATIONS:
        return
    if "flash" in implementation:
        why = (
            "flash-attention kernels take a value as wide as the queries and keys, and a differential head's value "
            "(2d) is twice the width of each of its maps' queries and keys (d)"
        )
    else:
        why = (
            "an attention function registered with transformers computes one softmax map per head, and "
            "differential attention subtracts two before multiplying the value"
        )
    raise ValueError(
        f"attn_implementation must be one of {tuple(IMPLEMENTATIONS)} for DIFF V1 and GDA (attention='diff', "
        f"'gda'): got {implementation!r}, which they cannot run: {why}. The other kinds take it"
    )


def _native_applies(q: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """Where the C++ kernels run: in the package, built, CPU float32, no mask, outside torch.compile."""
    return attn_mask is None and cpu_kernels_for(q) is not None


def choose_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    backend: Backend = "auto",
    implementation: str | None = None,
    lambda_per_token: bool = False,
) -> str:
    """The kernel that runs for q (B, h, T, 2d) and k (B, h_kv, S, 2d): a name from :data:`BACKENDS` (not "auto"),
    or "decode_cpu" (the C++ decode step). ``lambda_per_token``: lambda is one a head and query, which the C++
    kernels and the blocked path do not take (they hold one scalar); "auto" then picks "decode" or "sdpa".

    ``implementation`` (transformers' ``attn_implementation``) comes first: "eager" and "paged|eager" run the
    reference, "flex_attention" FlexAttention, "sdpa" or None ``backend``; any other is refused
    (:func:`check_implementation`). ``backend="auto"`` then picks by device, dtype and shape:

    - T <= 16 queries (decode, short blocks): "decode", which reads the cache once, as the baseline's step.
    - CPU float32 without a mask (causal or full), outside ``torch.compile``, where the C++ kernel builds:
      "fused_cpu", both maps of a block of query rows formed, combined and multiplied with V once (the
      baseline's work, forward and backward, no copies).
    - other CPU float32/float64 with S <= 512 keys: "blocked", the baseline's FLOPs, maps one query block at a time.
    - otherwise "sdpa": stock fused kernels (flash on GPU; on CPU the fused kernel wins for long keys
      even at twice the work, because the blocked path's maps leave the cache).

    "decode" (chosen or requested) runs as "decode_cpu" at inference (no grad) under the C++ kernels' conditions:
    the same single read of K and V without SDPA's fixed cost, which dominates a one-token step.
    """
    check_implementation(implementation)
    backend = IMPLEMENTATIONS[implementation or "sdpa"] or backend
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if lambda_per_token and backend in ("blocked", "fused_cpu"):
        raise ValueError(f"backend {backend!r} takes one scalar lambda a layer; got a per-token lambda")
    if backend == "auto":
        if q.shape[-2] <= DECODE_MAX_QUERIES:
            backend = "decode"
        elif lambda_per_token:
            return "sdpa"
        elif _native_applies(q, attn_mask):
            return "fused_cpu"
        elif (
            diff_attention_blocked is not None
            and q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.float64)
            and k.shape[-2] <= BLOCKED_MAX_KEYS_CPU
        ):
            return "blocked"
        else:
            return "sdpa"
    if (
        backend == "decode"
        and not torch.is_grad_enabled()
        and not lambda_per_token
        and _native_applies(q, attn_mask)
    ):
        return "decode_cpu"
    if backend == "blocked" and diff_attention_blocked is None:
        raise ValueError(
            "backend 'blocked' is the package's CPU path, not in a saved folder's code; use 'auto' or 'sdpa'"
        )
    if backend == "fused_cpu":
        if attn_mask is not None:
            raise ValueError("backend 'fused_cpu' takes no attn_mask (causal or full only); got a mask")
        if cpu_kernels_for(q) is None:
            raise ValueError(
                "backend 'fused_cpu' needs float32 CPU inputs and the C++ kernel, which is built with the package "
                f"(not in a saved folder's code); got {q.dtype} on {q.device}"
            )
    return backend


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
    implementation: str | None = None,
    rotary: QueryRotary | None = None,
) -> torch.Tensor:
    """Differential attention in the paired layout (see :mod:`difftransformer.ops.common`).

    Args:
        q: (B, h, T, 2d), Q1 | Q2 of each head.
        k: (B, h_kv, S, 2d), K1 | K2 of each KV group.
        v: (B, h_kv, S, 2d).
        lambda_full: scalar lambda of the layer (a 0-d tensor keeps the gradient; a float at inference), or one a
            head and query (B or 1, h, T, 1) (the per-token lambda; the PyTorch kernels take it).
        causal: causal mask, aligned bottom-right when T < S (KV cache).
        attn_mask: bool (True = attend) or additive float, broadcastable to (B, 1, T, S); for "flex" also a
            FlexAttention ``BlockMask`` (transformers' masks for ``attn_implementation="flex_attention"``).
        scale: logit scale, default 1 / sqrt(d).
        backend: "reference" (materialized maps, exact), "sdpa" (two fused SDPA calls over V's halves),
            "blocked" (the baseline's FLOPs, maps one query block at a time), "decode" (few queries: K and V
            read once), "fused_cpu" (C++ kernel, CPU float32, no attn_mask), "flex" (compiled
            FlexAttention, one call with the 2d-wide V; inference only on the CPU), or "auto"
            (:func:`choose_backend`, which never picks "flex": it is not measured ahead of the others).
        implementation: transformers' ``attn_implementation``, which comes before ``backend``
            (:func:`choose_backend`).
        rotary: q is given before its rotary embedding, which rotates each of its halves (Q1 and Q2), or None.

    Returns:
        (B, h, T, 2d): head i's output ``(A1 - lambda A2) V_g``.
    """
    kernel = choose_backend(q, k, attn_mask, backend, implementation, per_token(lambda_full))
    if kernel == "decode_cpu":  # the one kernel that fuses the rotation; choose_backend saw grad mode off
        return cpu_kernels_for(q).decode(q, k, v, lambda_full, causal, scale, rotary)
    if rotary is not None:
        q = rotate_queries(q, rotary)
    if kernel == "fused_cpu":
        return cpu_kernels_for(q).diff_attention(q, k, v, lambda_full, causal, scale)
    return _MASKED_KERNELS[kernel](q, k, v, lambda_full, causal=causal, attn_mask=attn_mask, scale=scale)


# ---- difftransformer/ops/lambda_full.py ------------------------------------------------------------------
# DIFF V1's lambda (paper section 2.1): exp(q1 . k1) - exp(q2 . k2) + lambda_init, one scalar per layer.
#
# The four vectors are kept in float32 (or wider); the result is not clamped. At inference on CPU float32 one C++ call
# computes it (:mod:`difftransformer.ops.native`): a one-token step would otherwise spend eight small tensor ops per
# layer on one number.
def lambda_full(
    q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, lambda_init: float
) -> torch.Tensor | float:
    """The layer's lambda from its four vectors (d,): a 0-d tensor in float32 or wider that keeps the gradient, or
    a Python float at inference where the C++ kernel runs (no autograd and CPU float32)."""
    if not torch.is_grad_enabled():
        native = cpu_kernels_for(q1, k1, q2, k2)
        if native is not None:
            return native.lambda_full(q1, k1, q2, k2, lambda_init)
    dtype = torch.promote_types(q1.dtype, torch.float32)
    lambda_1 = torch.exp(torch.sum(q1.to(dtype) * k1.to(dtype)))
    lambda_2 = torch.exp(torch.sum(q2.to(dtype) * k2.to(dtype)))
    return lambda_1 - lambda_2 + lambda_init


# ---- difftransformer/ops/norm.py -------------------------------------------------------------------------
# RMS normalisation as an operator: the block norms' and DIFF V1's per-head norm, with a lean backward.
#
# Normalised in float32 (or float64), cast back to the input's dtype, then scaled by an optional gain, as in Llama.
# At inference on CPU float32 one C++ call replaces the formula's tensor ops (:mod:`difftransformer.ops.native`):
# a one-token step spends more on launching those small ops than on the arithmetic.
def _widened(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or as it is if already float32 or float64: the norm's working precision."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _normalize(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x / rms(x) computed in float32 (or float64), and 1 / rms(x) of shape (..., 1)."""
    x_wide = _widened(x)
    inv_rms = torch.rsqrt(x_wide.pow(2).mean(-1, keepdim=True) + eps)
    return x_wide * inv_rms, inv_rms


class _RMSNormFunction(torch.autograd.Function):
    """``(x / rms(x)).to(x.dtype) * gain`` that keeps only x and 1/rms for the backward. Autograd through the
    plain ops would also keep the normalised copy, one activation-sized tensor per norm (three a DIFF layer,
    two a baseline layer); the backward recomputes it with one multiply."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gain: torch.Tensor | None, eps: float) -> torch.Tensor:
        normed, inv_rms = _normalize(x, eps)
        ctx.save_for_backward(x, inv_rms, gain)
        normed = normed.to(x.dtype)
        return normed if gain is None else normed * gain

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, inv_rms, gain = ctx.saved_tensors
        normed = _widened(x) * inv_rms
        grad = grad.to(normed.dtype)
        grad_gain = None
        if gain is not None:
            if ctx.needs_input_grad[1]:
                grad_gain = (grad * normed).reshape(-1, normed.shape[-1]).sum(0).to(gain.dtype)
            grad = grad * gain.to(grad.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            # d/dx of x * r with r = (mean(x^2) + eps)^-1/2: r * (g - normed * mean(g * normed))
            grad_x = (inv_rms * (grad - normed * (grad * normed).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_gain, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, scale: float = 1.0) -> torch.Tensor:
    """``x / rms(x) * weight * scale`` over the last dim, in x's dtype; ``weight`` (dim,) or None (no gain).

    The constant ``scale`` is folded into the gain (one pass, not two).
    """
    if not torch.is_grad_enabled():
        native = cpu_kernels_for(x) if weight is None else cpu_kernels_for(x, weight)
        if native is not None:
            return native.rms_norm(x, weight, eps, scale)
    gain = weight if weight is None or scale == 1.0 else weight * scale
    if torch.is_grad_enabled():
        out = _RMSNormFunction.apply(x, gain, eps)
    else:
        normed = _normalize(x, eps)[0].to(x.dtype)
        out = normed if gain is None else normed * gain
    return out if gain is not None or scale == 1.0 else out * scale


# ---- difftransformer/ops/softmax.py ----------------------------------------------------------------------
# Standard softmax attention's float64-exact reference: the eager attention of the matched baseline and of DIFF V2
# (which transformers' attention functions are tested against), and the analysis path of logit hooks.
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


# ---- difftransformer/layers/hooks.py ---------------------------------------------------------------------
# Expose attention logits to analysis code (outlier statistics, logit quantization).
# hook(module, logits) -> logits: the scaled pre-softmax logits (B, n_maps, T, S) of one attention module.
LogitsHook = Callable[[nn.Module, torch.Tensor], torch.Tensor]


@contextmanager
def attention_logits_hook(model: nn.Module, hook: LogitsHook) -> Iterator[list[nn.Module]]:
    """Route every attention module of ``model`` through the materialized path with ``hook`` on its logits.

    ``hook(module, logits)`` receives the scaled logits (B, n_maps, T, S) before masking and softmax and
    returns the logits to use. DIFF V1: n_maps = 2h, map 2i is Q1 K1^T of head i and 2i+1 is Q2 K2^T;
    DIFF V2: the 2h query heads; softmax: the heads. For its duration the modules' configuration runs the "eager"
    attention implementation (the materialized one, which applies the hook), and the model builds its masks for
    it. Yields the hooked modules, in depth order.
    """
    modules = [m for m in model.modules() if hasattr(m, "logits_hook")]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no difftransformer attention modules to hook")
    configs = list({id(m.config): m.config for m in modules}.values())
    previous = [m.logits_hook for m in modules]
    implementations = [config._attn_implementation for config in configs]
    for module in modules:
        module.logits_hook = hook
    for config in configs:
        config._attn_implementation = "eager"
    try:
        yield modules
    finally:
        for module, old in zip(modules, previous):
            module.logits_hook = old
        for config, implementation in zip(configs, implementations):
            config._attn_implementation = implementation


# ---- difftransformer/layers/mlp.py -----------------------------------------------------------------------
# SwiGLU feed-forward block, with Llama's parameter names.
class SwiGLU(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``, no biases; x: (..., hidden) -> (..., hidden)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., hidden) -> (..., hidden)."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ---- difftransformer/layers/norm.py ----------------------------------------------------------------------
# RMSNorm, as in Llama: normalise in float32, cast back, then scale by an optional learnable gain.
class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dim (the operator :func:`difftransformer.ops.rms_norm`).

    Args:
        dim: size of the normalised (last) dim.
        eps: added to the mean square.
        elementwise_affine: learn a gain ``weight`` (dim,), initialised to ones.
    """

    def __init__(self, dim: int, eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def reset_parameters(self) -> None:
        """Gain back to ones."""
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """x: (..., dim) -> (..., dim), same dtype, times ``scale`` (folded into the gain: one pass, not two)."""
        return rms_norm(x, self.weight, self.eps, scale)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, elementwise_affine={self.weight is not None}"


# ---- difftransformer/layers/parts_attention.py -----------------------------------------------------------
# What an attention layer of either map layout builds from its parts (layers/parts.py): the rows of its query
# projection, the noise map's weight, the per-head norm and the output gate. The layouts themselves
# (:mod:`~difftransformer.layers.split_heads`, :mod:`~difftransformer.layers.whole_heads`) form the maps.
#
# q_proj's rows come in groups, one a noise map: the group's G signal query blocks (d rows each), its noise query
# block (d rows), then with the output gate its G signal heads' gate blocks (a head's output width each: 2d split, d
# whole). Without noise maps a group is one head: its query block, then its gate block. So DIFF V1's q_proj is
# Q1 | Q2 a head (the authors' layout), GDA's is Motif's (G signal sub-heads, then the noise one), DIFF V2's holds
# adjacent query-head pairs and gated attention's holds each head's query then its gate (transformers'
# ``Qwen3NextAttention``), and folders of every kind keep loading as they were saved.
class LambdaVectors(nn.Module):
    """The scalar lambda's four vectors, d entries each, kept in float32 whatever the model's dtype.

    A module of their own, so that the float32-kept parameters form their own group wherever parameters are
    grouped by owning module (FSDP2 needs one dtype per group; transformers gives ``_keep_in_fp32_modules``
    their own), and so that PEFT's ``modules_to_save`` and accelerate's offload hooks see every read of them. Saved
    under these names; the Llama-family ``self_attn.lambda_q1`` ... load too (models/modeling.py).

    Args:
        dim: d, the width of one map's queries and keys.
        std: std of their normal init.
    """

    def __init__(self, dim: int, std: float = 0.1) -> None:
        super().__init__()
        self.std = std
        # exp() of a bfloat16 dot product is too coarse for lambda.
        self.q1 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.k1 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.q2 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.k2 = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, std) for all four."""
        for vector in (self.q1, self.k1, self.q2, self.k2):
            nn.init.normal_(vector, mean=0.0, std=self.std)

    def forward(self, lambda_init: float) -> torch.Tensor | float:
        """exp(q1 . k1) - exp(q2 . k2) + lambda_init, not clamped (:func:`~difftransformer.ops.lambda_full`)."""
        return lambda_full(self.q1, self.k1, self.q2, self.k2, lambda_init)


class PartsAttention(nn.Module):
    """The parts both map layouts share, built from the configuration's resolved parts (``config.parts``).

    Attributes a layout reads: ``heads`` (h signal heads), ``ratio`` (G; 1 without noise maps), ``groups`` (n,
    one a noise map, or h without noise maps), ``map_head_dim`` (d), ``width`` (a head's output: 2d split, d whole),
    ``lambda_vectors`` or ``lambda_proj`` (the noise map's weight), ``subln`` (the per-head norm or None),
    ``out_scale`` (1 - lambda_init with the scalar lambda, else 1), ``sliding_window`` (this layer's window or None).

    Args:
        config: the model's configuration (k_proj and v_proj hold ``num_key_value_heads`` x ``head_dim`` rows).
        layer_idx: 0-based depth: the scalar lambda's lambda_init, this layer's window and its cache slot.
        width: a head's output width.
    """

    def __init__(self, config: PreTrainedConfig, layer_idx: int, width: int) -> None:
        super().__init__()
        self.config, self.layer_idx, self.parts = config, layer_idx, config.parts
        self.rope_style, self.is_causal = config.rope_style, config.causal
        self.logits_hook: LogitsHook | None = None
        self.map_head_dim, self.width = config.map_head_dim, width
        self.heads = config.num_attention_heads
        self.ratio = self.parts.noise_ratio or 1
        self.groups = self.heads // self.ratio
        self.sliding_window = config.sliding_window if self.parts.windowed(layer_idx) else None
        blocks = self.ratio + (1 if self.parts.differential else 0)  # a group's query blocks
        gate = self.ratio * width if self.parts.gate == "elementwise" else 0
        hidden, kv_rows = config.hidden_size, config.num_key_value_heads * config.head_dim
        # Registered in the order earlier versions had, so a seed gives the same initial weights.
        self.q_proj = nn.Linear(hidden, self.groups * (blocks * self.map_head_dim + gate), bias=False)
        self.k_proj = nn.Linear(hidden, kv_rows, bias=False)
        self.v_proj = nn.Linear(hidden, kv_rows, bias=False)
        self.o_proj = nn.Linear(self.heads * width, hidden, bias=False)
        self.lambda_init = config.layer_lambda_init(layer_idx)
        if self.parts.lambda_mode == "scalar":
            self.lambda_vectors = LambdaVectors(self.map_head_dim, config.lambda_std)
        elif self.parts.lambda_mode == "token":
            self.lambda_proj = nn.Linear(config.hidden_size, self.heads, bias=False)
        # the paper's fixed output scale (Eq. 3) belongs to the scalar lambda's lambda_init
        self.out_scale = 1.0 - self.lambda_init if self.parts.lambda_mode == "scalar" else 1.0
        self.subln = (
            None
            if self.parts.norm == "none"
            else RMSNorm(width, eps=config.subln_eps, elementwise_affine=self.parts.norm == "affine")
        )

    def query_groups(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q_proj's output as its groups: the query blocks (B, T, n, blocks, d) (G signal, then the noise one) and
        the gate blocks (B, T, n, G, width), or None without the gate. Views, no copies."""
        batch, q_len, _ = hidden_states.shape
        groups = self.q_proj(hidden_states).view(batch, q_len, self.groups, -1)
        if self.parts.gate == "none":
            return groups.unflatten(-1, (-1, self.map_head_dim)), None
        queries, gate = groups.split(
            [groups.shape[-1] - self.ratio * self.width, self.ratio * self.width], -1
        )
        return queries.unflatten(-1, (-1, self.map_head_dim)), gate.unflatten(-1, (self.ratio, self.width))

    def lambda_full(self) -> torch.Tensor | float:
        """The scalar lambda: exp(q1.k1) - exp(q2.k2) + lambda_init, not clamped."""
        return self.lambda_vectors(self.lambda_init)

    def noise_weight(self, hidden_states: torch.Tensor) -> torch.Tensor | float:
        """The noise map's weight: the layer's scalar lambda, or sigmoid(lambda_proj(x)) (B, T, h) in float32 or
        wider (Ye et al. 2026; Motif keeps it in float32 too: the sigmoid is sensitive near 0)."""
        if self.parts.lambda_mode == "scalar":
            return self.lambda_full()
        lambdas = self.lambda_proj(hidden_states)
        return torch.sigmoid(lambdas.to(torch.promote_types(lambdas.dtype, torch.float32)))

    def finish(self, out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """Heads' outputs (B, T, h, width) -> the layer's output (B, T, d_model): the per-head norm and the scale,
        the gate's sigmoid, the output projection."""
        if self.subln is not None:
            out = self.subln(out, self.out_scale)
        elif self.out_scale != 1.0:
            out = out * self.out_scale
        if gate is not None:
            gate = gate.reshape(out.shape)
            out = out * torch.sigmoid(gate.to(torch.promote_types(gate.dtype, torch.float32))).to(out.dtype)
        return self.o_proj(out.flatten(-2))

    def reset_parameters(self) -> None:
        """Projections as nn.Linear initialises them, lambda vectors Normal(0, lambda_std), gain ones."""
        for module in self.children():
            if isinstance(module, (nn.Linear, LambdaVectors, RMSNorm)):
                module.reset_parameters()


# ---- difftransformer/layers/rotary.py --------------------------------------------------------------------
# Rotary position embedding's tables as a module; the rotation is the operator :func:`apply_rotary`
# (:mod:`difftransformer.ops.rotary`), in both pairings, "interleaved" and "half". They are the same function up to a
# fixed permutation of each head's q/k rows (:func:`interleaved_to_half_permutation`).
class RotaryEmbedding(nn.Module):
    """cos/sin tables for positions, with transformers' RoPE scaling (``rope_parameters``).

    Built as transformers' rotary classes are, ``RotaryEmbedding(config=config)`` (the rotated width is the
    config's ``map_head_dim``, else its ``head_dim``, else hidden_size / num_attention_heads), or from the fields
    themselves, ``RotaryEmbedding(dim=d, rope_parameters=..., max_position_embeddings=...)``. As there,
    ``inv_freq`` and ``original_inv_freq`` are non-persistent buffers and ``self.config`` is a config view whose
    ``head_dim`` is the rotated width ``dim`` (DIFF V1 rotates each d-wide half of its 2d-wide heads), which
    transformers' ``ROPE_INIT_FUNCTIONS`` and ``dynamic_rope_update`` read. The scaled types (linear, dynamic,
    yarn, longrope, llama3, ...) compute from those buffers, as Llama does; ``rope_type="default"`` computes the
    frequencies in float64 and the angles in float32 or wider on every call, so a model's dtype (which casts
    buffers) never rounds them.

    Args:
        config: a config with ``rope_parameters`` and ``max_position_embeddings``; or None and the fields below.
        dim: rotated width d (even).
        rope_parameters: transformers' RoPE dict (``rope_type``, ``rope_theta``, ``factor``, ...); None gives
            the default type with theta 10000.
        max_position_embeddings: the trained length, the reference of the scaling types.
    """

    def __init__(
        self,
        config: PreTrainedConfig | None = None,
        *,
        dim: int | None = None,
        rope_parameters: dict | None = None,
        max_position_embeddings: int = 2048,
    ) -> None:
        super().__init__()
        if (config is None) == (dim is None):
            raise ValueError(
                "give RotaryEmbedding either config or dim (with rope_parameters, max_position_embeddings)"
            )
        if config is not None:
            dim = (
                getattr(config, "map_head_dim", None)
                or getattr(config, "head_dim", None)
                or config.hidden_size // config.num_attention_heads
            )
            rope_parameters, max_position_embeddings = config.rope_parameters, config.max_position_embeddings
        if dim % 2:
            raise ValueError(f"rotary dim must be even; got {dim}")
        parameters = {"rope_type": "default", "rope_theta": 10000.0, **(rope_parameters or {})}
        self.dim, self.rope_type, self.theta = dim, parameters["rope_type"], float(parameters["rope_theta"])
        if self.rope_type != "default" and self.rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(
                f"rope_parameters['rope_type'] must be 'default' or one of {sorted(ROPE_INIT_FUNCTIONS)}; "
                f"got {self.rope_type!r}"
            )
        if self.rope_type in ("llama3", "yarn", "longrope"):
            # transformers' config standardisation: the pretraining length these types scale from
            parameters.setdefault("original_max_position_embeddings", max_position_embeddings)
        self.config = PreTrainedConfig(
            head_dim=dim,
            hidden_size=dim,
            num_attention_heads=1,
            max_position_embeddings=max_position_embeddings,
            rope_parameters=dict(parameters),
        )
        self.max_seq_len_cached = self.original_max_seq_len = max_position_embeddings
        init = self.compute_default_rope_parameters
        if self.rope_type != "default":
            init = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = init(self.config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    @staticmethod
    def compute_default_rope_parameters(
        config: PreTrainedConfig, device: torch.device | None = None, seq_len: int | None = None
    ) -> tuple[torch.Tensor, float]:
        """The default type's ``inv_freq`` (float32, exponents computed in float64) and attention scaling 1, with
        the signature of transformers' ``ROPE_INIT_FUNCTIONS`` (its weight init recomputes the buffers with it)."""
        dim, theta = config.head_dim, float(config.rope_parameters["rope_theta"])
        exponents = torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim
        return (1.0 / theta**exponents).float(), 1.0

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids: (B, T) -> cos, sin: (B, T, d/2) in x's dtype (computed in float32 or wider); x gives
        only the dtype and device."""
        if self.rope_type == "default":
            compute_dtype = torch.promote_types(x.dtype, torch.float32)
            exponents = (
                torch.arange(0, self.dim, 2, device=position_ids.device, dtype=torch.float64) / self.dim
            )
            inv_freq = (1.0 / self.theta**exponents).to(compute_dtype)
            angles = position_ids.to(compute_dtype).unsqueeze(-1) * inv_freq
            return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return self._scaled(x, position_ids)

    @torch.no_grad()
    @dynamic_rope_update
    def _scaled(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        angles = position_ids.to(compute_dtype).unsqueeze(-1) * self.inv_freq.to(x.device, compute_dtype)
        cos, sin = angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


def interleaved_to_half_permutation(dim: int) -> torch.Tensor:
    """Index ``p`` with ``x_half = x_interleaved[..., p]``: the "half" layout of the same rotation."""
    return torch.cat([torch.arange(0, dim, 2), torch.arange(1, dim, 2)])


# ---- difftransformer/layers/split_heads.py ---------------------------------------------------------------
# The split-head map layout: DIFF V1's heads (paper section 2.1), each a signal and a noise map of half width over
# one 2d-wide value, with G signal heads a noise map (GDA), normalised per head; one differential-attention operator
# call a layer.
class SplitHeadAttention(PartsAttention):
    """Multi-head differential attention with GQA and a KV cache (Ye et al., arXiv 2410.05258, §2.1: Eq. 1 the two
    maps and their difference, Eq. 2 lambda, Eq. 3 the per-head norm and the (1 - lambda_init) scale), with G signal
    heads a noise map (Lim et al., "Grouped Differential Attention", arXiv 2510.06949, §2.2):

        head_s = (softmax(Q1_s K1_g^T / sqrt(d)) - lambda_s softmax(Q2_{s // G} K2_g^T / sqrt(d))) V_g,

    g = s // (h / h_kv) the KV group of both maps, lambda the layer's scalar or sigmoid(lambda_proj(x)_s) per token,
    then the per-head norm over the 2d features, the scale, the gate and o_proj (h 2d -> d_model)
    (:meth:`PartsAttention.finish`). At G = 1 the projections have the matched Transformer's shapes: q d_model -> 2h d,
    k and v d_model -> 2 h_kv d, o 2h d -> d_model.

    The operator reads the queries in the paired layout of :mod:`difftransformer.ops.common` (head s's Q1 | Q2,
    2d wide: at G = 1 a view of q_proj's output, at G > 1 each noise map repeated for its G signal heads, so a noise
    map is formed once for each of its signal heads); each differential head is ``head_dim`` = 2d wide, as its value
    and its cache entries are, and each of its maps reads ``map_head_dim`` = d of it.

    Args:
        config: the model's configuration: ``hidden_size``, ``num_attention_heads`` (h), ``num_key_value_heads``
            (h_kv), ``head_dim`` (2d; an upcycled model's heads are wider than hidden_size / h), its parts,
            ``lambda_init``, ``lambda_std``, ``subln_eps``, ``rope_style``, ``causal``, ``attention_backend``;
            ``_attn_implementation`` picks the operator backend (:func:`~difftransformer.ops.choose_backend`) at each
            call.
        layer_idx: 0-based depth, for lambda_init, the window and the cache.
    """

    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx, config.head_dim)
        self.head_dim = config.head_dim
        self.reset_parameters()  # as earlier versions did: a seed gives the same initial weights

    def queries(self, queries: torch.Tensor) -> torch.Tensor:
        """q_proj's query groups (B, T, n, G + 1, d) -> q (B, h, T, 2d) in the paired layout, unrotated: signal
        head s's Q1 | its noise map's Q2."""
        if self.ratio == 1:
            return queries.flatten(-2).transpose(1, 2)
        signal, noise = queries[..., :-1, :], queries[..., -1:, :]
        return torch.cat((signal, noise.expand_as(signal)), dim=-1).flatten(2, 3).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        output_component_maps: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...] | None]:
        """
        Args:
            hidden_states: (B, T, d_model).
            position_embeddings: cos, sin of shape (B, T, d/2).
            attention_mask: the mask transformers' ``masking_utils`` builds for the implementation and this layer's
                window: bool or additive (B or 1, 1, T, S), a FlexAttention ``BlockMask``, or None for causal (full
                if not causal).
            past_key_values: a transformers Cache; stores k and v as (B, h_kv, S, 2d). In continuous batching the
                paged cache comes as the keyword ``cache`` with its indices, as transformers' attention functions
                take it.
            output_attentions: return the combined map A1 - lambda A2, (B, h, T, S).
            output_component_maps: return (combined, A1, A2) instead.

        Returns:
            (B, T, d_model), and the maps or None. Maps and a logits hook take the materialized reference.
        """
        batch, q_len, _ = hidden_states.shape
        cos, sin = position_embeddings
        # q goes to the operator unrotated with its rotary embedding (the C++ decode step rotates it in the kernel);
        # k is rotated before the cache, in the projection's (B, T, sub-heads, d) layout, each of K1, K2 a sub-head.
        queries, gate = self.query_groups(hidden_states)
        q = self.queries(queries)  # Q1 | Q2 per head
        k = self.k_proj(hidden_states).view(batch, q_len, -1, self.map_head_dim)
        k = apply_rotary(k, cos.unsqueeze(2), sin.unsqueeze(2), self.rope_style)
        k = k.view(batch, q_len, -1, self.head_dim).transpose(1, 2)  # K1 | K2 per KV head
        v = self.v_proj(hidden_states).view(batch, q_len, -1, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        elif kwargs.get("cache") is not None:  # continuous batching's paged cache
            k, v = kwargs["cache"].update(k, v, self.layer_idx, kwargs)

        if attention_mask is None and self.is_causal and 1 < q_len < k.shape[2]:
            # No mask with more keys than queries: the queries fill a static cache from its first slot (transformers
            # leaves the mask out only then), which SDPA reads as causal from the top left; the operators align
            # causal masks bottom-right, which over the first q_len keys is the same.
            k, v = k[:, :, :q_len], v[:, :, :q_len]
        weight = self.noise_weight(hidden_states)
        if isinstance(weight, torch.Tensor) and weight.dim():  # per token: (B, T, h) -> (B, h, T, 1)
            weight = weight.transpose(1, 2).unsqueeze(-1)
        rotary = QueryRotary(cos, sin, self.rope_style)
        causal = self.is_causal and attention_mask is None
        maps = None
        if output_attentions or output_component_maps or self.logits_hook is not None:
            hook = None if self.logits_hook is None else partial(self.logits_hook, self)
            out, maps = diff_attention_reference(
                rotate_queries(q, rotary), k, v, weight, causal=causal, attn_mask=attention_mask,
                logits_hook=hook, return_maps=output_attentions or output_component_maps,
            )  # fmt: skip
        else:
            out = diff_attention(
                q, k, v, weight, causal=causal, attn_mask=attention_mask, rotary=rotary,
                backend=self.config.attention_backend, implementation=self.config._attn_implementation,
            )  # fmt: skip
        out = self.finish(out.transpose(1, 2), gate)
        if output_component_maps:
            return out, maps
        return out, maps[0] if maps is not None else None


# ---- difftransformer/layers/whole_heads.py ---------------------------------------------------------------
# The whole-head map layout: whole query heads of width d over the baseline's keys and values, in one call to the
# attention implementation ``config._attn_implementation`` names in transformers' attention interface (sdpa, flash
# attention, flex attention, the paged implementations of continuous batching, a kernel registered with
# ``AttentionInterface``; "eager" is the materialized attention below), as Llama's is. The softmax baseline, gated
# attention, DIFF V2, Motif's attention and every composition of their parts (layers/parts.py) run here.
def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``attn_implementation="eager"``: the materialized map, computed in float32 (float64 for float64 inputs),
    with ``module.logits_hook`` (if set) on the scaled logits. query (B, H, T, d), key and value (B, H_kv, S, d),
    attention_mask bool or additive (B or 1, 1, T, S), or None for the module's causal (bottom-right) or full
    attention. Returns the output (B, T, H, d) and the map (B, H, T, S), as transformers' implementations do.
    Other keywords (``dropout``: these models have none; ``sliding_window``: the mask holds it) are ignored."""
    hook = None if module.logits_hook is None else partial(module.logits_hook, module)
    out, probs = softmax_attention_reference(
        query,
        key,
        value,
        causal=module.is_causal and attention_mask is None,
        attn_mask=attention_mask,
        scale=scaling,
        logits_hook=hook,
    )
    return out.transpose(1, 2), probs


class WholeHeadAttention(PartsAttention):
    """Attention over whole query heads: with noise maps, n groups of G signal heads and one noise head over the
    baseline's K/V (h_kv KV heads dividing n, so a group reads one), each signal head's output

        out_s = attn_s - lambda_s attn_{noise(s)},   attn_j = softmax(Q_j K_g^T / sqrt(d) + mask) V_g,

    lambda the layer's scalar or sigmoid(lambda_proj(x)_s) per token (DIFF V2: G = 1, Ye et al. 2026; Motif's GDLA:
    G = 4 with the output gate); without noise maps each head's ``attn_s`` (the softmax baseline; gated attention
    with the gate, Qiu et al.). Then the per-head norm, the gate and o_proj (h d -> d_model)
    (:meth:`PartsAttention.finish`). q_proj's rows: :mod:`~difftransformer.layers.parts_attention`.

    Args:
        config: the model's configuration (``hidden_size``, ``num_attention_heads`` h, ``num_key_value_heads``,
            ``head_dim`` d, its parts, ``rope_style``, ``causal``); its ``_attn_implementation`` picks the attention
            function at each call, as in transformers' models.
        layer_idx: 0-based depth, the layer's slot in the KV cache (and its window and lambda_init).
    """

    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx, config.head_dim)
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.num_key_value_groups = config.query_heads // config.num_key_value_heads

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The one attention call: (B, T, H_q, d) and the map (B, H_q, T, S) where the implementation gives one.
        Maps are asked of the eager implementation, whatever the configured one (they are what it computes)."""
        implementation = "eager" if output_attentions else self.config._attn_implementation
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        return attention(
            self, q, k, v, attention_mask, scaling=self.scaling, dropout=0.0, sliding_window=self.sliding_window,
            **kwargs,
        )  # fmt: skip

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        output_component_maps: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...] | None]:
        """hidden_states (B, T, d_model) -> (B, T, d_model), and the map (B, h, T, S) with ``output_attentions``
        (with noise maps the combined map A_s - lambda_s A_noise(s), from which the output is then computed, so
        gradients reach it); with ``output_component_maps``, (combined, A_s, A_noise(s)), each (B, h, T, S).
        ``attention_mask`` is the mask transformers' ``masking_utils`` builds for the implementation and this
        layer's window; other keywords (a paged cache and its indices in continuous batching) go to the attention
        function."""
        batch, q_len, _ = hidden_states.shape
        queries, gate = self.query_groups(hidden_states)  # (B, T, n, G [+ 1], d)
        cos, sin = position_embeddings[0].unsqueeze(2), position_embeddings[1].unsqueeze(2)
        q = apply_rotary(queries.flatten(2, 3), cos, sin, self.rope_style).transpose(1, 2)
        k = self.k_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        k = apply_rotary(k, cos, sin, self.rope_style).transpose(1, 2)
        v = self.v_proj(hidden_states).view(batch, q_len, -1, self.head_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        maps = output_attentions or output_component_maps
        out, probs = self.attend(q, k, v, attention_mask, maps, **kwargs)  # (B, T, H_q, d), (B, H_q, T, S)
        if not self.parts.differential:
            return self.finish(out, gate), probs if maps else None
        weight = self.noise_weight(hidden_states)  # a scalar, or (B, T, h)
        if maps:
            groups = probs.unflatten(1, (self.groups, -1))  # (B, n, G + 1, T, S)
            first, noise = groups[:, :, :-1], groups[:, :, -1:]
            if isinstance(weight, torch.Tensor) and weight.dim():
                weight = weight.transpose(1, 2).unflatten(1, (self.groups, -1)).unsqueeze(-1).to(probs.dtype)
            combined = (first - weight * noise).flatten(1, 2)  # (B, h, T, S)
            # each signal head's KV head: its query head's, query heads ordered group by group
            query_head = torch.arange(self.heads, device=q.device)
            query_head = query_head + query_head // self.ratio
            values = v.to(combined.dtype)[:, query_head // self.num_key_value_groups]
            out = (combined @ values).transpose(1, 2).to(q.dtype)  # (B, T, h, d)
            result = (combined, first.flatten(1, 2), noise.expand_as(first).flatten(1, 2))
        else:
            groups = out.unflatten(2, (self.groups, -1))  # (B, T, n, G + 1, d)
            first, noise = groups[:, :, :, :-1], groups[:, :, :, -1:]
            if isinstance(weight, torch.Tensor) and weight.dim():
                weight = weight.unflatten(2, (self.groups, -1)).unsqueeze(-1)
            if isinstance(weight, torch.Tensor):
                weight = weight.to(out.dtype)
            out = (first - weight * noise).flatten(2, 3)  # (B, T, h, d)
        output = self.finish(out, gate)
        if not maps:
            return output, None
        return output, result if output_component_maps else result[0]


# ---- difftransformer/models/loading.py -------------------------------------------------------------------
# Strict loading: a saved folder loads only when its weights are exactly what its config.json describes.
#
# transformers' ``from_pretrained`` gives a tensor the weights lack fresh random values, drops a tensor the config has
# no place for, and leaves a declared tie undone when the folder holds both tensors, each time logging a table and
# carrying on (a tensor of another shape is refused, after the table, with a RuntimeError). A folder whose config.json
# was edited after saving (one layer more or less, another vocabulary size, the norm switched off) would then load as
# another model. :func:`strict_from_pretrained` reads transformers' own loading report (``output_loading_info``) and
# refuses every such folder with one :class:`FolderMismatchError` line; the model classes' ``from_pretrained`` goes
# through it, in the package and in the code a saved folder carries, so ``trust_remote_code`` loads refuse too.
#
# Names and shapes are not all: a strict load also refuses weights holding NaN or infinities
# (:func:`nonfinite_tensors`), and a folder whose ``provenance.json`` records a fingerprint of what was saved
# (:func:`folder_fingerprint`: config.json's model-defining fields and the weights' bytes, written by ``train``) that
# the folder no longer matches: a config edit that keeps every shape (``rope_theta``, ``lambda_init``, ``causal``) or
# weights changed after the save. A caller who asks for transformers' loading report (``output_loading_info=True``)
# gets transformers' load and its report, to inspect as transformers intends; every other load is strict. The vLLM
# plugin carries a copy of this file and applies the same checks to a folder's files before vLLM reads them
# (:func:`folder_problems`).
# transformers logs its loading report (and the undone tie) here; held during a load, shown only if the load stands
_LOADING_LOGGER = "transformers.modeling_utils"


_SHOWN_NAMES = 4  # tensor names a message lists before "and N more"


# What train records beside a run's settings; its "saved" entry is the fingerprint of the folder's model.
PROVENANCE_JSON = "provenance.json"


FINGERPRINT_KEY = "saved"


# config.json fields that say where a model came from or how it is run, not what it computes from its weights:
# transformers' bookkeeping, the dtype to load in, the cache switch, the operators' choice of kernel, and the
# initialisation of weights that are loaded anyway. An edit of any other field changes the fingerprint.
NOT_MODEL_FIELDS = frozenset(
    {"_name_or_path", "architectures", "auto_map", "transformers_version", "dtype", "torch_dtype", "use_cache",
     "attention_backend", "initializer_range", "lambda_std"}
)  # fmt: skip


_CHUNK = 1 << 20  # bytes hashed at a time: the weights are streamed, never read whole


# What each refusal asks the user to do.
_RESTORE_WEIGHTS = "Restore the weights from a copy or checkpoint saved before they went bad, or train again"


_RESTORE_SAVED = (
    "Restore config.json and the weights as they were saved; to change the model, save it to a new folder"
)


class FolderMismatchError(ValueError):
    """A saved folder a strict load refuses: its weights and config.json disagree, its weights are not finite, or it
    no longer matches its recorded fingerprint (the message says how, in one line)."""


class _HeldRecords(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


@contextmanager
def _held_loading_messages() -> Iterator[list[logging.LogRecord]]:
    logger = logging.getLogger(_LOADING_LOGGER)
    held = _HeldRecords()
    logger.addFilter(held)
    try:
        yield held.records
    finally:
        logger.removeFilter(held)


def _named_keys(keys: set[str]) -> str:
    """Tensor names, layer by layer (``model.layers.2.*``) or name by name across layers
    (``model.layers.{0, 1}.self_attn.subln.weight``), whichever is shorter, at most :data:`_SHOWN_NAMES` of them."""
    by_layer: dict[str, list[str]] = {}
    by_name: dict[str, list[str]] = {}
    for key in sorted(keys):
        found = re.match(r"^(.*?\.)(\d+)(\..*)$", key)
        if found is None:
            by_layer[key] = by_name[key] = [key]
            continue
        head, index, tail = found.groups()
        by_layer.setdefault(f"{head}{index}.*", []).append(key)
        by_name.setdefault(f"{head}{{}}{tail}", []).append(index)
    layer_names = [name if len(found) > 1 else found[0] for name, found in by_layer.items()]
    tensor_names = [
        name.replace("{}", "{" + ", ".join(found) + "}" if len(found) > 1 else found[0])
        for name, found in by_name.items()
    ]
    shown = min(layer_names, tensor_names, key=len)
    more = f" and {len(shown) - _SHOWN_NAMES} more" if len(shown) > _SHOWN_NAMES else ""
    return ", ".join(shown[:_SHOWN_NAMES]) + more


def _tensors(count: int) -> str:
    return f"{count} tensor" + ("s" if count != 1 else "")


def weight_disagreements(
    model: nn.Module, info: dict[str, Any], *, mismatched_allowed: bool = False
) -> list[str]:
    """How the weights ``model`` was loaded from disagree with its config, from transformers' loading report
    ``info`` (``from_pretrained(..., output_loading_info=True)``): tensors missing, unexpected or of another shape
    (unless ``mismatched_allowed``), and declared ties left undone; empty when they agree. A folder saved by another
    class (its config's ``architectures``: a base model loaded with a head, or the other way) is held to the base
    model the two share: the head's tensors are new or unread, as transformers intends."""
    children = {name.partition(".")[0] for name in model.state_dict()}
    prefix = getattr(model, "base_model_prefix", "")
    saved_by = getattr(model.config, "architectures", None) or []
    if saved_by and type(model).__name__ not in saved_by:
        in_base = (
            (lambda key: key.startswith(f"{prefix}."))
            if prefix in children
            else (lambda key: key.partition(".")[0] in children)
        )
    else:
        in_base = lambda key: True  # noqa: E731  (the folder holds this very class: every tensor counts)
    problems = []
    missing = {key for key in info["missing_keys"] if in_base(key)}
    if missing:
        problems.append(
            f"the weights lack {_tensors(len(missing))} the config asks for ({_named_keys(missing)}), which would "
            "be random"
        )
    unexpected = {key for key in info["unexpected_keys"] if in_base(key)}
    if unexpected:
        problems.append(
            f"the weights hold {_tensors(len(unexpected))} the config has no place for ({_named_keys(unexpected)}), "
            "which would be dropped"
        )
    if info["mismatched_keys"] and not mismatched_allowed:
        shapes = [
            f"{key}: {tuple(saved)} saved, {tuple(built)} from the config"
            for key, saved, built in sorted(info["mismatched_keys"])
        ]
        problems.append(f"{_tensors(len(shapes))} of another shape ({'; '.join(shapes[:_SHOWN_NAMES])})")
    declared = model.get_expanded_tied_weights_keys(all_submodels=True)
    for target, source in sorted(declared.items()):
        if target not in model.all_tied_weights_keys:
            problems.append(
                f"the config ties {target} to {source} (tie_word_embeddings), but the weights hold two different "
                "tensors"
            )
    return problems


def nonfinite_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors among ``tensors`` (name, tensor) that hold a NaN or an infinity."""
    return [
        name
        for name, tensor in tensors
        if tensor.is_floating_point()
        and tensor.device.type != "meta"
        and not bool(torch.isfinite(tensor).all())
    ]


def nonfinite_problem(names: list[str]) -> str | None:
    """The refusal's words for :func:`nonfinite_tensors`' ``names``; None when there are none."""
    if not names:
        return None
    verb = "holds" if len(names) == 1 else "hold"
    return f"{_tensors(len(names))} of the weights {verb} NaN or infinite values ({_named_keys(set(names))})"


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def folder_fingerprint(folder: str | os.PathLike) -> dict[str, str]:
    """SHA-256 digests of what defines the model saved in ``folder``: ``config``, of config.json's fields less
    :data:`NOT_MODEL_FIELDS` (as canonical JSON, so key order and spacing do not count), and ``weights``, of the
    bytes of its ``*.safetensors`` files in name order, read a megabyte at a time."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    defining = {key: value for key, value in config.items() if key not in NOT_MODEL_FIELDS}
    config_digest = hashlib.sha256(json.dumps(defining, sort_keys=True).encode("utf-8")).hexdigest()
    weights = hashlib.sha256()
    for path in _weight_files(folder):
        weights.update(path.name.encode("utf-8") + b"\0")
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                weights.update(chunk)
    return {"config": config_digest, "weights": weights.hexdigest()}


def recorded_fingerprint(folder: str | os.PathLike) -> dict[str, str] | None:
    """The fingerprint ``folder``'s provenance.json records (:data:`FINGERPRINT_KEY`); None for a folder that
    records none (written before fingerprints, or not by ``train``)."""
    path = Path(folder) / PROVENANCE_JSON
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get(FINGERPRINT_KEY)


def fingerprint_problem(folder: str | os.PathLike) -> str | None:
    """How ``folder`` differs from the fingerprint its provenance.json recorded when its model was saved (a
    config.json field edited, the weights changed); None when it matches or none is recorded."""
    recorded = recorded_fingerprint(folder)
    if recorded is None:
        return None
    found = folder_fingerprint(folder)
    changed = [what for what in ("config", "weights") if recorded.get(what) != found[what]]
    if not changed:
        return None
    what = {
        "config": "config.json's model-defining fields",
        "weights": "the weights (*.safetensors)",
    }
    return (
        f"{' and '.join(what[name] for name in changed)} changed since the model was saved ({PROVENANCE_JSON} "
        f"records sha256 {', '.join(str(recorded.get(name))[:12] for name in changed)}, the folder has "
        f"{', '.join(found[name][:12] for name in changed)})"
    )


def folder_problems(folder: str | os.PathLike) -> list[str]:
    """What a strict load of ``folder`` refuses that its files show without building the model: weights that
    differ from the recorded fingerprint (:func:`fingerprint_problem`) or that hold NaN or infinite values
    (:func:`nonfinite_tensors`, read tensor by tensor from the ``*.safetensors`` files); empty when there is none.
    The vLLM plugin's check before vLLM reads a weight."""
    problems = [problem] if (problem := fingerprint_problem(folder)) else []
    nonfinite = []
    for path in _weight_files(Path(folder)):
        with safe_open(str(path), framework="pt") as weights:
            nonfinite += nonfinite_tensors((name, weights.get_tensor(name)) for name in weights.keys())
    if problem := nonfinite_problem(nonfinite):
        problems.append(problem)
    return problems


def strict_from_pretrained(load: Callable[..., Any], folder: Any, *args: Any, **kwargs: Any) -> Any:
    """``load(folder, *args, **kwargs)`` (a ``from_pretrained`` of a model or Auto class), refusing with a one-line
    :class:`FolderMismatchError` a folder whose weights and config disagree (:func:`weight_disagreements`), whose
    weights hold NaN or infinite values (:func:`nonfinite_tensors`) or which no longer matches the fingerprint its
    provenance.json recorded (:func:`fingerprint_problem`, a local folder); the loading report transformers logs is
    shown only when the load stands. ``ignore_mismatched_sizes`` keeps its meaning (tensors of another shape are
    drawn anew, as the caller asked). ``output_loading_info=True`` is transformers' load and its ``(model, info)``,
    nothing refused: the caller asked to inspect the report (and a strict caller, such as this function or
    :func:`~difftransformer.models.folders.load_model_folder`, judges it). Without a folder
    (``from_pretrained(None, config=..., state_dict=...)``) the caller's own state dict is loaded as transformers
    loads it."""
    if folder is None or kwargs.get("output_loading_info"):
        return load(folder, *args, **kwargs)
    # an edit the fingerprint sees is refused from the files alone, before any weight is read
    if os.path.isdir(folder) and (edited := fingerprint_problem(folder)):
        raise FolderMismatchError(f"{edited}: it would load as another model. {_RESTORE_SAVED}")
    mismatched_allowed = bool(kwargs.get("ignore_mismatched_sizes", False))
    # Shapes that differ come back in the report rather than as transformers' RuntimeError after its table.
    kwargs["ignore_mismatched_sizes"] = True
    with _held_loading_messages() as messages:
        model, info = load(folder, *args, output_loading_info=True, **kwargs)
    problems = weight_disagreements(model, info, mismatched_allowed=mismatched_allowed)
    if problems:
        raise FolderMismatchError(
            f"config.json and the weights disagree: {'; '.join(problems)}. Restore config.json to the values the "
            "weights were saved with"
        )
    if nonfinite := nonfinite_problem(nonfinite_tensors(model.state_dict().items())):
        raise FolderMismatchError(f"{nonfinite}: the model would compute NaN. {_RESTORE_WEIGHTS}")
    logger = logging.getLogger(_LOADING_LOGGER)
    for record in messages:
        logger.handle(record)
    return model


# ---- difftransformer/models/modeling.py ------------------------------------------------------------------
# The attention kinds' language models (DIFF V1, GDA, DIFF V2, gated attention, Motif's attention, their
# compositions and the matched softmax Transformer) as Hugging Face causal language models; each layer's attention is
# the module of its map layout, built from the configuration's parts (layers/parts.py).
# The scalar lambda's vectors live in their own float32 submodule and are saved under those names
# (`self_attn.lambda_vectors.q1` ...), so that tools reading the file by parameter name (accelerate's
# load_checkpoint_and_dispatch) find them. The Llama-family names of the paper's code and DiffLlama
# (`self_attn.lambda_q1` ...) are the "original format" of transformers' conversion machinery: folders saved with
# them still load (this mapping on from_pretrained, _load_from_state_dict on load_state_dict), and
# revert_weight_conversion gives them (the DiffLlama conversion reads it). The parts declare them (their
# ``renamings``); transformers keys the mapping by model type, which every configuration shares.
LAMBDA_KEYS = LAMBDA_RENAMINGS


# The attention module of each map layout.
LAYOUTS = {"split": SplitHeadAttention, "whole": WholeHeadAttention}


def lambda_renamings() -> list[WeightRenaming]:
    """Llama-family lambda names -> ours, as transformers' conversion mapping (fresh objects: they keep state)."""
    return [WeightRenaming(f"self_attn.{old}", f"self_attn.{new}") for old, new in LAMBDA_KEYS.items()]


register_checkpoint_conversion_mapping(
    DiffTransformerConfig.model_type,
    lambda_renamings(),
    overwrite=True,  # the remote-code copy of this module registers it again
)


class DiffTransformerDecoderLayer(GradientCheckpointingLayer):
    """Pre-RMSNorm block: y = x + attn(norm(x)); out = y + mlp(norm(y))."""

    def __init__(self, config: DiffTransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = LAYOUTS[config.map_layout](config, layer_idx)
        self.attention_type = config.layer_types[layer_idx]
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], **attention
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T, d_model) -> (B, T, d_model), and the layer's attention map or None; the keywords (the mask, the
        cache, ``output_attentions``, continuous batching's paged cache) go to the attention module."""
        attn_out, attn_map = self.self_attn(
            self.input_layernorm(hidden_states), position_embeddings, **attention
        )
        hidden_states = hidden_states + attn_out
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)), attn_map


class DiffTransformerPreTrainedModel(PreTrainedModel):
    """Weight init, checkpoint-name mapping and the transformers flags shared by the base model and the LM."""

    config: DiffTransformerConfig
    config_class = DiffTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DiffTransformerDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    # The softmax kinds run every implementation transformers registers; DIFF V1 and GDA the ones their operators
    # can (get_correct_attn_implementation refuses the rest, saying why).
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True

    def __init__(self, config: DiffTransformerConfig, *inputs, **kwargs) -> None:
        super().__init__(config, *inputs, **kwargs)
        # exp() of a half-precision dot product is too coarse for lambda: the scalar lambda's vectors load in float32
        # whatever the dtype (their own submodule, so that FSDP2 groups them apart from the bf16 projections).
        self._keep_in_fp32_modules_strict = list(config.parts.keep_in_fp32)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' ``from_pretrained``, refusing in one line a folder whose weights and config.json disagree
        (tensors missing, unexpected or of another shape, ties left undone): models/loading.py."""
        return strict_from_pretrained(super().from_pretrained, pretrained_model_name_or_path, *args, **kwargs)

    @property
    def _weight_conversions(self) -> list[WeightTransform]:
        """What transformers' ``revert_weight_conversion`` undoes: the conversions ``from_pretrained`` used,
        always with the lambda renaming, so the "original format" is the Llama-family names however the model
        was made (transformers records only the conversions a load matched, none for a folder in our names)."""
        # A load that matched the renaming recorded it too: reverted twice, the second finds nothing to rename.
        return self.__dict__.get("_recorded_weight_conversions", []) + lambda_renamings()

    @_weight_conversions.setter
    def _weight_conversions(self, conversions: list[WeightTransform]) -> None:
        self.__dict__["_recorded_weight_conversions"] = list(conversions)

    def save_pretrained(
        self, save_directory: str | os.PathLike, *args, save_original_format: bool = False, **kwargs
    ) -> None:
        """transformers' ``save_pretrained``, writing the in-memory names by default (``save_original_format=True``
        writes the lambda vectors under their Llama-family names); the config's ``save_pretrained`` adds the
        model's code files."""
        super().save_pretrained(save_directory, *args, save_original_format=save_original_format, **kwargs)

    def get_correct_attn_implementation(
        self, requested_attention: str | None, is_init_check: bool = False
    ) -> str:
        """transformers' check and, for DIFF V1 and GDA, only the implementations their operators run
        (:func:`~difftransformer.ops.check_implementation` says why it refuses the others: before transformers
        looks for a flash-attention package, after it has refused an unknown name)."""
        differential = self.config.differential_heads
        if differential and requested_attention in ALL_ATTENTION_FUNCTIONS:
            check_implementation(requested_attention)
        implementation = super().get_correct_attn_implementation(requested_attention, is_init_check)
        if differential:
            check_implementation(implementation)
        return implementation

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, LambdaVectors):
            for vector in (module.q1, module.k1, module.q2, module.k2):
                init.normal_(vector, mean=0.0, std=self.config.lambda_std)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        # load_state_dict() of an on-disk state dict (the Trainer's resume does this) sees the lambda vectors' disk
        # names; from_pretrained() renames them through the registered conversion mapping instead.
        for key in [key for key in state_dict if key.startswith(prefix) and ".self_attn.lambda_" in key]:
            head, _, name = key.rpartition(".")
            if name in LAMBDA_KEYS:
                state_dict[f"{head}.{LAMBDA_KEYS[name]}"] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Raise ValueError when an id lies outside [0, vocab_size), on the CPU, where reading the ids costs nothing. On
    an accelerator reading them back would stall the device at every step, so there the embedding's own index
    check reports it."""
    if input_ids.is_cpu and input_ids.numel() and not torch.compiler.is_compiling():
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"input_ids must lie in [0, vocab_size={vocab_size}); got values in [{low}, {high}]"
            )


def check_mask_shape(
    attention_mask: torch.Tensor, batch_and_queries: torch.Size, cache: Cache | None, paged: bool
) -> None:
    """Raise ValueError unless ``attention_mask`` is (B, S) with the queries' and the cache's S keys, or a ready
    (B or 1, 1, T, S) mask (with a ``paged`` cache, continuous batching's, S is its keys, not counted here); shapes
    only, nothing read back."""
    batch, q_len = batch_and_queries
    kv_len = cache.get_mask_sizes(q_len, 0)[0] if cache is not None else q_len
    if attention_mask.dim() == 4:
        expected = (1, q_len) if paged else (1, q_len, kv_len)
        if (
            attention_mask.shape[0] not in (1, batch)
            or tuple(attention_mask.shape[1:])[: len(expected)] != expected
        ):
            keys = "keys" if paged else kv_len
            raise ValueError(
                f"a 4-D attention_mask must be ({batch} or 1, 1, {q_len}, {keys}); got {tuple(attention_mask.shape)}"
            )
        return
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] > kv_len:
        raise ValueError(
            f"attention_mask must be (batch={batch}, key length <= {kv_len}) of 1 (token) / 0 (padding); got "
            f"{tuple(attention_mask.shape)}"
        )


def mask_config(config: DiffTransformerConfig, output_attentions: bool) -> DiffTransformerConfig:
    """The configuration masks are built for: ``config``, or with ``output_attentions`` a copy set to the eager
    implementation, whose (materialized) masks every layer's maps are computed with."""
    if not output_attentions or config._attn_implementation == "eager":
        return config
    eager = copy.copy(config)
    eager._attn_implementation = "eager"
    return eager


class DiffTransformerModel(DiffTransformerPreTrainedModel):
    """Embeddings, decoder layers and the final norm; returns hidden states (no LM head)."""

    def __init__(self, config: DiffTransformerConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(
            DiffTransformerDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding."""
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Replace the token embedding (``resize_token_embeddings`` does)."""
        self.embed_tokens = value

    def attention_mask(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None,
        position_ids: torch.Tensor | None,
        output_attentions: bool,
        paged: bool,
    ) -> dict[str, torch.Tensor | None]:
        """The layers' masks by layer type ("full_attention", and "sliding_attention" where the parts window a
        layer), as transformers' ``masking_utils`` builds them for the attention implementation (causal or
        bidirectional, the window, padding, packed documents in the given ``position_ids``, the cache's offsets),
        or None where the implementation's own causal or full attention is exact."""
        config = mask_config(self.config, output_attentions)
        if isinstance(attention_mask, torch.Tensor):
            check_mask_shape(attention_mask, inputs_embeds.shape[:2], past_key_values, paged)
        # Deciding that a padding mask hides nothing reads it back: free on the CPU, a device stall elsewhere.
        may_skip = attention_mask is None or attention_mask.is_cpu
        if not self.config.causal:
            return {
                FULL: create_bidirectional_mask(
                    config, inputs_embeds, attention_mask, past_key_values=past_key_values,
                    allow_is_bidirectional_skip=may_skip,
                )
            }  # fmt: skip
        arguments = dict(
            config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
            past_key_values=past_key_values, position_ids=position_ids, allow_is_causal_skip=may_skip,
        )  # fmt: skip
        masks = {FULL: create_causal_mask(**arguments)}
        if SLIDING in self.config.layer_types:
            masks[SLIDING] = create_sliding_window_causal_mask(**arguments)
        return masks

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """
        Args:
            input_ids: (B, T) token ids in [0, vocab_size).
            attention_mask: (B, S) with 1 for tokens and 0 for padding (S = cached + new tokens), a
                (B, 1, T, S) bool / additive mask, or the masks by layer type ("full_attention",
                "sliding_attention") as transformers' generation builds them.
            position_ids: (B, T); by default counted from the first non-padding token. Without an
                attention_mask and a cache, positions that restart mark packed documents (as transformers
                detects them): each token then attends only within its document.
            past_key_values: a transformers Cache (DynamicCache, StaticCache, ...).
            inputs_embeds: (B, T, d_model) instead of input_ids.
            output_attentions: every layer's map, whatever the attention implementation (the layers compute it
                with the materialized "eager" one).
            return_dict: False (or ``config.return_dict`` False) returns a tuple.
            kwargs: passed to the attention modules, as transformers' models do (continuous batching's paged
                cache and its indices).

        Returns:
            last_hidden_state (B, T, d_model); hidden_states: embeddings then each layer's output;
            attentions: one (B, H, T, S) map per layer (for DIFF the combined map A1 - lambda A2).
        """
        output_attentions = bool(
            output_attentions if output_attentions is not None else self.config.output_attentions
        )
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be (batch, seq); got shape {tuple(input_ids.shape)}")
            check_token_ids(input_ids, self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)
        batch, q_len, _ = inputs_embeds.shape

        # The mask before a new cache: an empty cache changes no size, and without one the positions a caller gives
        # are read for packed documents (restarting positions; ours never restart, so they are not read).
        paged = kwargs.get("cache") is not None  # continuous batching's paged cache, read by the attention
        if isinstance(attention_mask, dict):  # the masks by layer type, as transformers' generate builds them
            masks = attention_mask
        else:
            masks = self.attention_mask(
                inputs_embeds, attention_mask, past_key_values, position_ids, output_attentions, paged
            )
        if position_ids is None:
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -q_len:]
            else:
                past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
                position_ids = torch.arange(past_len, past_len + q_len, device=inputs_embeds.device)[None]
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)

        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        all_hidden = [hidden_states] if output_hidden_states else None
        all_maps = [] if output_attentions else None
        for layer in self.layers:
            hidden_states, attn_map = layer(
                hidden_states,
                position_embeddings,
                attention_mask=masks[layer.attention_type],
                past_key_values=past_key_values,
                output_attentions=output_attentions,
                **kwargs,
            )
            if all_hidden is not None:
                all_hidden.append(hidden_states)
            if all_maps is not None:
                all_maps.append(attn_map)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden_states),
            past_key_values=past_key_values if use_cache else None,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            attentions=tuple(all_maps) if all_maps is not None else None,
        )


class DiffTransformerForCausalLM(DiffTransformerPreTrainedModel, GenerationMixin):
    """:class:`DiffTransformerModel` with a language-model head; ``generate`` works as for Llama."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _fsdp_plan = {"lm_head": "keep_full_weight"}

    def __init__(self, config: DiffTransformerConfig) -> None:
        super().__init__(config)
        self.model = DiffTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Arguments as :meth:`DiffTransformerModel.forward`; ``labels`` (B, T) give the next-token loss
        (shifted inside, -100 ignored). Returns logits (B, T, vocab_size), or a tuple with ``return_dict=False``."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# transformers copies this file along when a model loaded from it is saved again
DiffTransformerModel.register_for_auto_class("AutoModel")
DiffTransformerForCausalLM.register_for_auto_class("AutoModelForCausalLM")
