"""Rotary position embedding's tables as a module; the rotation is the operator :func:`apply_rotary`
(:mod:`difftransformer.ops.rotary`), in both pairings, "interleaved" and "half". They are the same function up to a
fixed permutation of each head's q/k rows (:func:`interleaved_to_half_permutation`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update

from difftransformer.ops.rotary import ROPE_STYLES, RopeStyle, apply_rotary

__all__ = ["ROPE_STYLES", "RopeStyle", "RotaryEmbedding", "apply_rotary", "interleaved_to_half_permutation"]


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
