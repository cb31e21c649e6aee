"""Greedy continuations of a base model, stopped at the first newline: how the hallucination task's model answers
and summarises (docs/evaluation.md, "Contextual hallucination")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from difftransformer.errors import UsageError
from difftransformer.eval.common import model_device

Generate = Callable[[str], str]  # prompt -> continuation up to (not including) its first newline


def greedy_generator(
    model: nn.Module, tokenizer: Any, max_new_tokens: int, done: Callable[[str], bool] | None = None
) -> Generate:
    """Greedy decoding with ``model.generate`` of at most ``max_new_tokens`` tokens, stopped once the new
    text holds a newline (or ``done(new_text)`` holds); returns the decoded continuation before its first
    newline."""
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be >= 1; got {max_new_tokens}")
    eos = getattr(tokenizer, "eos_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=eos if pad is None else pad,
    )
    device = model_device(model)
    finished = done or (lambda text: "\n" in text)

    # Decoding the few new tokens at each step is exact and costs little; transformers' stop_strings prepares
    # the whole vocabulary on every generate call (a quarter of a second at 4096 tokens), more than a short
    # answer takes to generate.
    class TextStop(StoppingCriteria):
        def __init__(self, start: int):
            self.start = start

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
            stop = finished(tokenizer.decode(input_ids[0, self.start :], skip_special_tokens=True))
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    def generate(prompt: str) -> str:
        encoded = tokenizer(prompt, return_tensors="pt")
        input_ids, mask = encoded["input_ids"].to(device), encoded["attention_mask"].to(device)
        stop = StoppingCriteriaList([TextStop(input_ids.shape[1])])
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, generation_config=config, stopping_criteria=stop
        )
        new = out[0, input_ids.shape[1] :]
        return tokenizer.decode(new, skip_special_tokens=True).split("\n", 1)[0]

    return generate


def prompt_tokens(tokenizer: Any, prompt: str) -> int:
    """Tokens of ``prompt`` as :func:`greedy_generator` feeds it (with the special tokens the tokenizer
    adds)."""
    return len(tokenizer(prompt)["input_ids"])
