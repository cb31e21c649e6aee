"""Torch modules: norms, rotary embedding, SwiGLU and the three attention modules (one interface)."""

from difftransformer.layers.diff_attention import (
    SUBLN_MODES,
    DiffAttention,
    LambdaVectors,
    SublnMode,
    depth_lambda_init,
    implementation_backend,
)
from difftransformer.layers.diff_attention_v2 import DiffAttentionV2
from difftransformer.layers.hooks import LogitsHook, attention_logits_hook
from difftransformer.layers.mlp import SwiGLU
from difftransformer.layers.norm import RMSNorm
from difftransformer.layers.rotary import (
    ROPE_STYLES,
    RopeStyle,
    RotaryEmbedding,
    apply_rotary,
    interleaved_to_half_permutation,
)
from difftransformer.layers.softmax_attention import SoftmaxAttention, eager_attention_forward

__all__ = [
    "ROPE_STYLES",
    "SUBLN_MODES",
    "DiffAttention",
    "DiffAttentionV2",
    "LambdaVectors",
    "LogitsHook",
    "RMSNorm",
    "RopeStyle",
    "RotaryEmbedding",
    "SoftmaxAttention",
    "SublnMode",
    "SwiGLU",
    "apply_rotary",
    "attention_logits_hook",
    "depth_lambda_init",
    "eager_attention_forward",
    "implementation_backend",
    "interleaved_to_half_permutation",
]
