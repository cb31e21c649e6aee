"""Exact conversion to and from transformers' native models: DIFF V1 <-> DiffLlama, the softmax baseline <->
Llama (DIFF V2 has no native counterpart); and upcycling a pretrained softmax model to DIFF V2 or DIFF V1 with the
same logits at step 0."""

from difftransformer.convert.diffllama import from_diffllama, to_diffllama
from difftransformer.convert.folders import ConversionError
from difftransformer.convert.llama import from_llama, to_llama
from difftransformer.convert.upcycle import initial_model, load_softmax, upcycle

__all__ = [
    "ConversionError",
    "from_diffllama",
    "from_llama",
    "initial_model",
    "load_softmax",
    "to_diffllama",
    "to_llama",
    "upcycle",
]
