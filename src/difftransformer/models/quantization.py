"""The quantization schemes of ``difftransformer quantize`` and ``eval lowbit``: what each does to a model's linear
layers, the modules it leaves in full precision, and applying it in memory to any causal LM (docs/quantization.md).

- ``int8``: int8 weights, one scale per output channel, symmetric (torchao's ``Int8WeightOnlyConfig``); inputs stay
  in floating point.
- ``int4``: int4 weights in groups of 32 inputs, one scale and zero point a group (torchao's
  ``IntxWeightOnlyConfig(int4, PerGroup(32))``). torchao 0.18 has no packed int4 layout on the CPU, so each value
  takes a byte: int4 numerics, not int4 memory.
- ``w8a8``: int8 weights, one scale per output channel, and int8 inputs, one scale per token computed as the layer
  runs (compressed-tensors' ``W8A8`` preset). Dynamic inputs need no calibration data: the weights' scales are their
  channels' largest magnitudes over 127.

The packages (the ``quant`` extra) are imported only when a scheme runs.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from difftransformer.errors import UsageError
from difftransformer.models.configuration import DiffTransformerConfig

GROUP_SIZE = 32  # int4's inputs a scale
EXTRA = "pip install 'difftransformer[quant]'"


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
        """Raise UsageError, naming the extra to install, where the scheme's package is missing."""
        if importlib.util.find_spec(self.package) is None:
            raise UsageError(
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


def tiling_problem(model: nn.Module, scheme: Scheme, kept: tuple[str, ...]) -> str | None:
    """Where ``scheme``'s groups do not tile the input width of a linear layer of ``model`` it converts (every one
    but ``kept``), what it is, e.g. "int4 quantizes in groups of 32 inputs; model.layers.0.mlp.down_proj takes 48";
    None where they do."""
    if scheme.group_size is None:
        return None
    for name, linear in quantized_linears(model, kept):
        if linear.in_features % scheme.group_size:
            return f"{scheme.name} quantizes in groups of {scheme.group_size} inputs; {name} takes {linear.in_features}"
    return None


def model_full_precision_modules(model: nn.Module) -> tuple[str, ...]:
    """:func:`full_precision_modules` for any causal LM: ours by its parts, another by its output head and the
    modules transformers keeps in float32 for it (``_keep_in_fp32_modules``)."""
    config = getattr(model, "config", None)
    if isinstance(config, DiffTransformerConfig):
        return full_precision_modules(config)
    return ("lm_head", *(getattr(model, "_keep_in_fp32_modules", None) or ()))


def torchao_method(scheme: Scheme):
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, PerGroup

    if scheme.group_size is None:
        return Int8WeightOnlyConfig()
    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(scheme.group_size))


def apply_w8a8(model: nn.Module, kept: tuple[str, ...]) -> None:
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
            torchao_method(scheme),
            filter_fn=lambda module, name: (
                isinstance(module, nn.Linear) and name.rpartition(".")[2] not in kept
            ),
        )
    else:
        apply_w8a8(model, kept)
    return kept
