"""Where the operators find the package's C++ kernels for CPU float32 (:mod:`~difftransformer.ops.fused_cpu`).

The operators (:func:`~difftransformer.ops.diff_attention`, :func:`~difftransformer.ops.rms_norm`,
:func:`~difftransformer.ops.lambda_full`) are written in PyTorch and exact on their own; each asks
:func:`cpu_kernels_for` whether a C++ kernel can take its inputs. The kernels' module is package-only: in the model
code a saved folder carries (models/remote_code.py) ``cpp_kernels`` is None, and every operator takes its PyTorch
path.
"""

from __future__ import annotations

import torch

from difftransformer.ops.fused_cpu import CppKernels, cpp_kernels

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
