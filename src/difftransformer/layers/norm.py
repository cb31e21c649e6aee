"""RMSNorm, as in Llama: normalise in float32, cast back, then scale by an optional learnable gain."""

from __future__ import annotations

import torch
from torch import nn

from difftransformer.ops.norm import rms_norm


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
