"""vLLM plugin for the difftransformer package's models: ``vllm serve RUN_DIR`` and ``LLM(RUN_DIR)`` for every
attention kind (DIFF V1, GDA, DIFF V2, gated attention) and the matched softmax Transformer (on CPU builds,
``difftransformer-vllm serve RUN_DIR``: :mod:`.cli`).

vLLM calls :func:`register` in each of its processes (the ``vllm.general_plugins`` entry point): the folders' config
class becomes known to transformers' ``AutoConfig`` (so no ``--trust-remote-code`` is needed) and their architecture
to vLLM's model registry, as a lazy reference that imports the model only when one is built. The model's checks of
what vLLM can serve also run when vLLM checks its configuration, in the process that starts the engine, so an
unservable folder is refused there in one :class:`UnservableModel` line instead of from inside every worker. So does
the package's strict load of the folder (:func:`check_folder`), before vLLM reads a weight.
"""

from __future__ import annotations

import gc
import os

ARCHITECTURE = "DiffTransformerForCausalLM"


class UnservableModel(ValueError):
    """A folder vLLM cannot serve as the package computes it (the message names the setting and what works)."""


class ServableCheck:
    """The hook vLLM calls with its whole configuration before starting the engine (its per-architecture
    ``verify_and_update_config``): the model's :func:`~difftransformer_vllm.model.check_servable`."""

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        from difftransformer_vllm.model import (
            check_int8_range,
            check_kv_cache,
            check_servable,
            platform_head_sizes,
        )

        model = vllm_config.model_config
        try:
            check_servable(
                model.hf_config,
                vllm_config.parallel_config.tensor_parallel_size,
                model.max_model_len,
                platform_head_sizes(),
            )
            check_kv_cache(vllm_config.cache_config.cache_dtype, model.hf_config)
            check_folder(model.model)
            if getattr(model.hf_config, "quantization_config", None) is not None:
                check_int8_range(model.model)
        except ValueError as refusal:
            raise UnservableModel(str(refusal)) from None

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        """The model configuration alone (vLLM's other hook): nothing to check without the parallel setup."""


def check_folder(folder: str) -> None:
    """The package's strict load of the model folder ``folder``, refusing it as the package does, in one
    ValueError line naming it: tensors missing, unexpected or of another shape, weights that are not finite, a
    folder that no longer matches the fingerprint its provenance.json records (an edit of config.json that keeps
    the shapes). It is the package's own ``from_pretrained``, from the copy of the model's code this plugin carries
    (``modeling_difftransformer.py`` and the files beside it, written by ``make hub``), so the rule cannot drift from
    the package's; it reads the weights once on the CPU, which vLLM then loads itself. A model vLLM fetches from the
    Hub by name (no local folder) is left to vLLM."""
    if not os.path.isdir(folder):
        return
    from difftransformer_vllm.modeling_difftransformer import DiffTransformerForCausalLM

    try:
        model = DiffTransformerForCausalLM.from_pretrained(folder)
    except (OSError, ValueError) as refusal:  # FolderMismatchError is a ValueError; OSError: unreadable files
        first_line = (str(refusal).strip().splitlines() or [type(refusal).__name__])[0]
        raise ValueError(f"{folder}: {first_line}") from None
    del model
    gc.collect()  # the weights read for the check, before vLLM reads them again


def register() -> None:
    """Register the configuration with transformers, the model with vLLM and its checks with vLLM's configuration
    (safe to call more than once)."""
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from difftransformer_vllm.configuration_difftransformer import DiffTransformerConfig

    AutoConfig.register(DiffTransformerConfig.model_type, DiffTransformerConfig, exist_ok=True)
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "difftransformer_vllm.model:DiffTransformerForCausalLM")
    try:  # vLLM's table of per-architecture configuration hooks (0.32); without it the model checks in the workers
        from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    except ImportError:
        return
    MODELS_CONFIG_MAP.setdefault(ARCHITECTURE, ServableCheck)
