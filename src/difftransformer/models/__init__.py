"""Hugging Face configs and models, registered with the Auto classes on import."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from difftransformer.layers.kinds import KINDS, AttentionKind
from difftransformer.layers.parts import AttentionParts
from difftransformer.models.configuration import ATTENTION_KINDS, PART_FIELDS, DiffTransformerConfig
from difftransformer.models.flops import Flops, decode_flops, training_flops
from difftransformer.models.matching import matched_config, matching_rule
from difftransformer.models.modeling import (
    DiffTransformerForCausalLM,
    DiffTransformerModel,
    DiffTransformerPreTrainedModel,
)

AutoConfig.register(DiffTransformerConfig.model_type, DiffTransformerConfig, exist_ok=True)
AutoModel.register(DiffTransformerConfig, DiffTransformerModel, exist_ok=True)
AutoModelForCausalLM.register(DiffTransformerConfig, DiffTransformerForCausalLM, exist_ok=True)

__all__ = [
    "ATTENTION_KINDS",
    "KINDS",
    "PART_FIELDS",
    "AttentionKind",
    "AttentionParts",
    "DiffTransformerConfig",
    "DiffTransformerForCausalLM",
    "DiffTransformerModel",
    "DiffTransformerPreTrainedModel",
    "Flops",
    "decode_flops",
    "matched_config",
    "matching_rule",
    "training_flops",
]
