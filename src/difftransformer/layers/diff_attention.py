"""DIFF V1 attention (SPEC §1): two softmax maps per head, subtracted, normalised per head."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
from torch import nn
from transformers.cache_utils import Cache

from difftransformer.layers.norm import RMSNorm
from difftransformer.layers.rotary import RopeStyle, apply_rotary
from difftransformer.ops import diff_attention, diff_attention_reference
from difftransformer.ops.diff_attention import DECODE_MAX_QUERIES
from difftransformer.ops.fused_cpu import decode_cpu_applies, decode_step

SublnMode = Literal["affine", "plain", "none"]
SUBLN_MODES: tuple[str, ...] = ("affine", "plain", "none")
LAMBDA_NAMES = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
LogitsHook = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def depth_lambda_init(layer_idx: int) -> float:
    """The paper's depth schedule, l counted from 0: 0.8 - 0.6 exp(-0.3 l)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


class DiffAttention(nn.Module):
    """Multi-head differential attention with GQA and a KV cache.

    Projections have the matched Transformer's shapes: q d_model -> 2h*d, k and v d_model -> 2h_kv*d,
    o 2h*d -> d_model. Their outputs are read in the paired layout of :mod:`difftransformer.ops.common`
    (head i's Q1 | Q2 are q columns [2i d, (2i+2) d)).

    Args:
        hidden_size: d_model.
        num_heads: differential heads h (half the matched Transformer's).
        num_kv_heads: differential KV heads h_kv (divides h).
        layer_idx: 0-based depth, for lambda_init and the cache.
        lambda_init: constant, or None for the depth schedule.
        lambda_std: std of the four lambda vectors at init.
        subln: per-head RMSNorm with a gain ("affine"), without ("plain"), or no norm ("none").
        subln_eps: that norm's eps.
        rope_style: "interleaved" or "half".
        causal: causal masking when no mask is given.
        backend: :func:`difftransformer.ops.diff_attention` backend.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        layer_idx: int,
        *,
        lambda_init: float | None = None,
        lambda_std: float = 0.1,
        subln: SublnMode = "affine",
        subln_eps: float = 1e-5,
        rope_style: RopeStyle = "interleaved",
        causal: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.layer_idx = num_heads, num_kv_heads, layer_idx
        self.head_dim = hidden_size // (2 * num_heads)
        self.lambda_init = depth_lambda_init(layer_idx) if lambda_init is None else float(lambda_init)
        self.lambda_std, self.rope_style, self.is_causal, self.backend = (
            lambda_std,
            rope_style,
            causal,
            backend,
        )
        self.logits_hook: LogitsHook | None = None
        self._lambda_memo: tuple[list, torch.Tensor, float] | None = None

        width = 2 * self.head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * width, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * width, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * width, bias=False)
        self.o_proj = nn.Linear(num_heads * width, hidden_size, bias=False)
        # lambda lives in float32 whatever the model dtype: exp() of a bf16 dot product is too coarse.
        self.lambda_q1 = nn.Parameter(torch.empty(self.head_dim, dtype=torch.float32))
        self.lambda_k1 = nn.Parameter(torch.empty(self.head_dim, dtype=torch.float32))
        self.lambda_q2 = nn.Parameter(torch.empty(self.head_dim, dtype=torch.float32))
        self.lambda_k2 = nn.Parameter(torch.empty(self.head_dim, dtype=torch.float32))
        self.subln = (
            None if subln == "none" else RMSNorm(width, eps=subln_eps, elementwise_affine=subln == "affine")
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            proj.reset_parameters()
        for vector in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(vector, mean=0.0, std=self.lambda_std)
        if self.subln is not None:
            self.subln.reset_parameters()

    def lambda_full(self) -> torch.Tensor:
        """The layer's scalar lambda (0-d, float32 or wider): exp(q1.k1) - exp(q2.k2) + lambda_init, not clamped."""
        dtype = torch.promote_types(self.lambda_q1.dtype, torch.float32)
        lambda_1 = torch.exp(torch.sum(self.lambda_q1.to(dtype) * self.lambda_k1.to(dtype)))
        lambda_2 = torch.exp(torch.sum(self.lambda_q2.to(dtype) * self.lambda_k2.to(dtype)))
        return lambda_1 - lambda_2 + self.lambda_init

    def train(self, mode: bool = True) -> DiffAttention:
        # Optimizers may update the weights without bumping their version counters (e.g. through .data):
        # every switch between training and evaluation forgets the remembered lambda.
        self._lambda_memo = None
        return super().train(mode)

    def _inference_lambda_full(self) -> torch.Tensor:
        """lambda_full(), remembered while the lambda vectors stay the same (same storage, no in-place change,
        no train/eval switch): a one-token decode step would otherwise spend eight tiny ops per layer
        recomputing one scalar."""
        if torch.compiler.is_compiling():
            return self.lambda_full()
        return self._remembered_lambda()[1]

    def _remembered_lambda(self) -> tuple[list, torch.Tensor, float]:
        """(key, lambda_full(), its float), recomputed when a lambda vector's storage or version changes."""
        # Read from _parameters directly: nn.Module's attribute lookup would cost a decode step more than the check.
        key = [
            (vector.data_ptr(), vector._version) for vector in map(self._parameters.__getitem__, LAMBDA_NAMES)
        ]
        if self._lambda_memo is None or self._lambda_memo[0] != key:
            value = self.lambda_full()
            self._lambda_memo = (key, value, float(value))
        return self._lambda_memo

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        output_component_maps: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, ...] | None]:
        """
        Args:
            hidden_states: (B, T, d_model).
            position_embeddings: cos, sin of shape (B, T, d/2).
            attention_mask: bool (B or 1, 1, T, S), True = attend; None = causal (or full if not causal).
            past_key_values: a transformers Cache; stores k and v as (B, h_kv, S, 2d).
            output_attentions: return the combined map A1 - lambda A2, (B, h, T, S).
            output_component_maps: return (combined, A1, A2) instead.

        Returns:
            (B, T, d_model), and the maps or None.
        """
        batch, q_len, _ = hidden_states.shape
        width, d = 2 * self.head_dim, self.head_dim
        # Rotated in the projections' (B, T, sub-heads, d) layout: each Q/K half is a sub-head that rotates alone.
        cos, sin = position_embeddings[0].unsqueeze(2), position_embeddings[1].unsqueeze(2)
        q = self.q_proj(hidden_states).view(batch, q_len, 2 * self.num_heads, d)
        k = self.k_proj(hidden_states).view(batch, q_len, 2 * self.num_kv_heads, d)
        q = (
            apply_rotary(q, cos, sin, self.rope_style)
            .view(batch, q_len, self.num_heads, width)
            .transpose(1, 2)
        )
        k = (
            apply_rotary(k, cos, sin, self.rope_style)
            .view(batch, q_len, self.num_kv_heads, width)
            .transpose(1, 2)
        )
        v = self.v_proj(hidden_states).view(batch, q_len, self.num_kv_heads, width).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)

        if (
            q_len <= DECODE_MAX_QUERIES
            and attention_mask is None
            and self.subln is not None
            and self.backend in ("auto", "decode")
            and not (output_attentions or output_component_maps or self.logits_hook is not None)
            and decode_cpu_applies(q, None)
        ):
            # Generation on CPU: attention, per-head norm and output scale in one kernel call. q, k, v are this
            # layer's own, so the operator's input checks are skipped: at one token a step, Python is the cost.
            subln = self.subln
            norm = (subln.weight, subln.eps, 1.0 - self.lambda_init)
            lambda_value = self._remembered_lambda()[2]
            out = decode_step(q, k, v, lambda_value, d**-0.5, self.is_causal, norm)
            return self.o_proj(out.transpose(1, 2).reshape(batch, q_len, self.num_heads * width)), None

        lambda_full = self._inference_lambda_full() if not torch.is_grad_enabled() else self.lambda_full()
        causal = self.is_causal and attention_mask is None
        maps = None
        if (
            output_attentions
            or output_component_maps
            or self.logits_hook is not None
            or self.backend == "reference"
        ):
            hook = None if self.logits_hook is None else partial(self.logits_hook, self)
            out, maps = diff_attention_reference(
                q, k, v, lambda_full, causal=causal, attn_mask=attention_mask, logits_hook=hook,
                return_maps=output_attentions or output_component_maps,
            )  # fmt: skip
        else:
            out = diff_attention(
                q, k, v, lambda_full, causal=causal, attn_mask=attention_mask, backend=self.backend
            )

        # The paper's fixed (1 - lambda_init) output scale rides on the norm's gain.
        out = (
            out * (1.0 - self.lambda_init) if self.subln is None else self.subln(out, 1.0 - self.lambda_init)
        )
        out = self.o_proj(out.transpose(1, 2).reshape(batch, q_len, self.num_heads * width))
        if output_component_maps:
            return out, maps
        return out, maps[0] if maps is not None else None
