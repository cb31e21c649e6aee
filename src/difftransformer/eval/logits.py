"""One way to see (and replace) the attention logits of any causal LM: ours or a transformers model.

Our models expose ``difftransformer.layers.attention_logits_hook``. For other transformers models (Llama,
DiffLlama, ...) we register an attention function with transformers' ``AttentionInterface`` that computes
eager attention and passes ``q k^T * scaling`` through the hook before the mask and softmax, then switch the
model to it with ``set_attn_implementation`` for the duration of the context.

The hook receives ``(module, logits)`` with logits of shape (B, n_maps, T, S) and returns the logits to
use. For DiffLlama both of its attention calls in a layer see the same q and k (they differ only in the
value half); the second call reuses the first call's hooked logits, so each map is seen exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from difftransformer.eval.common import is_difftransformer
from difftransformer.layers.hooks import LogitsHook

IMPLEMENTATION = "difftransformer_logits"

_active: dict = {"hook": None, "last": None}


def _repeat_kv(states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, h_kv, S, d) -> (B, h_kv * n_rep, S, d), each KV head repeated for its query heads."""
    return states if n_rep == 1 else states.repeat_interleave(n_rep, dim=1)


def hooked_eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention (transformers' attention-function signature) with the active hook on the logits.

    query (B, H, T, d), key/value (B, H_kv, S, d); returns output (B, T, H, d_v) and weights (B, H, T, S).
    """
    n_rep = query.shape[1] // key.shape[1]
    key_states, value_states = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    hook, last = _active["hook"], _active["last"]
    if last is not None and last[0] is module and last[1] is query and last[2] is key:
        logits = last[3]
    else:
        logits = torch.matmul(query, key_states.transpose(2, 3)).float() * scaling
        if hook is not None:
            logits = hook(module, logits)
        _active["last"] = (module, query, key, logits)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attention_mask, float("-inf"))
        else:
            logits = logits + attention_mask[..., : key_states.shape[-2]].float()
    weights = torch.softmax(logits, dim=-1).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value_states).transpose(1, 2).contiguous()
    return output, weights


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(IMPLEMENTATION, hooked_eager_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


@contextmanager
def attention_logits(model: nn.Module, hook: LogitsHook | None) -> Iterator[None]:
    """Route every attention layer of ``model`` through materialized attention with ``hook`` on its logits.

    ``hook(module, logits)`` gets the scaled logits (B, n_maps, T, S) before mask and softmax and returns
    the logits to use. Maps: for our DIFF V1 models 2h component maps (2i: Q1K1^T of head i, 2i+1:
    Q2K2^T); for DiffLlama its 2h component heads (j and j + h pair up); for softmax models one per query
    head. ``hook=None`` only forces the materialized (eager) path, which ``output_attentions`` needs.
    """
    if is_difftransformer(model):
        from difftransformer.layers import attention_logits_hook

        def identity(module: nn.Module, logits: torch.Tensor) -> torch.Tensor:
            return logits

        with attention_logits_hook(model, hook or identity):
            yield
        return
    if not hasattr(model, "set_attn_implementation"):
        raise TypeError(
            f"{type(model).__name__} is neither a difftransformer model nor a transformers PreTrainedModel; "
            "its attention logits cannot be hooked"
        )
    _register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(IMPLEMENTATION)
    if model.config._attn_implementation != IMPLEMENTATION:
        raise TypeError(
            f"{type(model).__name__} does not dispatch attention through transformers' AttentionInterface, "
            "so its attention logits cannot be hooked"
        )
    _active["hook"], _active["last"] = hook, None
    try:
        yield
    finally:
        _active["hook"], _active["last"] = None, None
        model.set_attn_implementation(previous)


def visible_keys(t: int, s: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Causal visibility (T, S) bool for T queries that are the last T of S positions (a KV cache prefix)."""
    queries = torch.arange(t, device=device)[:, None] + (s - t)
    return torch.arange(s, device=device)[None, :] <= queries
