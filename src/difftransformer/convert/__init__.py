"""Exact conversion to and from transformers' native models: DIFF V1 <-> DiffLlama, the softmax baseline <->
Llama (DIFF V2 has no native counterpart)."""

from difftransformer.convert.diffllama import ConversionError, from_diffllama, to_diffllama
from difftransformer.convert.llama import from_llama, to_llama

__all__ = ["ConversionError", "from_diffllama", "from_llama", "to_diffllama", "to_llama"]
