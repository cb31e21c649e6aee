"""Fused differential attention for CPU float32: a C++ kernel built on first use, forward and backward.

Each task takes a block of query rows of one head and forms both maps' logits for the keys those rows see in
per-thread scratch memory of bounded size (:func:`query_block`), so each row's softmax is exact, the maps are
combined into ``A1 - lambda A2`` before V is read, and one product with V gives the output: the matched baseline's
multiply-adds, forward and backward (docs/performance.md). The backward recomputes the maps from the saved
log-sum-exps; nothing of size (T, S) is kept, no K/V is repeated, and the output is written with heads merged so
``o_proj`` reads it as a view.

The kernel (``csrc/diff_attention_cpu.cpp``) is compiled with :func:`torch.utils.cpp_extension.load` the first
time it is needed (cached in ``extensions/`` under :func:`difftransformer.storage.cache_dir`, one build per kernel
source, flags, torch version and machine) with the C++ compiler PyTorch extensions use and ``ninja`` (a
dependency). The operators find the kernels through :func:`cpp_kernels` (:mod:`difftransformer.ops.native`); where
they cannot be built, :func:`fused_cpu_available` is False, a warning says why, and the operators take their PyTorch
paths. This module is package-only: the model code a saved folder carries has no C++ source and leaves it out. The same extension holds the inference kernels of the one-token step's small
operators: the per-head and block RMSNorm and DIFF V1's lambda.
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
from difftransformer.storage import cache_dir

SOURCE = Path(__file__).with_name("csrc") / "diff_attention_cpu.cpp"
# Scratch floats per map and task (query rows x keys): 2 MiB. Longer rows get fewer query rows per task; fewer
# than 64 rows made the products with K and V slower than the cache misses a larger tile costs (measured at 2048
# and 8192 keys, docs/performance.md). The forward keeps two such tiles per thread, the backward three.
SCRATCH_FLOATS = 1 << 19
MAX_BLOCK_Q, MIN_BLOCK_Q = 64, 8


def query_block(keys: int) -> int:
    """Query rows per task for ``keys`` keys: as many as the scratch budget allows, between 8 and 64."""
    return max(MIN_BLOCK_Q, min(MAX_BLOCK_Q, SCRATCH_FLOATS // max(keys, 1)))


def _build_directory(flags: list[str]) -> Path:
    """One folder per (source, its path, flags, torch, machine): a changed kernel or another CPU never reuses a
    build, and two installs (two checkouts, two venvs) never rebuild over each other's (torch's build file names the
    source's path)."""
    key = hashlib.sha256(
        "\0".join(
            [
                SOURCE.read_text(),
                str(SOURCE.resolve()),
                *flags,
                torch.__version__,
                platform.machine(),
                platform.node(),
            ]
        ).encode()
    ).hexdigest()[:16]
    return cache_dir() / "extensions" / f"diff_attention_cpu-{key}"


@functools.cache
def _extension() -> ModuleType | None:
    from torch.utils import cpp_extension

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
    return lambda_full if type(lambda_full) is float else float(lambda_full)


class _FusedDiffAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lambda_full, scale: float, causal: bool):
        lam = _lambda_value(lambda_full)
        out, lse = _extension().forward(q, k, v, lam, scale, causal, query_block(k.shape[2]))
        ctx.save_for_backward(q, k, v, lse)
        ctx.lam, ctx.scale, ctx.causal = lam, scale, causal
        ctx.lambda_is_tensor = isinstance(lambda_full, torch.Tensor)
        if ctx.lambda_is_tensor:
            ctx.lambda_meta = (lambda_full.shape, lambda_full.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, lse = ctx.saved_tensors
        grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
        dq, dk, dv, delta2 = _extension().backward(
            grad_out, q, k, v, lse, ctx.lam, ctx.scale, ctx.causal, query_block(k.shape[2])
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


class CppKernels:
    """This module's kernels, the operators' fast paths, each with the contract of the PyTorch operator it stands in
    for: ``diff_attention`` that of :func:`~difftransformer.ops.diff_attention` without a mask (forward and
    backward), ``decode`` the same for a few queries at inference with q given unrotated beside its ``rotary``
    embedding, ``rms_norm`` and ``lambda_full`` those of :func:`~difftransformer.ops.rms_norm` and
    :func:`~difftransformer.ops.lambda_full` at inference."""

    def diff_attention(self, q, k, v, lambda_full, causal, scale):
        return diff_attention_fused_cpu(q, k, v, lambda_full, causal=causal, scale=scale)

    def decode(self, q, k, v, lambda_full, causal, scale, rotary):
        """Inference for a few queries (a decode step): both maps' logits per cached key, then ONE pass over V with
        the combined weights, K and V read once; q (B, h, T, 2d), k and v (B, h_kv, S, 2d) CPU float32 -> (B, h, T,
        2d). With ``rotary`` q is given unrotated and each of its halves is rotated in the kernel. The kernel checks
        the layout and the rotary tables itself (ValueErrors with the Python checks' messages). No autograd: inputs
        that require grad are refused while grad mode is on."""
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise ValueError("the C++ decode kernel has no backward: call it under torch.no_grad()")
        cos, sin, style = (None, None, "interleaved") if rotary is None else rotary
        return _extension().decode(
            q, k, v, _lambda_value(lambda_full), scale, causal, cos, sin, style == "half"
        )

    def rms_norm(self, x, weight, eps, scale):
        return _extension().rms_norm(x, weight, eps, scale)

    def lambda_full(self, q1, k1, q2, k2, lambda_init):
        return _extension().lambda_full(q1, k1, q2, k2, lambda_init)


@functools.cache
def cpp_kernels() -> CppKernels | None:
    """The C++ kernels, built on first use, or None where they cannot be built."""
    return CppKernels() if fused_cpu_available() else None
