"""Greedy decoding, the one way the tasks generate: needle's magic numbers, hallucination's answers and summaries.

:func:`greedy_ids` continues token ids one argmax at a time, reusing the KV cache when the model returns one. It is
one loop that every causal LM runs, a transformers model or any module whose forward returns ``logits`` (the tasks'
test oracles have no ``generate``), and its tokens are those of transformers' greedy ``generate``
(tests/test_hallucination.py checks it). :func:`greedy_generator` wraps it for text prompts, stopped at the first
newline (docs/evaluation.md, "Contextual hallucination", says why a base model is prompted so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from difftransformer.errors import UsageError
from difftransformer.eval.common import model_device

Generate = Callable[[str], str]  # prompt -> continuation up to (not including) its first newline


@torch.no_grad()
def greedy_ids(
    model: nn.Module,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    eos_token_id: int | None = None,
    done: Callable[[list[int]], bool] | None = None,
) -> list[int]:
    """At most ``max_new_tokens`` greedy tokens after ``prompt_ids``; stops after the EOS id, or once
    ``done(new_ids)`` holds. Uses the KV cache when the model returns one."""
    if max_new_tokens < 1:
        raise UsageError(f"`max_new_tokens` must be >= 1; got {max_new_tokens}")
    device = model_device(model)
    step_input = torch.tensor([list(prompt_ids)], device=device)
    generated: list[int] = []
    past = None
    for _ in range(max_new_tokens):
        out = model(input_ids=step_input, past_key_values=past, use_cache=True)
        next_id = int(out.logits[0, -1].argmax())
        generated.append(next_id)
        if next_id == eos_token_id or (done is not None and done(generated)):
            break
        past = getattr(out, "past_key_values", None)
        new = torch.tensor([[next_id]], device=device)
        step_input = new if past is not None else torch.cat([step_input, new], dim=1)
    return generated


def greedy_generator(
    model: nn.Module, tokenizer: Any, max_new_tokens: int, done: Callable[[str], bool] | None = None
) -> Generate:
    """A text prompt's greedy continuation (:func:`greedy_ids`, the prompt encoded with the special tokens the
    tokenizer adds) of at most ``max_new_tokens`` tokens, stopped once the new text holds a newline (or
    ``done(new_text)`` holds); returns the decoded continuation before its first newline."""
    if max_new_tokens < 1:  # refused when the generator is made, before any prompt
        raise UsageError(f"`max_new_tokens` must be >= 1; got {max_new_tokens}")
    finished = done or (lambda text: "\n" in text)
    eos = getattr(tokenizer, "eos_token_id", None)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    def generate(prompt: str) -> str:
        ids = greedy_ids(
            model, tokenizer(prompt)["input_ids"], max_new_tokens, eos_token_id=eos,
            done=lambda new: finished(decode(new)),
        )  # fmt: skip
        return decode(ids).split("\n", 1)[0]

    return generate


def prompt_tokens(tokenizer: Any, prompt: str) -> int:
    """Tokens of ``prompt`` as :func:`greedy_generator` feeds it (with the special tokens the tokenizer adds)."""
    return len(tokenizer(prompt)["input_ids"])
