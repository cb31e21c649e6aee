"""One entry point for differential attention: the single place where a kernel is chosen.

The rule (transformers' one ``ALL_ATTENTION_FUNCTIONS[...]`` lookup; flash-linear-attention's "ops have no hidden
dispatch"): :func:`choose_backend` names the kernel from transformers' ``attn_implementation``, the requested
backend and the inputs, and :func:`diff_attention` runs that one kernel. No kernel function chooses another. A layer
makes one call, passing its queries' rotary embedding as an argument, which the C++ decode step fuses and the
dispatcher applies before every other kernel. The fast paths are package-only (the C++ kernels, the blocked path, the
decode step and FlexAttention: :mod:`~difftransformer.ops.fused_cpu`, :mod:`~difftransformer.ops.blocked`,
:mod:`~difftransformer.ops.decode`, :mod:`~difftransformer.ops.flex`): the model code a saved folder carries leaves
them out, and there the exact PyTorch kernels (reference and SDPA) serve every input.
"""

from __future__ import annotations

from typing import Literal

import torch

from difftransformer.ops.blocked import diff_attention_blocked
from difftransformer.ops.common import per_token
from difftransformer.ops.decode import diff_attention_decode
from difftransformer.ops.flex import diff_attention_flex
from difftransformer.ops.native import cpu_kernels_for
from difftransformer.ops.reference import diff_attention_reference
from difftransformer.ops.rotary import QueryRotary, rotate_queries
from difftransformer.ops.sdpa import diff_attention_sdpa

Backend = Literal["auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex"]
BACKENDS: tuple[str, ...] = ("auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex")
# transformers' attn_implementation -> the backend it runs; "sdpa" (transformers' default) runs the requested
# backend ("auto": chosen per device, dtype and shape below).
IMPLEMENTATIONS = {"sdpa": None, "eager": "reference", "flex_attention": "flex", "paged|eager": "reference"}

# Thresholds of backend="auto", measured with `difftransformer bench` (docs/performance.md).
DECODE_MAX_QUERIES = 16  # up to this many queries, reading K and V once beats every fused kernel
BLOCKED_MAX_KEYS_CPU = 512  # on CPU the blocked path beats two SDPA calls up to here (measured at 512)


# The kernels that take any mask, by name; one signature (q, k, v, lambda_full, *, causal, attn_mask, scale).
_MASKED_KERNELS = {
    "reference": lambda *args, **kwargs: diff_attention_reference(*args, **kwargs)[0],
    "sdpa": diff_attention_sdpa,
    "blocked": diff_attention_blocked,
    "decode": diff_attention_decode,
    "flex": diff_attention_flex,
}


def check_implementation(implementation: str | None) -> None:
    """Raise ValueError, saying why, for an ``attn_implementation`` differential attention cannot run: flash
    attention (its value is as wide as its queries and keys) and functions registered with transformers (one
    softmax map a head, where these kinds subtract two)."""
    if (implementation or "sdpa") in IMPLEMENTATIONS:
        return
    if "flash" in implementation:
        why = (
            "flash-attention kernels take a value as wide as the queries and keys, and a differential head's value "
            "(2d) is twice the width of each of its maps' queries and keys (d)"
        )
    else:
        why = (
            "an attention function registered with transformers computes one softmax map per head, and "
            "differential attention subtracts two before multiplying the value"
        )
    raise ValueError(
        f"attn_implementation must be one of {tuple(IMPLEMENTATIONS)} for DIFF V1 and GDA (attention='diff', "
        f"'gda'): got {implementation!r}, which they cannot run: {why}. The other kinds take it"
    )


def _native_applies(q: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """Where the C++ kernels run: in the package, built, CPU float32, no mask, outside torch.compile."""
    return attn_mask is None and cpu_kernels_for(q) is not None


def choose_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    backend: Backend = "auto",
    implementation: str | None = None,
    lambda_per_token: bool = False,
) -> str:
    """The kernel that runs for q (B, h, T, 2d) and k (B, h_kv, S, 2d): a name from :data:`BACKENDS` (not "auto"),
    or "decode_cpu" (the C++ decode step). ``lambda_per_token``: lambda is one a head and query, which the C++
    kernels and the blocked path do not take (they hold one scalar); "auto" then picks "decode" or "sdpa".

    ``implementation`` (transformers' ``attn_implementation``) comes first: "eager" and "paged|eager" run the
    reference, "flex_attention" FlexAttention, "sdpa" or None ``backend``; any other is refused
    (:func:`check_implementation`). ``backend="auto"`` then picks by device, dtype and shape:

    - T <= 16 queries (decode, short blocks): "decode", which reads the cache once, as the baseline's step.
    - CPU float32 without a mask (causal or full), outside ``torch.compile``, where the C++ kernel builds:
      "fused_cpu", both maps of a block of query rows formed, combined and multiplied with V once (the
      baseline's work, forward and backward, no copies).
    - other CPU float32/float64 with S <= 512 keys: "blocked", the baseline's FLOPs, maps one query block at a time.
    - otherwise "sdpa": stock fused kernels (flash on GPU; on CPU the fused kernel wins for long keys
      even at twice the work, because the blocked path's maps leave the cache).

    "decode" (chosen or requested) runs as "decode_cpu" at inference (no grad) under the C++ kernels' conditions:
    the same single read of K and V without SDPA's fixed cost, which dominates a one-token step.
    """
    check_implementation(implementation)
    backend = IMPLEMENTATIONS[implementation or "sdpa"] or backend
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if lambda_per_token and backend in ("blocked", "fused_cpu"):
        raise ValueError(f"backend {backend!r} takes one scalar lambda a layer; got a per-token lambda")
    if backend == "auto":
        if q.shape[-2] <= DECODE_MAX_QUERIES and diff_attention_decode is not None:
            backend = "decode"
        elif lambda_per_token:
            return "sdpa"
        elif _native_applies(q, attn_mask):
            return "fused_cpu"
        elif (
            diff_attention_blocked is not None
            and q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.float64)
            and k.shape[-2] <= BLOCKED_MAX_KEYS_CPU
        ):
            return "blocked"
        else:
            return "sdpa"
    if (
        backend == "decode"
        and not torch.is_grad_enabled()
        and not lambda_per_token
        and _native_applies(q, attn_mask)
    ):
        return "decode_cpu"
    if backend in _MASKED_KERNELS and _MASKED_KERNELS[backend] is None:
        raise ValueError(
            f"backend {backend!r} (attn_implementation {implementation!r}) runs in the difftransformer package, not "
            "in the code a saved folder carries; install difftransformer, or use attn_implementation 'sdpa' or "
            "'eager'"
        )
    if backend == "fused_cpu":
        if attn_mask is not None:
            raise ValueError("backend 'fused_cpu' takes no attn_mask (causal or full only); got a mask")
        if cpu_kernels_for(q) is None:
            raise ValueError(
                "backend 'fused_cpu' needs float32 CPU inputs and the C++ kernel, which is built with the package "
                f"(not in a saved folder's code); got {q.dtype} on {q.device}"
            )
    return backend


def diff_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    backend: Backend = "auto",
    implementation: str | None = None,
    rotary: QueryRotary | None = None,
) -> torch.Tensor:
    """Differential attention in the paired layout (see :mod:`difftransformer.ops.common`).

    Args:
        q: (B, h, T, 2d), Q1 | Q2 of each head.
        k: (B, h_kv, S, 2d), K1 | K2 of each KV group.
        v: (B, h_kv, S, 2d).
        lambda_full: scalar lambda of the layer (a 0-d tensor keeps the gradient; a float at inference), or one a
            head and query (B or 1, h, T, 1) (the per-token lambda; the PyTorch kernels take it).
        causal: causal mask, aligned bottom-right when T < S (KV cache).
        attn_mask: bool (True = attend) or additive float, broadcastable to (B, 1, T, S); for "flex" also a
            FlexAttention ``BlockMask`` (transformers' masks for ``attn_implementation="flex_attention"``).
        scale: logit scale, default 1 / sqrt(d).
        backend: "reference" (materialized maps, exact), "sdpa" (two fused SDPA calls over V's halves),
            "blocked" (the baseline's FLOPs, maps one query block at a time), "decode" (few queries: K and V
            read once), "fused_cpu" (C++ kernel, CPU float32, no attn_mask), "flex" (compiled
            FlexAttention, one call with the 2d-wide V; inference only on the CPU), or "auto"
            (:func:`choose_backend`, which never picks "flex": it is not measured ahead of the others).
        implementation: transformers' ``attn_implementation``, which comes before ``backend``
            (:func:`choose_backend`).
        rotary: q is given before its rotary embedding, which rotates each of its halves (Q1 and Q2), or None.

    Returns:
        (B, h, T, 2d): head i's output ``(A1 - lambda A2) V_g``.
    """
    kernel = choose_backend(q, k, attn_mask, backend, implementation, per_token(lambda_full))
    if kernel == "decode_cpu":  # the one kernel that fuses the rotation; choose_backend saw grad mode off
        return cpu_kernels_for(q).decode(q, k, v, lambda_full, causal, scale, rotary)
    if rotary is not None:
        q = rotate_queries(q, rotary)
    if kernel == "fused_cpu":
        return cpu_kernels_for(q).diff_attention(q, k, v, lambda_full, causal, scale)
    return _MASKED_KERNELS[kernel](q, k, v, lambda_full, causal=causal, attn_mask=attn_mask, scale=scale)
