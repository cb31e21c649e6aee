"""Continue a prompt with a trained model folder, greedy or sampled (``difftransformer generate`` is
:mod:`difftransformer.generate_cli`).

:class:`GenerationSettings` declares the options once (their flags are generated from its fields) and checks them
when made. :func:`load_for_generation` reads a folder's config and tokenizer before its weights, so that
:func:`check_context` refuses a prompt and a length the model cannot take before the weights are read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    set_seed,
)

import difftransformer  # noqa: F401  (registers the "difftransformer" model type with the Auto classes)
from difftransformer.data.tokenizer import load_tokenizer
from difftransformer.errors import UsageError, check_seed
from difftransformer.models.folders import load_model_folder, open_folder
from difftransformer.storage import check_input_dir


@dataclass(frozen=True)
class GenerationSettings:
    """How a prompt is continued: greedy at ``temperature`` 0, else sampled (optionally among the ``top_k`` most
    likely tokens or the ``top_p`` nucleus) from ``seed``. Each field is a ``generate`` flag."""

    _argument_group_name = "generation"

    prompt: str | None = field(
        default=None, metadata={"help": "text to continue (unset: read standard input)"}
    )
    max_new_tokens: int = field(
        default=100,
        metadata={"help": "tokens to generate; prompt and continuation must fit the model's context"},
    )
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature; 0 decodes greedily"})
    top_k: int | None = field(default=None, metadata={"help": "sample only among the k most likely tokens"})
    top_p: float | None = field(
        default=None, metadata={"help": "sample from the smallest set of tokens with this much probability"}
    )
    seed: int = field(default=0, metadata={"help": "seed for sampling"})
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "tokenizer folder, when the model folder has none (e.g. a checkpoint-N folder)"},
    )

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise UsageError(f"`max_new_tokens` must be >= 1; got {self.max_new_tokens}")
        if self.temperature < 0:
            raise UsageError(f"`temperature` must be >= 0; got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise UsageError(f"`top_k` must be >= 1; got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise UsageError(f"`top_p` must be in (0, 1]; got {self.top_p}")
        sampling = [f"`{name}` {getattr(self, name)}" for name in ("top_k", "top_p") if getattr(self, name)]
        if sampling and self.temperature == 0:
            raise UsageError(
                f"{' and '.join(sampling)} choose among tokens when sampling, but `temperature` 0 decodes greedily; "
                "give `temperature` > 0 with them (1 samples from the model's distribution), or leave them out"
            )
        check_seed(self.seed)


def load_for_generation(
    model_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None
) -> tuple[PretrainedConfig, PreTrainedTokenizerBase]:
    """The config of a trained run folder (or checkpoint-N folder) and its tokenizer (from ``tokenizer_dir`` when
    given: a checkpoint-N folder has none), without reading the weights (:func:`load_model`). A folder without
    config.json, or whose config or tokenizer cannot be read, is refused in one line."""
    check_input_dir(model_dir, "model", "a trained model (config.json, weights, tokenizer)")
    if not (Path(model_dir) / "config.json").is_file():
        raise UsageError(f"`model` must be a folder with config.json (a trained run); got {str(model_dir)!r}")
    if tokenizer_dir is not None:
        check_input_dir(tokenizer_dir, "tokenizer", "a saved tokenizer")
    config = open_folder(AutoConfig.from_pretrained, model_dir, thing="config", local_files_only=True)
    return config, load_tokenizer(tokenizer_dir or model_dir, field="tokenizer" if tokenizer_dir else "model")


def load_model(model_dir: str | os.PathLike) -> PreTrainedModel:
    """The model of a trained folder, in eval mode; damaged weights (missing, truncated, disagreeing with
    config.json) are refused in one line."""
    return load_model_folder(model_dir, local_files_only=True).eval()


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> torch.Tensor:
    """The prompt's token ids, (1, T); an empty prompt starts from the EOS token."""
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    return ids if ids.shape[1] else torch.tensor([[tokenizer.eos_token_id]])


def check_context(config: PretrainedConfig, prompt_tokens: int, settings: GenerationSettings) -> None:
    """Refuse a prompt and continuation longer than the model's ``max_position_embeddings`` (as ``eval`` refuses
    lengths beyond the context): positions past it were never trained, and our models refuse them."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit and prompt_tokens + settings.max_new_tokens > limit:
        room = limit - prompt_tokens
        fix = (
            f"lower `max_new_tokens` to at most {room} or shorten the prompt"
            if room >= 1
            else f"shorten the prompt to at most {limit - settings.max_new_tokens} tokens (at most {limit - 1} "
            "with `max_new_tokens` 1)"
        )
        raise UsageError(
            f"the prompt ({prompt_tokens} tokens) and `max_new_tokens` {settings.max_new_tokens} exceed the model's "
            f"max_position_embeddings = {limit}; {fix}"
        )


def generate_text(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    settings: GenerationSettings | None = None,
) -> str:
    """The prompt's continuation (without the prompt) under ``settings`` (default: 100 greedy tokens); a prompt
    and length beyond the model's context are refused (:func:`check_context`)."""
    settings = settings or GenerationSettings()
    ids = prompt_ids(tokenizer, prompt)
    check_context(model.config, ids.shape[1], settings)
    sample = settings.temperature > 0
    options = dict(
        do_sample=sample, max_new_tokens=settings.max_new_tokens, pad_token_id=tokenizer.eos_token_id
    )
    if sample:
        options.update(
            temperature=settings.temperature, top_k=settings.top_k or 0, top_p=settings.top_p or 1.0
        )
    set_seed(settings.seed)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
