"""Quantized copies of a model folder, in the formats models are deployed in.

Each scheme quantizes the linear layers' weights, and W8A8 their inputs as well; the modules a kind keeps in full
precision (the parts' ``full_precision``: the scalar lambda's vectors, the per-token lambda's projection) and the
output head stay as they are, as do the embeddings and the norms, which are not linear layers.

- ``int8``: int8 weights, one scale per output channel, symmetric (torchao's ``Int8WeightOnlyConfig``); inputs stay
  in floating point.
- ``int4``: int4 weights in groups of 32 inputs, one scale and zero point a group (torchao's
  ``IntxWeightOnlyConfig(int4, PerGroup(32))``). torchao 0.18 has no packed int4 layout on the CPU, so each value
  takes a byte: int4 numerics, not int4 memory.
- ``w8a8``: int8 weights, one scale per output channel, and int8 inputs, one scale per token computed as the layer
  runs (compressed-tensors' ``W8A8`` preset in its ``int-quantized`` format, which vLLM serves). Dynamic inputs
  need no calibration data: the weights' scales are their channels' largest magnitudes over 127. llm-compressor,
  whose calibrated recipes (SmoothQuant, GPTQ) would need data, pins transformers <= 5.17 and cannot be installed
  beside this package.

The folder written loads with transformers' ``from_pretrained`` where the scheme's package is installed (the
``quant`` extra), strictly, as every folder of ours does.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from difftransformer.convert.folders import ConversionError
from difftransformer.models import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.models.folders import load_model_folder

if TYPE_CHECKING:
    from transformers import TorchAoConfig

GROUP_SIZE = 32  # int4's inputs a scale
EXTRA = "pip install 'difftransformer[quant]'"
QUANTIZATION_JSON = (
    "quantization.json"  # what made the folder: scheme, packages, modules left in full precision
)


@dataclass(frozen=True)
class Scheme:
    """One quantization scheme: its name, what it does to weights and to inputs, and the package that runs it."""

    name: str
    weights: str
    inputs: str
    package: str  # the import name, checked before any work
    distribution: str  # its name on PyPI
    group_size: int | None = (
        None  # inputs a scale, where not a whole row: every quantized width must be a multiple
    )

    def check_available(self) -> None:
        """Raise ConversionError, naming the extra to install, where the scheme's package is missing."""
        if importlib.util.find_spec(self.package) is None:
            raise ConversionError(
                f"`scheme` {self.name} needs {self.distribution}, which is not installed: {EXTRA}"
            )


SCHEMES = {
    "int8": Scheme("int8", "int8, a scale per output channel", "floating point", "torchao", "torchao"),
    "int4": Scheme(
        "int4",
        f"int4, a scale and zero point per {GROUP_SIZE} inputs",
        "floating point",
        "torchao",
        "torchao",
        group_size=GROUP_SIZE,
    ),
    "w8a8": Scheme(
        "w8a8",
        "int8, a scale per output channel",
        "int8, a scale per token (dynamic)",
        "compressed_tensors",
        "compressed-tensors",
    ),
}


def full_precision_modules(config: DiffTransformerConfig) -> tuple[str, ...]:
    """The names (last component) of the modules every scheme leaves in full precision: the output head and the
    parts' ``full_precision``."""
    return ("lm_head", *config.parts.full_precision)


def quantized_linears(model: nn.Module, kept: tuple[str, ...]) -> Iterator[tuple[str, nn.Linear]]:
    """The linear layers a scheme converts: every ``nn.Linear`` whose name's last component is not in ``kept``."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.rpartition(".")[2] not in kept:
            yield name, module


def check_tiles(model: nn.Module, scheme: Scheme, kept: tuple[str, ...], what: str = "scheme") -> None:
    """Raise ConversionError, naming ``what`` asked for ``scheme``, where its groups do not tile the input width of a
    linear layer of ``model`` it converts (every one but ``kept``)."""
    if scheme.group_size is None:
        return
    for name, linear in quantized_linears(model, kept):
        if linear.in_features % scheme.group_size:
            raise ConversionError(
                f"`{what}` {scheme.name} quantizes in groups of {scheme.group_size} inputs; {name} takes "
                f"{linear.in_features}"
            )


def check_quantizable(config: DiffTransformerConfig, scheme: Scheme) -> None:
    """Raise ConversionError, before any weight is read, where ``scheme`` cannot take the shapes of the model
    ``config`` describes (a scheme's groups must tile every input width)."""
    with torch.device("meta"):
        model = DiffTransformerForCausalLM(config)
    check_tiles(model, scheme, full_precision_modules(config))


def model_full_precision_modules(model: nn.Module) -> tuple[str, ...]:
    """:func:`full_precision_modules` for any causal LM: ours by its parts, another by its output head and the
    modules transformers keeps in float32 for it (``_keep_in_fp32_modules``)."""
    config = getattr(model, "config", None)
    if isinstance(config, DiffTransformerConfig):
        return full_precision_modules(config)
    return ("lm_head", *(getattr(model, "_keep_in_fp32_modules", None) or ()))


def _torchao_method(scheme: Scheme):
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, PerGroup

    if scheme.group_size is None:
        return Int8WeightOnlyConfig()
    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(scheme.group_size))


def _torchao_config(scheme: Scheme, kept: tuple[str, ...]) -> TorchAoConfig:
    from transformers import TorchAoConfig

    # transformers matches these against parameter names: a pattern, as a bare module name would not match
    return TorchAoConfig(
        _torchao_method(scheme), modules_to_not_convert=[rf"(?:.*\.)?{re.escape(name)}" for name in kept]
    )


def _apply_w8a8(model: nn.Module, kept: tuple[str, ...]) -> None:
    """Give ``model``'s linear layers (less ``kept``) compressed-tensors' W8A8 int8 scheme, frozen: each weight's
    scales are set from its channels, and every forward rounds weights and inputs as the compressed folder does."""
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    config = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme("W8A8", targets=["Linear"])},
        ignore=[f"re:(?:.*\\.)?{re.escape(name)}$" for name in kept],
        format="int-quantized",
    )
    apply_quantization_config(model, config)
    with torch.no_grad():
        for module in model.modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None:
                continue
            weight = module.weight
            scale, zero = calculate_qparams(
                weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True), scheme.weights
            )
            module.weight_scale.copy_(scale.to(module.weight_scale.dtype))
            module.weight_zero_point.copy_(zero.to(module.weight_zero_point.dtype))
            module.quantization_status = QuantizationStatus.FROZEN


def _w8a8(model: DiffTransformerForCausalLM, kept: tuple[str, ...]) -> Callable[[Path], None]:
    """Quantize ``model`` in place to compressed-tensors' W8A8 int8, compressed (int8 weights and their scales);
    returns what writes its configuration into a saved folder's config.json."""
    from compressed_tensors.compressors import ModelCompressor

    _apply_w8a8(model, kept)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="int-quantized")
    compressor.compress_model(model)
    return lambda folder: compressor.update_config(str(folder))


def quantize_weights(model: nn.Module, scheme: Scheme) -> tuple[str, ...]:
    """Quantize any causal LM's linear layers in place, in memory, with the numerics of the folder ``quantize``
    writes for ``scheme`` (torchao's tensor subclasses; W8A8's frozen rounding of weights and inputs); the modules
    of :func:`model_full_precision_modules` stay as they are. Returns their names (last component)."""
    scheme.check_available()
    kept = model_full_precision_modules(model)
    if scheme.package == "torchao":
        from torchao.quantization import quantize_

        quantize_(
            model,
            _torchao_method(scheme),
            filter_fn=lambda module, name: (
                isinstance(module, nn.Linear) and name.rpartition(".")[2] not in kept
            ),
        )
    else:
        _apply_w8a8(model, kept)
    return kept


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
    scheme.check_available()
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
