"""RMS normalisation as an operator: the block norms' and DIFF V1's per-head norm, with a lean backward.

Normalised in float32 (or float64), cast back to the input's dtype, then scaled by an optional gain, as in Llama.
At inference on CPU float32 one C++ call replaces the formula's tensor ops (:mod:`difftransformer.ops.native`):
a one-token step spends more on launching those small ops than on the arithmetic.
"""

from __future__ import annotations

import torch

from difftransformer.ops.native import cpu_kernels_for


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
