"""DIFF's lambda in view while training: per layer, at every logging step, beside the training loss.

- The scalar lambda (DIFF V1, GDA): the layer's lambda (``lambda_full()``), read from the weights when the row is
  logged, so the value at step N is the one the model (and a checkpoint written at step N) holds.
- The per-token lambda (DIFF V2, Motif): the mean and standard deviation of sigmoid(lambda) over every token and head of the training batches
  since the previous logging step, gathered by a forward hook on each layer's ``lambda_proj``. Per-token lambda
  depends on the input, so a fixed probe would show what the model does on one batch; the training batches show
  what it did on the mixture it learns from, at no extra forward pass (the hook sums the gate and its square).

The columns are named per layer (:func:`trace_columns`): ``lambda_layer_0`` ... for V1, ``lambda_mean_layer_0``,
``lambda_std_layer_0`` ... for the per-token one; kinds without noise maps have none. Trainer writes them to ``metrics.csv`` and to
every ``report_to`` integration (TensorBoard: ``train/lambda_layer_0``).
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from difftransformer.layers import PartsAttention

_TRACE_COLUMN = re.compile(r"lambda_(mean_|std_)?layer_\d+")


def is_trace_column(name: str) -> bool:
    """Whether ``name`` is one of the per-layer lambda columns of :func:`trace_columns`."""
    return _TRACE_COLUMN.fullmatch(name) is not None


def _attention_layers(model: nn.Module) -> list[nn.Module]:
    """The model's attention modules with a noise map (and so a lambda), in depth order."""
    layers = [m for m in model.modules() if isinstance(m, PartsAttention) and m.parts.differential]
    return sorted(layers, key=lambda module: module.layer_idx)


def trace_columns(model: nn.Module) -> tuple[str, ...]:
    """The lambda columns a run of ``model`` logs, in depth order (none for the softmax baseline)."""
    columns: list[str] = []
    for layer in _attention_layers(model):
        if layer.parts.lambda_mode == "token":
            columns += [f"lambda_mean_layer_{layer.layer_idx}", f"lambda_std_layer_{layer.layer_idx}"]
        else:
            columns.append(f"lambda_layer_{layer.layer_idx}")
    return tuple(columns)


class _GateStatistics:
    """Running count, sum and sum of squares of sigmoid(lambda_proj(x)) over the training forwards of one V2
    layer (float64, so millions of tokens add up exactly enough)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count, self.total, self.squares = 0, 0.0, 0.0

    def __call__(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if not module.training:  # validation and probes run in eval mode: only the training batches count
            return
        with torch.no_grad():
            gate = torch.sigmoid(output.detach().to(torch.float64))
            self.count += gate.numel()
            self.total += float(gate.sum())
            self.squares += float(gate.square().sum())

    def mean_and_std(self) -> tuple[float, float]:
        """Mean and (population) standard deviation since the last reset; NaN for both with no forward."""
        if self.count == 0:
            return math.nan, math.nan
        mean = self.total / self.count
        return mean, math.sqrt(max(self.squares / self.count - mean * mean, 0.0))


class LambdaTraces:
    """The lambda columns of a training run of ``model``: :meth:`values` at every logging step.

    Registers a forward hook on every per-token lambda's ``lambda_proj`` (:meth:`remove` takes them off). Build it on
    the model before the Trainer wraps it (hooks stay on the module under DDP and FSDP).
    """

    def __init__(self, model: nn.Module) -> None:
        self.columns = trace_columns(model)
        layers = _attention_layers(model)
        self._v1 = [layer for layer in layers if layer.parts.lambda_mode == "scalar"]
        self._v2: list[tuple[int, _GateStatistics]] = []
        self._handles = []
        for layer in layers:
            if layer.parts.lambda_mode == "token":
                statistics = _GateStatistics()
                self._handles.append(layer.lambda_proj.register_forward_hook(statistics))
                self._v2.append((layer.layer_idx, statistics))

    def __bool__(self) -> bool:
        return bool(self.columns)

    @torch.no_grad()
    def values(self) -> dict[str, float]:
        """Every column's value now: V1's lambda as the weights give it, V2's gate statistics since the previous
        call (which starts the next window)."""
        row = {}
        for layer in self._v1:
            value = layer.lambda_full()
            # Under FSDP the parameters are shards between forwards: lambda comes out as a distributed tensor.
            if hasattr(value, "full_tensor"):
                value = value.full_tensor()
            row[f"lambda_layer_{layer.layer_idx}"] = float(value)
        for index, statistics in self._v2:
            mean, std = statistics.mean_and_std()
            row[f"lambda_mean_layer_{index}"], row[f"lambda_std_layer_{index}"] = mean, std
            statistics.reset()
        return row

    def remove(self) -> None:
        """Take the forward hooks off the model."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
