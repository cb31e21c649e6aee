"""Hugging Face configs and models, registered with the Auto classes on import."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from difftransformer.layers.kinds import KINDS, AttentionKind
from difftransformer.models.configuration import ATTENTION_KINDS, DiffTransformerConfig
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
    "AttentionKind",
    "DiffTransformerConfig",
    "DiffTransformerForCausalLM",
    "DiffTransformerModel",
    "DiffTransformerPreTrainedModel",
]
