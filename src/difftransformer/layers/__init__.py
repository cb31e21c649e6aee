"""Torch modules: norms, rotary embedding, SwiGLU, the attention modules (one interface) and the attention kinds
that declare them (:mod:`~difftransformer.layers.kinds`)."""

from difftransformer.layers.diff_attention import SUBLN_MODES, DiffAttention, LambdaVectors, SublnMode
from difftransformer.layers.diff_attention_v2 import DiffAttentionV2
from difftransformer.layers.gated_attention import GatedAttention
from difftransformer.layers.grouped_diff_attention import GroupedDiffAttention
from difftransformer.layers.hooks import LogitsHook, attention_logits_hook
from difftransformer.layers.kinds import KIND_FACTS, KINDS, AttentionKind
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
    "KINDS",
    "KIND_FACTS",
    "ROPE_STYLES",
    "SUBLN_MODES",
    "AttentionKind",
    "DiffAttention",
    "DiffAttentionV2",
    "GatedAttention",
    "GroupedDiffAttention",
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
    "eager_attention_forward",
    "interleaved_to_half_permutation",
]
