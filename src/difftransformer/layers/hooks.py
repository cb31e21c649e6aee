"""Expose attention logits to analysis code (outlier statistics, logit quantization)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

# hook(module, logits) -> logits: the scaled pre-softmax logits (B, n_maps, T, S) of one attention module.
LogitsHook = Callable[[nn.Module, torch.Tensor], torch.Tensor]


@contextmanager
def attention_logits_hook(model: nn.Module, hook: LogitsHook) -> Iterator[list[nn.Module]]:
    """Route every attention module of ``model`` through the materialized path with ``hook`` on its logits.

    ``hook(module, logits)`` receives the scaled logits (B, n_maps, T, S) before masking and softmax and
    returns the logits to use. DIFF V1: n_maps = 2h, map 2i is Q1 K1^T of head i and 2i+1 is Q2 K2^T;
    DIFF V2: the 2h query heads; softmax: the heads. For its duration the modules' configuration runs the "eager"
    attention implementation (the materialized one, which applies the hook), and the model builds its masks for
    it. Yields the hooked modules, in depth order.
    """
    modules = [m for m in model.modules() if hasattr(m, "logits_hook")]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no difftransformer attention modules to hook")
    configs = list({id(m.config): m.config for m in modules}.values())
    previous = [m.logits_hook for m in modules]
    implementations = [config._attn_implementation for config in configs]
    for module in modules:
        module.logits_hook = hook
    for config in configs:
        config._attn_implementation = "eager"
    try:
        yield modules
    finally:
        for module, old in zip(modules, previous):
            module.logits_hook = old
        for config, implementation in zip(configs, implementations):
            config._attn_implementation = implementation
