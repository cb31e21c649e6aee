"""Rotary position embedding in both pairings the Differential Transformer world uses.

"interleaved" (the authors' code, GPT-J style) rotates dims (2j, 2j+1) by angle p * theta^(-2j/d);
"half" (Llama, DiffLlama, NeoX style) rotates dims (j, j + d/2) by the same angle. They are the same function
up to a fixed permutation of each head's q/k rows (:func:`interleaved_to_half_permutation`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

RopeStyle = Literal["interleaved", "half"]
ROPE_STYLES: tuple[str, ...] = ("interleaved", "half")


class RotaryEmbedding(nn.Module):
    """Computes the cos/sin tables for positions.

    Args:
        dim: rotated width d (even).
        theta: base of the frequencies.
    """

    def __init__(self, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"rotary dim must be even; got {dim}")
        self.dim, self.theta = dim, theta

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids: (B, T) -> cos, sin: (B, T, d/2) in ``dtype`` (computed in float32 or wider)."""
        compute_dtype = torch.promote_types(dtype, torch.float32)
        exponents = torch.arange(0, self.dim, 2, device=position_ids.device, dtype=torch.float64) / self.dim
        inv_freq = (1.0 / self.theta**exponents).to(compute_dtype)
        angles = position_ids.to(compute_dtype).unsqueeze(-1) * inv_freq
        return angles.cos().to(dtype), angles.sin().to(dtype)


_COMPLEX_DTYPES = (torch.float32, torch.float64)  # have a complex counterpart for the fast path


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    """Rotate the last dim of ``x`` (width d); ``cos``/``sin`` broadcast against ``x[..., : d // 2]``."""
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
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)


def interleaved_to_half_permutation(dim: int) -> torch.Tensor:
    """Index ``p`` with ``x_half = x_interleaved[..., p]``: the "half" layout of the same rotation."""
    return torch.cat([torch.arange(0, dim, 2), torch.arange(1, dim, 2)])
