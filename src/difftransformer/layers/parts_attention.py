"""What an attention layer of either map layout builds from its parts (layers/parts.py): the rows of its query
projection, the noise map's weight, the per-head norm and the output gate. The layouts themselves
(:mod:`~difftransformer.layers.split_heads`, :mod:`~difftransformer.layers.whole_heads`) form the maps.

q_proj's rows come in groups, one a noise map: the group's G signal query blocks (d rows each), its noise query
block (d rows), then with the output gate its G signal heads' gate blocks (a head's output width each: 2d split, d
whole). Without noise maps a group is one head: its query block, then its gate block. So DIFF V1's q_proj is
Q1 | Q2 a head (the authors' layout), GDA's is Motif's (G signal sub-heads, then the noise one), DIFF V2's holds
adjacent query-head pairs and gated attention's holds each head's query then its gate (transformers'
``Qwen3NextAttention``), and folders of every kind keep loading as they were saved.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedConfig

from difftransformer.layers.hooks import LogitsHook
from difftransformer.layers.norm import RMSNorm
from difftransformer.ops.lambda_full import lambda_full


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
        # q_proj's rows a group: tensor parallelism gives each shard whole groups
        self.group_width = blocks * self.map_head_dim + gate
        # Registered in the order earlier versions had, so a seed gives the same initial weights.
        self.q_proj = nn.Linear(hidden, self.groups * self.group_width, bias=False)
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
        groups = self.q_proj(hidden_states).view(batch, q_len, -1, self.group_width)
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
