"""Where native (C++) kernels plug into the operators: a registry of one set of CPU kernels.

The operators (:func:`~difftransformer.ops.diff_attention`, :func:`~difftransformer.ops.rms_norm`,
:func:`~difftransformer.ops.lambda_full`) are written in PyTorch and exact on their own. :mod:`~difftransformer.ops.
fused_cpu` registers its C++ kernels here when the package is imported; where nothing is registered (the model code
a saved folder carries, which has no C++ source) or the kernels could not be built, every operator takes its
PyTorch path. The operators never import the kernels' module, so the model code runs without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch


class NativeKernels(Protocol):
    """Operators backed by C++ kernels for CPU float32 (``ops/csrc``), each with the contract of the PyTorch
    operator it stands in for: ``diff_attention`` that of :func:`~difftransformer.ops.diff_attention` without a mask
    (forward and backward), ``decode`` the same for a few queries at inference with q given unrotated beside its
    ``rotary`` embedding, ``rms_norm`` and ``lambda_full`` those of :func:`~difftransformer.ops.rms_norm` and
    :func:`~difftransformer.ops.lambda_full` at inference."""

    def diff_attention(self, q, k, v, lambda_full, causal: bool, scale: float | None) -> torch.Tensor: ...
    def decode(self, q, k, v, lambda_full, causal: bool, scale: float | None, rotary) -> torch.Tensor: ...
    def rms_norm(self, x, weight, eps: float, scale: float) -> torch.Tensor: ...
    def lambda_full(self, q1, k1, q2, k2, lambda_init: float) -> float: ...


_loader: Callable[[], NativeKernels | None] | None = None


def register_native_kernels(loader: Callable[[], NativeKernels | None]) -> None:
    """Register the function that returns the C++ kernels (building them on first use), or None where they cannot
    be built."""
    global _loader
    _loader = loader


def native_kernels() -> NativeKernels | None:
    """The registered C++ kernels, built, or None (none registered, or the build failed)."""
    return None if _loader is None else _loader()


# Tensors the kernels read as they are: a subclass (FSDP2's DTensor, a fake tensor) has no storage of its own.
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def cpu_kernels_for(*tensors: torch.Tensor) -> NativeKernels | None:
    """The C++ kernels if they can run on ``tensors``: all plain float32 CPU tensors, outside ``torch.compile`` (the
    kernels are opaque to it); else None."""
    if _loader is None or torch.compiler.is_compiling():
        return None
    for tensor in tensors:
        if type(tensor) not in _PLAIN or not tensor.is_cpu or tensor.dtype != torch.float32:
            return None
    return _loader()
