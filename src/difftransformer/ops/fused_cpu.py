"""Fused differential attention for CPU float32: a C++ kernel built on first use, forward and backward.

Both maps of a head are streamed over key tiles with an online softmax and never materialized; the backward
pass recomputes them from the saved log-sum-exps. Per (query, key) pair the forward computes two d-wide logits
and two 2d-wide P V products, the backward one combined P^T dO, one dO V^T and the four d-wide gradient products:
the matched baseline's multiply-adds in the backward, 1.5x its P V work in the forward (docs/performance.md), no
repeated K/V,
no concatenation, and the output is written with heads merged so ``o_proj`` reads it as a view.

The kernel (``csrc/diff_attention_cpu.cpp``) is compiled with :func:`torch.utils.cpp_extension.load` the first
time it is needed (cached in ``extensions/`` under :func:`difftransformer.storage.cache_dir`, one build per kernel
source, flags, torch version and machine) with the C++ compiler PyTorch extensions use and ``ninja`` (a
dependency). Where it cannot be built, :func:`fused_cpu_available` is False, a warning says why, and
:func:`difftransformer.ops.choose_backend` picks the other paths.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

from difftransformer.ops.common import check_diff_inputs
from difftransformer.ops.norm import HeadNorm
from difftransformer.storage import cache_dir

SOURCE = Path(__file__).with_name("csrc") / "diff_attention_cpu.cpp"
# Tile sizes (queries x keys), measured with `difftransformer bench` at 512-2048 tokens (docs/performance.md).
BLOCK_Q, BLOCK_K = 64, 128


def _build_directory(flags: list[str]) -> Path:
    """One folder per (source, flags, torch, machine): a changed kernel or another CPU never reuses a build."""
    key = hashlib.sha256(
        "\0".join(
            [SOURCE.read_text(), *flags, torch.__version__, platform.machine(), platform.node()]
        ).encode()
    ).hexdigest()[:16]
    return cache_dir() / "extensions" / f"diff_attention_cpu-{key}"


@functools.cache
def _extension() -> ModuleType | None:
    from torch.utils import cpp_extension

    if not SOURCE.is_file():  # the model code copied into a saved folder (models/remote_code.py)
        return None  # the PyTorch paths serve, silently
    flags = ["-O3", "-fopenmp"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-march=native")  # the exp and masking loops vectorize to the machine's widest SIMD
    folder = _build_directory(flags)
    folder.mkdir(parents=True, exist_ok=True)
    if not any(folder.glob("*.so")):
        print(
            f"difftransformer: compiling the fused CPU attention kernel into {folder} (once, about a minute)",
            file=sys.stderr,
            flush=True,
        )
    try:
        return cpp_extension.load(
            name="difftransformer_diff_attention_cpu",
            sources=[str(SOURCE)],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            verbose=os.environ.get("DIFFTRANSFORMER_VERBOSE_BUILD") == "1",
        )
    except Exception as error:  # noqa: BLE001 - any build failure means: use the other paths
        warnings.warn(
            f"the fused CPU differential-attention kernel could not be built ({type(error).__name__}: {error}); "
            "backend='auto' falls back to the SDPA and blocked paths",
            stacklevel=3,
        )
        return None


def fused_cpu_available() -> bool:
    """Whether the C++ kernel is built (building it now if needed)."""
    return _extension() is not None


def _lambda_value(lambda_full: torch.Tensor | float) -> float:
    return float(lambda_full.detach()) if isinstance(lambda_full, torch.Tensor) else float(lambda_full)


class _FusedDiffAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lambda_full, scale: float, causal: bool):
        lam = _lambda_value(lambda_full)
        out, o2, lse = _extension().forward(q, k, v, lam, scale, causal, BLOCK_Q, BLOCK_K)
        ctx.save_for_backward(q, k, v, out, o2, lse)
        ctx.lam, ctx.scale, ctx.causal = lam, scale, causal
        ctx.lambda_is_tensor = isinstance(lambda_full, torch.Tensor)
        if ctx.lambda_is_tensor:
            ctx.lambda_meta = (lambda_full.shape, lambda_full.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, o2, lse = ctx.saved_tensors
        grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
        # rowsum(dO * O_j): O1 = out + lambda O2 is recovered from the output instead of being stored.
        delta2 = (grad_out * o2).sum(-1)
        delta1 = (grad_out * out).sum(-1) + ctx.lam * delta2
        delta = torch.stack([delta1, delta2])
        dq, dk, dv = _extension().backward(
            grad_out, q, k, v, lse, delta, ctx.lam, ctx.scale, ctx.causal, BLOCK_Q, BLOCK_K
        )
        batch, heads, kv_heads = q.shape[0], q.shape[1], k.shape[1]
        if heads != kv_heads:  # per query head -> per KV group (heads of a group are adjacent)
            dk = dk.view(batch, kv_heads, heads // kv_heads, *dk.shape[2:]).sum(2)
            dv = dv.view(batch, kv_heads, heads // kv_heads, *dv.shape[2:]).sum(2)
        grad_lambda = None
        if ctx.lambda_is_tensor and ctx.needs_input_grad[3]:
            shape, dtype = ctx.lambda_meta
            grad_lambda = (-delta2.sum()).to(dtype).reshape(shape)
        return dq, dk, dv, grad_lambda, None, None


def _kernel_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Checked q, k, v with the contiguous last dim the kernel reads, and the scale (default 1 / sqrt(d))."""
    head_dim = check_diff_inputs(q, k, v)[-1]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return q, k, v, head_dim**-0.5 if scale is None else float(scale)


def diff_attention_fused_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Same contract as :func:`~difftransformer.ops.diff_attention_reference` without masks or maps: CPU float32
    q (B, h, T, 2d), k and v (B, h_kv, S, 2d), causal (bottom-right) or not; returns (B, h, T, 2d), stored with
    heads merged ((B, T, h, 2d) memory). Raises RuntimeError if the kernel could not be built."""
    q, k, v, scale = _kernel_inputs(q, k, v, scale)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.device.type != "cpu" or tensor.dtype != torch.float32:
            raise ValueError(
                f"the fused CPU path takes float32 CPU tensors; got {name} {tensor.dtype} on {tensor.device}"
            )
    if _extension() is None:
        raise RuntimeError(
            "the fused CPU differential-attention kernel is not available (it failed to build)"
        )
    return _FusedDiffAttention.apply(q, k, v, lambda_full, scale, causal)


def diff_attention_decode_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    scale: float | None = None,
    norm: HeadNorm | None = None,
) -> torch.Tensor:
    """Inference for a few queries (a decode step) in the C++ kernel: both maps' logits per cached key, then
    ONE pass over V with the combined weights, K and V read once; q (B, h, T, 2d), k and v (B, h_kv, S, 2d) CPU
    float32 -> (B, h, T, 2d). With ``norm`` each head's output row also goes through the layer's per-head RMSNorm
    and output scale. No autograd: inputs that require grad are refused while grad mode is on."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise ValueError("the C++ decode kernel has no backward: call it under torch.no_grad()")
    q, k, v, scale = _kernel_inputs(q, k, v, scale)
    gain, eps, out_scale = norm if norm is not None else (None, 0.0, 1.0)
    return _extension().decode(
        q, k, v, _lambda_value(lambda_full), scale, causal, norm is not None, gain, eps, out_scale
    )
