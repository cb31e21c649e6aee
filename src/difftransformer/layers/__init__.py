"""Torch modules: norms, rotary embedding, SwiGLU, the two map layouts of attention (one interface), the space of
parts they are built from (:mod:`~difftransformer.layers.parts`) and the attention kinds, named points of it
(:mod:`~difftransformer.layers.kinds`)."""

from difftransformer.layers.hooks import LogitsHook, attention_logits_hook
from difftransformer.layers.kinds import KINDS, AttentionKind
from difftransformer.layers.mlp import SwiGLU
from difftransformer.layers.norm import RMSNorm
from difftransformer.layers.parts import AttentionParts
from difftransformer.layers.parts_attention import LambdaVectors, PartsAttention
from difftransformer.layers.rotary import (
    ROPE_STYLES,
    RopeStyle,
    RotaryEmbedding,
    apply_rotary,
    interleaved_to_half_permutation,
)
from difftransformer.layers.split_heads import SplitHeadAttention
from difftransformer.layers.whole_heads import WholeHeadAttention, eager_attention_forward

__all__ = [
    "KINDS",
    "ROPE_STYLES",
    "AttentionKind",
    "AttentionParts",
    "LambdaVectors",
    "LogitsHook",
    "PartsAttention",
    "RMSNorm",
    "RopeStyle",
    "RotaryEmbedding",
    "SplitHeadAttention",
    "SwiGLU",
    "WholeHeadAttention",
    "apply_rotary",
    "attention_logits_hook",
    "eager_attention_forward",
    "interleaved_to_half_permutation",
]
