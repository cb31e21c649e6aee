"""DIFF V1 attention (paper section 2.1): two softmax maps per head, subtracted, normalised per head."""

from __future__ import annotations

import math
from functools import partial
from typing import Literal

import torch
from torch import nn
from transformers.cache_utils import Cache

from difftransformer.layers.hooks import LogitsHook
from difftransformer.layers.norm import RMSNorm
from difftransformer.layers.rotary import RopeStyle, apply_rotary
from difftransformer.ops import (
    HeadNorm,
    QueryRotary,
    diff_attention,
    diff_attention_reference,
    rotate_queries,
)

SublnMode = Literal["affine", "plain", "none"]
SUBLN_MODES: tuple[str, ...] = ("affine", "plain", "none")


def depth_lambda_init(layer_idx: int) -> float:
    """The paper's depth schedule, l counted from 0: 0.8 - 0.6 exp(-0.3 l)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


class LambdaVectors(nn.Module):
    """The four lambda vectors of a DIFF V1 layer, d entries each, kept in float32 whatever the model's dtype.

    A module of their own, so that the float32-kept parameters form their own group wherever parameters are
    grouped by owning module (FSDP2 needs one dtype per group; transformers gives ``_keep_in_fp32_modules``
    their own). Saved under these names; the Llama-family ``self_attn.lambda_q1`` ... load too (models/modeling.py).

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
        # (the four tensors, their storages and versions with lambda_init, the value): see forward.
        self._memo: tuple[tuple[torch.Tensor, ...], tuple[float, ...], float] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, std) for all four."""
        for vector in (self.q1, self.k1, self.q2, self.k2):
            nn.init.normal_(vector, mean=0.0, std=self.std)

    def train(self, mode: bool = True) -> LambdaVectors:
        """nn.Module.train, forgetting the remembered inference value."""
        # Optimizers may update the weights without bumping their version counters (e.g. through .data):
        # every switch between training and evaluation forgets the remembered lambda.
        self._memo = None
        return super().train(mode)

    def forward(self, lambda_init: float, *, inference: bool = False) -> torch.Tensor | float:
        """exp(q1 . k1) - exp(q2 . k2) + lambda_init, not clamped: a 0-d tensor in float32 or wider.

        ``inference=True`` (no autograd, no compile) gives it as a Python float, remembered while the four
        vectors are the same tensors with the same storage and no in-place change (and no train/eval switch):
        a one-token decode step would otherwise spend eight tiny ops per layer recomputing one scalar. The
        check reads the tensors this forward computes with, so it holds wherever they come from (a PEFT copy
        of this module trained in full, accelerate's offload loading them for the call).
        """
        if not inference:
            return self._compute(lambda_init)
        # _parameters directly: nn.Module's attribute lookup would cost a decode step more than the check.
        q1, k1, q2, k2 = self._parameters.values()
        # The memo holds the tensors it was computed from, so an equal storage address is the same storage.
        state = (q1.data_ptr(), q1._version, k1.data_ptr(), k1._version, q2.data_ptr(), q2._version)
        state += (k2.data_ptr(), k2._version, lambda_init)
        memo = self._memo
        if memo is None or memo[1] != state:
            memo = self._memo = ((q1, k1, q2, k2), state, float(self._compute(lambda_init).detach()))
        return memo[2]

    def _compute(self, lambda_init: float) -> torch.Tensor:
        dtype = torch.promote_types(self.q1.dtype, torch.float32)
        lambda_1 = torch.exp(torch.sum(self.q1.to(dtype) * self.k1.to(dtype)))
        lambda_2 = torch.exp(torch.sum(self.q2.to(dtype) * self.k2.to(dtype)))
        return lambda_1 - lambda_2 + lambda_init


def _called_plain(module: nn.Module) -> bool:
    """No forward hook on ``module``, torch's or accelerate's (which loads offloaded weights around the call): its
    parameters may be read without calling it."""
    return not (module._forward_hooks or module._forward_pre_hooks or "_hf_hook" in module.__dict__)


class DiffAttention(nn.Module):
    """Multi-head differential attention with GQA and a KV cache.

    Projections have the matched Transformer's shapes: q d_model -> 2h*d, k and v d_model -> 2h_kv*d,
    o 2h*d -> d_model. Their outputs are read in the paired layout of :mod:`difftransformer.ops.common`
    (head i's Q1 | Q2 are q columns [2i d, (2i+2) d)): each differential head is ``head_dim`` = 2d wide, as
    its value and its cache entries are, and each of its maps reads ``map_head_dim`` = d of it. Head counts are
    read from the projections' outputs, so a tensor-parallel shard of the projections runs as it is.

    Args:
        hidden_size: d_model.
        num_heads: differential heads h (half the matched Transformer's).
        num_kv_heads: differential KV heads h_kv (divides h).
        layer_idx: 0-based depth, for lambda_init and the cache.
        head_dim: a head's width 2d; None gives hidden_size / num_heads (an upcycled model's heads are wider).
        lambda_init: constant, or None for the depth schedule.
        lambda_std: std of the four lambda vectors at init.
        subln: per-head RMSNorm with a gain ("affine"), without ("plain"), or no norm ("none").
        subln_eps: that norm's eps.
        rope_style: "interleaved" or "half".
        causal: causal masking when no mask is given.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        layer_idx: int,
        *,
        head_dim: int | None = None,
        lambda_init: float | None = None,
        lambda_std: float = 0.1,
        subln: SublnMode = "affine",
        subln_eps: float = 1e-5,
        rope_style: RopeStyle = "interleaved",
        causal: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.layer_idx = num_heads, num_kv_heads, layer_idx
        self.head_dim = head_dim or hidden_size // num_heads
        self.map_head_dim = self.head_dim // 2
        self.lambda_init = depth_lambda_init(layer_idx) if lambda_init is None else float(lambda_init)
        self.rope_style, self.is_causal = rope_style, causal
        self.logits_hook: LogitsHook | None = None
        self._head_norm_memo: HeadNorm | None = None

        width = self.head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * width, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * width, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * width, bias=False)
        self.o_proj = nn.Linear(num_heads * width, hidden_size, bias=False)
        self.lambda_vectors = LambdaVectors(self.map_head_dim, lambda_std)
        self.subln = (
            None if subln == "none" else RMSNorm(width, eps=subln_eps, elementwise_affine=subln == "affine")
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Projections as nn.Linear initialises them, lambda vectors Normal(0, lambda_std), gain ones."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            proj.reset_parameters()
        self.lambda_vectors.reset_parameters()
        if self.subln is not None:
            self.subln.reset_parameters()

    def _head_norm(self, subln: RMSNorm, out_scale: float) -> HeadNorm:
        """The per-head norm as the operator's argument, built again only when its gain or eps changed (a
        decode step spent about 0.6% of its time building it)."""
        gain = subln._parameters.get("weight")
        norm = self._head_norm_memo
        if norm is None or norm.weight is not gain or norm.eps != subln.eps or norm.scale != out_scale:
            norm = self._head_norm_memo = HeadNorm(gain, subln.eps, out_scale)
        return norm

    def lambda_full(self) -> torch.Tensor:
        """The layer's scalar lambda (0-d, float32 or wider): exp(q1.k1) - exp(q2.k2) + lambda_init, not clamped."""
        return self.lambda_vectors(self.lambda_init)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        output_component_maps: bool = False,
        backend: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...] | None]:
        """
        Args:
            hidden_states: (B, T, d_model).
            position_embeddings: cos, sin of shape (B, T, d/2).
            attention_mask: bool (B or 1, 1, T, S), True = attend; None = causal (or full if not causal).
            past_key_values: a transformers Cache; stores k and v as (B, h_kv, S, head_dim = 2d).
            output_attentions: return the combined map A1 - lambda A2, (B, h, T, S).
            output_component_maps: return (combined, A1, A2) instead.
            backend: the :func:`difftransformer.ops.diff_attention` backend; maps and logits hooks always take
                the materialized reference path (this layer's one mode switch).

        Returns:
            (B, T, d_model), and the maps or None.
        """
        batch, q_len, _ = hidden_states.shape
        width, d = self.head_dim, self.map_head_dim
        out_scale = 1.0 - self.lambda_init  # the paper's fixed output scale, riding on the norm's gain
        subln = self.subln
        materialize = output_attentions or output_component_maps or self.logits_hook is not None
        if not materialize:
            # Before the projections and the cache update: a decode step's cache copy evicts the CPU caches, and
            # this Python then ran measurably slower after it.
            inference = not (torch.is_grad_enabled() or torch.compiler.is_compiling())
            lambdas = self.lambda_vectors
            if inference and type(lambdas) is LambdaVectors and _called_plain(lambdas):
                lambda_full = lambdas.forward(self.lambda_init, inference=True)  # nn.Module.__call__ skipped
            else:  # a wrapper (PEFT's modules_to_save) or a hook (accelerate's offload) must see the call
                lambda_full = lambdas(self.lambda_init, inference=inference)
            # The norm's gain goes to the operator, which fuses it where it can (the C++ decode step), unless a
            # hook wraps the norm (accelerate's offload loads the gain only for its call): then it is called.
            fused = subln is not None and _called_plain(subln)
            norm = self._head_norm(subln, out_scale) if fused else None
        # q goes to the operator unrotated with its rotary (which the C++ decode step applies in the kernel). k is
        # rotated before the cache, in the projection's (B, T, sub-heads, d) layout, each K half a sub-head.
        rotary = QueryRotary(*position_embeddings, self.rope_style)
        q = self.q_proj(hidden_states).view(batch, q_len, -1, width).transpose(1, 2)
        k = self.k_proj(hidden_states).view(batch, q_len, -1, d)
        cos, sin = position_embeddings[0].unsqueeze(2), position_embeddings[1].unsqueeze(2)
        k = apply_rotary(k, cos, sin, self.rope_style).view(batch, q_len, -1, width).transpose(1, 2)
        v = self.v_proj(hidden_states).view(batch, q_len, -1, width).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)

        causal = self.is_causal and attention_mask is None
        maps = None
        if materialize:
            hook = None if self.logits_hook is None else partial(self.logits_hook, self)
            out, maps = diff_attention_reference(
                rotate_queries(q, rotary), k, v, self.lambda_full(), causal=causal, attn_mask=attention_mask,
                logits_hook=hook, return_maps=output_attentions or output_component_maps,
            )  # fmt: skip
            out = out * out_scale if subln is None else subln(out, out_scale)
        else:
            out = diff_attention(
                q, k, v, lambda_full, causal=causal, attn_mask=attention_mask, backend=backend, norm=norm,
                rotary=rotary,
            )  # fmt: skip
            if subln is None:
                out = out * out_scale
            elif not fused:
                out = subln(out, out_scale)
        out = self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))
        if output_component_maps:
            return out, maps
        return out, maps[0] if maps is not None else None
