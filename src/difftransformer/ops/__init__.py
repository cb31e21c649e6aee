"""Attention operators: exact references beside fused fast paths, one function per operator, and the one
place that chooses between them (:func:`choose_backend`). The operators find the package's C++ CPU kernels
(:mod:`~difftransformer.ops.fused_cpu`) through :mod:`~difftransformer.ops.native`."""

from difftransformer.ops.blocked import diff_attention_blocked
from difftransformer.ops.common import additive_to_bool, build_attend_mask
from difftransformer.ops.decode import diff_attention_decode
from difftransformer.ops.diff_attention import BACKENDS, check_implementation, choose_backend, diff_attention
from difftransformer.ops.flex import diff_attention_flex
from difftransformer.ops.fused_cpu import cpp_kernels, diff_attention_fused_cpu, fused_cpu_available
from difftransformer.ops.lambda_full import lambda_full
from difftransformer.ops.norm import rms_norm
from difftransformer.ops.reference import diff_attention_reference, masked_softmax
from difftransformer.ops.rotary import QueryRotary, apply_rotary, rotate_queries
from difftransformer.ops.sdpa import diff_attention_sdpa
from difftransformer.ops.softmax import softmax_attention_reference

__all__ = [
    "BACKENDS",
    "QueryRotary",
    "additive_to_bool",
    "apply_rotary",
    "build_attend_mask",
    "check_implementation",
    "choose_backend",
    "cpp_kernels",
    "diff_attention",
    "diff_attention_blocked",
    "diff_attention_decode",
    "diff_attention_flex",
    "diff_attention_fused_cpu",
    "diff_attention_reference",
    "diff_attention_sdpa",
    "fused_cpu_available",
    "lambda_full",
    "masked_softmax",
    "rms_norm",
    "rotate_queries",
    "softmax_attention_reference",
]
