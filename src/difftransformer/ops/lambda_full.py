"""DIFF V1's lambda (paper section 2.1): exp(q1 . k1) - exp(q2 . k2) + lambda_init, one scalar per layer.

The four vectors are kept in float32 (or wider); the result is not clamped. At inference on CPU float32 one C++ call
computes it (:mod:`difftransformer.ops.native`): a one-token step would otherwise spend eight small tensor ops per
layer on one number.
"""

from __future__ import annotations

import torch

from difftransformer.ops.native import cpu_kernels_for


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
