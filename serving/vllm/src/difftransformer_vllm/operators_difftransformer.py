# Written by difftransformer 0.1.0 from its sources (src/difftransformer: ops, layers, models), model code 0e26c40f72130f94; change the package, not this file.
"""Differential and softmax attention operators: the float64-exact reference, the SDPA path and the
dispatcher that picks between them, generated from the package's sources named below."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F


# ---- difftransformer/ops/common.py -----------------------------------------------------------------------
def per_token(lambda_full: torch.Tensor | float) -> bool:
    return isinstance(lambda_full, torch.Tensor) and lambda_full.dim() > 0


def check_diff_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lambda_full: torch.Tensor | float = 0.0
) -> tuple[int, int, int, int, int, int]:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4-D (batch, heads, seq, 2d); got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    batch, heads, q_len, width = q.shape
    if width % 2:
        raise ValueError(f"q's last dim must be 2d (an even number); got {width}")
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q {batch}, k {k.shape[0]}, v {v.shape[0]}")
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if k.shape[-1] != width:
        raise ValueError(f"k must be (batch, h_kv, kv_len, 2d={width}); got {tuple(k.shape)}")
    if tuple(v.shape[1:]) != (kv_heads, kv_len, width):
        raise ValueError(f"v must be (batch, {kv_heads}, {kv_len}, {width}) like k; got {tuple(v.shape)}")
    if heads % kv_heads:
        raise ValueError(f"differential heads ({heads}) must be a multiple of KV heads ({kv_heads})")
    if q_len > kv_len:
        raise ValueError(f"query length ({q_len}) cannot exceed key length ({kv_len})")
    if per_token(lambda_full) and (
        lambda_full.dim() != 4
        or lambda_full.shape[0] not in (1, batch)
        or lambda_full.shape[1:] != (heads, q_len, 1)
    ):
        raise ValueError(
            f"a per-token lambda must be ({batch} or 1, {heads}, {q_len}, 1); got {tuple(lambda_full.shape)}"
        )
    return batch, heads, kv_heads, q_len, kv_len, width // 2


def additive_to_bool(attn_mask: torch.Tensor) -> torch.Tensor:
    masked = attn_mask <= torch.finfo(attn_mask.dtype).min / 2
    if attn_mask.is_cpu and not torch.compiler.is_compiling() and not bool(((attn_mask == 0) | masked).all()):
        raise ValueError(
            "an additive attn_mask may only hold 0 (attend) and -inf or the dtype's minimum (masked); "
            "got other values (a bias): pass a bool mask instead"
        )
    return ~masked


def build_attend_mask(
    batch: int,
    q_len: int,
    kv_len: int,
    *,
    causal: bool,
    attn_mask: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor | None:
    if attn_mask is None and (not causal or q_len == 1):
        return None  # a single query sits at the last position and sees every key
    mask = None
    if attn_mask is not None:
        expected = f"({batch} or 1, 1, {q_len}, {kv_len})"
        if (
            attn_mask.dim() != 4
            or attn_mask.shape[0] not in (1, batch)
            or attn_mask.shape[1] != 1
            or tuple(attn_mask.shape[-2:]) != (q_len, kv_len)
        ):
            raise ValueError(f"attn_mask must have shape {expected}; got {tuple(attn_mask.shape)}")
        mask = attn_mask if attn_mask.dtype == torch.bool else additive_to_bool(attn_mask)
    if causal:
        rows = torch.arange(q_len, device=device).unsqueeze(-1) + (kv_len - q_len)
        causal_mask = (torch.arange(kv_len, device=device) <= rows)[None, None]
        mask = causal_mask if mask is None else mask & causal_mask
    return mask


# ---- difftransformer/ops/native.py -----------------------------------------------------------------------
CppKernels = None  # package-only (models/remote_code.py): not in this file


cpp_kernels = None  # package-only (models/remote_code.py): not in this file


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def cpu_kernels_for(*tensors: torch.Tensor) -> CppKernels | None:
    if cpp_kernels is None or torch.compiler.is_compiling():
        return None
    for tensor in tensors:
        if type(tensor) not in _PLAIN or not tensor.is_cpu or tensor.dtype != torch.float32:
            return None
    return cpp_kernels()


# ---- difftransformer/ops/reference.py --------------------------------------------------------------------
def masked_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return torch.softmax(logits, dim=-1)
    row_has_key = mask.any(-1, keepdim=True)
    probs = torch.softmax(logits.masked_fill(~(mask | ~row_has_key), float("-inf")), dim=-1)
    return probs * row_has_key


def diff_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    logits_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
    return_maps: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
    batch, heads, kv_heads, q_len, kv_len, head_dim = check_diff_inputs(q, k, v, lambda_full)
    n_rep = heads // kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    compute_dtype = torch.promote_types(q.dtype, torch.float32)
    mask = build_attend_mask(batch, q_len, kv_len, causal=causal, attn_mask=attn_mask, device=q.device)

    q_pairs = q.to(compute_dtype).unflatten(-1, (2, head_dim))  # (B, h, T, 2, d)
    k_pairs = k.to(compute_dtype).unflatten(-1, (2, head_dim)).repeat_interleave(n_rep, dim=1)
    logits = torch.einsum("bhtcd,bhscd->bhcts", q_pairs, k_pairs) * scale  # (B, h, 2, T, S)
    if logits_hook is not None:
        logits = logits_hook(logits.flatten(1, 2)).unflatten(1, (heads, 2))
    probs = masked_softmax(logits, None if mask is None else mask.unsqueeze(1))
    map1, map2 = probs.unbind(2)
    if isinstance(lambda_full, torch.Tensor):
        lambda_full = lambda_full.to(compute_dtype)
    combined = map1 - lambda_full * map2
    out = combined @ v.to(compute_dtype).repeat_interleave(n_rep, dim=1)
    return out.to(q.dtype), (combined, map1, map2) if return_maps else None


# ---- difftransformer/ops/rotary.py -----------------------------------------------------------------------
RopeStyle = Literal["interleaved", "half"]


ROPE_STYLES: tuple[str, ...] = ("interleaved", "half")


_COMPLEX_DTYPES = (torch.float32, torch.float64)  # have a complex counterpart for the fast path


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    if style == "interleaved":
        if x.dtype in _COMPLEX_DTYPES and cos.dtype == x.dtype and not torch.compiler.is_compiling():
            pairs = x.unflatten(-1, (-1, 2))
            if (
                pairs.stride(-1) == 1
                and pairs.storage_offset() % 2 == 0
                and all(stride % 2 == 0 for stride in pairs.stride()[:-1])
            ):
                rotated = torch.view_as_complex(pairs) * torch.complex(cos, sin)
                return torch.view_as_real(rotated).flatten(-2)
        x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).to(x.dtype)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).to(x.dtype)


class QueryRotary(NamedTuple):
    cos: torch.Tensor
    sin: torch.Tensor
    style: RopeStyle


def rotate_queries(q: torch.Tensor, rotary: QueryRotary) -> torch.Tensor:
    cos, sin = rotary.cos[:, :, None, None], rotary.sin[:, :, None, None]
    heads_merged = q.transpose(1, 2).unflatten(-1, (2, -1))
    return apply_rotary(heads_merged, cos, sin, rotary.style).flatten(-2).transpose(1, 2)


# ---- difftransformer/ops/sdpa.py -------------------------------------------------------------------------
def diff_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_full: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    batch, heads, kv_heads, q_len, kv_len, head_dim = check_diff_inputs(q, k, v, lambda_full)
    q_maps = torch.cat([q[..., :head_dim], q[..., head_dim:]], dim=1)
    k_maps = torch.cat([k[..., :head_dim], k[..., head_dim:]], dim=1)
    use_is_causal = causal and attn_mask is None and q_len == kv_len
    mask = None
    if not use_is_causal:
        mask = build_attend_mask(batch, q_len, kv_len, causal=causal, attn_mask=attn_mask, device=q.device)

    def attend(v_half: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q_maps,
            k_maps,
            torch.cat([v_half, v_half], dim=1),
            attn_mask=mask,
            is_causal=use_is_causal,
            scale=scale,
            enable_gqa=heads != kv_heads,
        )

    out = torch.cat([attend(v[..., :head_dim]), attend(v[..., head_dim:])], dim=-1)  # (B, 2h, T, 2d)
    if isinstance(lambda_full, torch.Tensor):
        lambda_full = lambda_full.to(out.dtype)
    return out[:, :heads] - lambda_full * out[:, heads:]


# ---- difftransformer/ops/diff_attention.py ---------------------------------------------------------------
diff_attention_blocked = None  # package-only (models/remote_code.py): not in this file


diff_attention_decode = None  # package-only (models/remote_code.py): not in this file


diff_attention_flex = None  # package-only (models/remote_code.py): not in this file


Backend = Literal["auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex"]


BACKENDS: tuple[str, ...] = ("auto", "reference", "sdpa", "blocked", "decode", "fused_cpu", "flex")


IMPLEMENTATIONS = {"sdpa": None, "eager": "reference", "flex_attention": "flex", "paged|eager": "reference"}


DECODE_MAX_QUERIES = 16  # up to this many queries, reading K and V once beats every fused kernel


BLOCKED_MAX_KEYS_CPU = 512  # on CPU the blocked path beats two SDPA calls up to here (measured at 512)


_MASKED_KERNELS = {
    "reference": lambda *args, **kwargs: diff_attention_reference(*args, **kwargs)[0],
    "sdpa": diff_attention_sdpa,
    "blocked": diff_attention_blocked,
    "decode": diff_attention_decode,
    "flex": diff_attention_flex,
}


def check_implementation(implementation: str | None) -> None:
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
    return attn_mask is None and cpu_kernels_for(q) is not None


def choose_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    backend: Backend = "auto",
    implementation: str | None = None,
    lambda_per_token: bool = False,
) -> str:
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
    kernel = choose_backend(q, k, attn_mask, backend, implementation, per_token(lambda_full))
    if kernel == "decode_cpu":  # the one kernel that fuses the rotation; choose_backend saw grad mode off
        return cpu_kernels_for(q).decode(q, k, v, lambda_full, causal, scale, rotary)
    if rotary is not None:
        q = rotate_queries(q, rotary)
    if kernel == "fused_cpu":
        return cpu_kernels_for(q).diff_attention(q, k, v, lambda_full, causal, scale)
    return _MASKED_KERNELS[kernel](q, k, v, lambda_full, causal=causal, attn_mask=attn_mask, scale=scale)


# ---- difftransformer/ops/lambda_full.py ------------------------------------------------------------------
def lambda_full(
    q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, lambda_init: float
) -> torch.Tensor | float:
    if not torch.is_grad_enabled():
        native = cpu_kernels_for(q1, k1, q2, k2)
        if native is not None:
            return native.lambda_full(q1, k1, q2, k2, lambda_init)
    dtype = torch.promote_types(q1.dtype, torch.float32)
    lambda_1 = torch.exp(torch.sum(q1.to(dtype) * k1.to(dtype)))
    lambda_2 = torch.exp(torch.sum(q2.to(dtype) * k2.to(dtype)))
    return lambda_1 - lambda_2 + lambda_init


# ---- difftransformer/ops/norm.py -------------------------------------------------------------------------
def _widened(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _normalize(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    x_wide = _widened(x)
    inv_rms = torch.rsqrt(x_wide.pow(2).mean(-1, keepdim=True) + eps)
    return x_wide * inv_rms, inv_rms


class _RMSNormFunction(torch.autograd.Function):
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
            grad_x = (inv_rms * (grad - normed * (grad * normed).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_gain, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, scale: float = 1.0) -> torch.Tensor:
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


# ---- difftransformer/ops/softmax.py ----------------------------------------------------------------------
def check_softmax_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4-D (batch, heads, seq, dim); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    batch, heads, q_len, _ = q.shape
    if k.shape[0] != batch or v.shape[0] != batch or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must be (batch={batch}, H_kv, S, {q.shape[-1]}); got {tuple(k.shape)}")
    if tuple(v.shape[1:3]) != tuple(k.shape[1:3]):
        raise ValueError(f"v must have k's heads and length {tuple(k.shape[1:3])}; got {tuple(v.shape)}")
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of KV heads ({kv_heads})")
    if q_len > kv_len:
        raise ValueError(f"query length ({q_len}) cannot exceed key length ({kv_len})")
    return batch, heads, kv_heads, q_len, kv_len


def softmax_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    logits_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, kv_heads, q_len, kv_len = check_softmax_inputs(q, k, v)
    n_rep = heads // kv_heads
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    compute_dtype = torch.promote_types(q.dtype, torch.float32)
    mask = build_attend_mask(batch, q_len, kv_len, causal=causal, attn_mask=attn_mask, device=q.device)
    keys = k.to(compute_dtype).repeat_interleave(n_rep, dim=1)
    logits = (q.to(compute_dtype) @ keys.transpose(-1, -2)) * scale
    if logits_hook is not None:
        logits = logits_hook(logits)
    probs = masked_softmax(logits, mask)
    out = probs @ v.to(compute_dtype).repeat_interleave(n_rep, dim=1)
    return out.to(q.dtype), probs
