"""Conversion to and from other implementations of the Differential Transformer."""

from difftransformer.convert.diffllama import ConversionError, from_diffllama, to_diffllama

__all__ = ["ConversionError", "from_diffllama", "to_diffllama"]
