"""Continue a prompt with a trained model folder, greedy or sampled (``difftransformer generate`` is
:mod:`difftransformer.generate_cli`)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    set_seed,
)

import difftransformer  # noqa: F401  (registers the "difftransformer" model type with the Auto classes)
from difftransformer.errors import MissingInputError, UsageError


def check_sampling(
    *,
    max_new_tokens: int = 100,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> None:
    """Refuse sampling settings :func:`generate_text` cannot use (a UsageError naming the flag)."""
    if max_new_tokens < 1:
        raise UsageError(f"`max_new_tokens` must be >= 1; got {max_new_tokens}")
    if temperature < 0:
        raise UsageError(f"`temperature` must be >= 0; got {temperature}")
    if top_k is not None and top_k < 1:
        raise UsageError(f"`top_k` must be >= 1; got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise UsageError(f"`top_p` must be in (0, 1]; got {top_p}")


def load_for_generation(
    model_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model of a trained run folder (or checkpoint-N folder), in eval mode, and its tokenizer (from
    ``tokenizer_dir`` when given: a checkpoint-N folder has none). A folder without config.json is refused
    (:class:`~difftransformer.errors.MissingInputError`) before anything is loaded."""
    if not (Path(model_dir) / "config.json").is_file():
        raise MissingInputError(
            f"model must be a folder with config.json (a trained run); got {str(model_dir)!r}"
        )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    return model, tokenizer


def generate_text(
    model,
    tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 100,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
) -> str:
    """The prompt's continuation (without the prompt): greedy at ``temperature`` 0, else sampled (optionally among
    the ``top_k`` most likely tokens or the ``top_p`` nucleus) from ``seed``; bad settings are refused
    (:func:`check_sampling`)."""
    check_sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    if ids.shape[1] == 0:
        ids = torch.tensor([[tokenizer.eos_token_id]])
    sample = temperature > 0
    options = dict(do_sample=sample, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.eos_token_id)
    if sample:
        options.update(temperature=temperature, top_k=top_k or 0, top_p=top_p or 1.0)
    set_seed(seed)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
