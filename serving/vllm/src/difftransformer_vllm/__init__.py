"""vLLM plugin for the difftransformer package's models: ``vllm serve RUN_DIR`` and ``LLM(RUN_DIR)`` for every
attention kind (DIFF V1, GDA, DIFF V2, gated attention) and the matched softmax Transformer.

vLLM calls :func:`register` in each of its processes (the ``vllm.general_plugins`` entry point): the folders' config
class becomes known to transformers' ``AutoConfig`` (so no ``--trust-remote-code`` is needed) and their architecture
to vLLM's model registry, as a lazy reference that imports the model only when one is built.
"""

from __future__ import annotations

ARCHITECTURE = "DiffTransformerForCausalLM"


def register() -> None:
    """Register the configuration with transformers and the model with vLLM (safe to call more than once)."""
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from difftransformer_vllm.configuration_difftransformer import DiffTransformerConfig

    AutoConfig.register(DiffTransformerConfig.model_type, DiffTransformerConfig, exist_ok=True)
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "difftransformer_vllm.model:DiffTransformerForCausalLM")
