"""Differential Transformer: differential attention, DIFF V1/V2 and matched softmax language models."""

from difftransformer.models import (
    DiffTransformerConfig,
    DiffTransformerForCausalLM,
    DiffTransformerModel,
    DiffTransformerPreTrainedModel,
)

__version__ = "0.1.0"

__all__ = [
    "DiffTransformerConfig",
    "DiffTransformerForCausalLM",
    "DiffTransformerModel",
    "DiffTransformerPreTrainedModel",
    "__version__",
]
