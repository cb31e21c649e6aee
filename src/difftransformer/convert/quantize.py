"""Quantized copies of a model folder, in the formats models are deployed in.

Each scheme of :mod:`difftransformer.models.quantization` (int8, int4, w8a8) quantizes the linear layers' weights,
and W8A8 their inputs as well; the modules a kind keeps in full precision and the output head stay as they are.
int8 and int4 are written in torchao's format, W8A8 in compressed-tensors' ``int-quantized`` format, which vLLM
serves. llm-compressor, whose calibrated recipes (SmoothQuant, GPTQ) would need data, pins transformers <= 5.17 and
cannot be installed beside this package, so W8A8 is written with compressed-tensors itself.

The folder written loads with transformers' ``from_pretrained`` where the scheme's package is installed (the
``quant`` extra), strictly, as every folder of ours does.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from difftransformer.convert.folders import ConversionError
from difftransformer.errors import UsageError
from difftransformer.models import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.models.folders import load_model_folder
from difftransformer.models.quantization import (
    Scheme,
    apply_w8a8,
    full_precision_modules,
    tiling_problem,
    torchao_method,
)

if TYPE_CHECKING:
    from transformers import TorchAoConfig

QUANTIZATION_JSON = (
    "quantization.json"  # what made the folder: scheme, packages, modules left in full precision
)


def check_quantizable(config: DiffTransformerConfig, scheme: Scheme) -> None:
    """Raise ConversionError, before any weight is read, where ``scheme`` cannot take the shapes of the model
    ``config`` describes (a scheme's groups must tile every input width)."""
    with torch.device("meta"):
        model = DiffTransformerForCausalLM(config)
    if problem := tiling_problem(model, scheme, full_precision_modules(config)):
        raise ConversionError(f"`scheme` {problem}")


def _torchao_config(scheme: Scheme, kept: tuple[str, ...]) -> TorchAoConfig:
    from transformers import TorchAoConfig

    # transformers matches these against parameter names: a pattern, as a bare module name would not match
    return TorchAoConfig(
        torchao_method(scheme), modules_to_not_convert=[rf"(?:.*\.)?{re.escape(name)}" for name in kept]
    )


def _w8a8(model: DiffTransformerForCausalLM, kept: tuple[str, ...]) -> Callable[[Path], None]:
    """Quantize ``model`` in place to compressed-tensors' W8A8 int8, compressed (int8 weights and their scales);
    returns what writes its configuration into a saved folder's config.json."""
    from compressed_tensors.compressors import ModelCompressor

    apply_w8a8(model, kept)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="int-quantized")
    compressor.compress_model(model)
    return lambda folder: compressor.update_config(str(folder))


@dataclass
class QuantizedModel:
    """A model quantized by a scheme, with the record of what was done (:data:`QUANTIZATION_JSON`)."""

    model: DiffTransformerForCausalLM
    record: dict
    write_config: Callable[[Path], None] | None = None  # what save_pretrained does not write itself

    def finish(self, folder: Path) -> None:
        """Complete a folder the model was saved in: its scheme's configuration and :data:`QUANTIZATION_JSON`."""
        if self.write_config is not None:
            self.write_config(folder)
        (folder / QUANTIZATION_JSON).write_text(json.dumps(self.record, indent=2) + "\n", encoding="utf-8")


def quantize_folder(source: Path, scheme: Scheme) -> QuantizedModel:
    """The model saved in ``source`` quantized by ``scheme``: the scheme's package and the model's shapes are
    checked first (ConversionError naming what to change), then the weights are read once."""
    try:
        scheme.check_available()
    except UsageError as refusal:
        raise ConversionError(str(refusal)) from None
    config = DiffTransformerConfig.from_pretrained(source)
    check_quantizable(config, scheme)
    kept = full_precision_modules(config)
    options = {"quantization_config": _torchao_config(scheme, kept)} if scheme.package == "torchao" else {}
    model = load_model_folder(source, DiffTransformerForCausalLM, what="run", dtype="auto", **options)
    write_config = _w8a8(model, kept) if scheme.name == "w8a8" else None
    record = {
        "scheme": scheme.name,
        "weights": scheme.weights,
        "inputs": scheme.inputs,
        "package": f"{scheme.distribution} {importlib.metadata.version(scheme.distribution)}",
        "full_precision": sorted(
            name for name, _ in model.named_modules() if name.rpartition(".")[2] in kept
        ),
        "source": str(source),
    }
    return QuantizedModel(model, record, write_config)
