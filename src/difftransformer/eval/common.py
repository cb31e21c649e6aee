"""What every evaluation task shares: loading a checkpoint, validating and fitting lengths, seeding, held-out text
and the held-out loss (statistics are in :mod:`difftransformer.stats`, plots in :mod:`difftransformer.plotting`,
results files are written with :mod:`difftransformer.storage`)."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from difftransformer.errors import MissingInputError, UsageError, check_seed
from difftransformer.storage import write_json


def seed_everything(seed: int) -> np.random.Generator:
    """Seed Python, NumPy and torch; return a NumPy generator for the task's own draws. A seed they cannot all take
    is refused, naming `seed`."""
    check_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def load_model_and_tokenizer(
    path: str | os.PathLike,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str | None = None,
    need_tokenizer: bool = True,
    what: str = "model",
) -> tuple[nn.Module, Any]:
    """Load any local transformers causal LM (ours, a Llama, a DiffLlama) and its tokenizer, in eval mode.

    Raises a :class:`~difftransformer.errors.UsageError` naming the path when it is not a checkpoint directory or
    has no tokenizer, before any weights are read, and one naming the folder when transformers cannot load it or its
    weights disagree with its config (:func:`~difftransformer.models.folders.load_model_folder`);
    ``what`` is the option that named the folder (``model``, a judge's ``judge``), for the messages.
    """
    from transformers import AutoConfig, AutoTokenizer

    import difftransformer  # noqa: F401  (registers model_type "difftransformer" with the Auto classes)
    from difftransformer.data.tokenizer import TOKENIZER_FILES
    from difftransformer.models.folders import load_model_folder, open_folder

    path = Path(path)
    if not (path / "config.json").is_file():
        raise MissingInputError(
            f"`{what}` must be a checkpoint directory with a config.json; got {str(path)!r}"
        )
    # The config first: a value out of its bounds is refused before anything else reads the folder.
    config = open_folder(AutoConfig.from_pretrained, path, what=what, thing="config")
    tokenizer = None
    if need_tokenizer:
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise UsageError(
                f"`{what}` {str(path)!r} has no tokenizer (expected one of {', '.join(TOKENIZER_FILES)}); "
                "save the tokenizer next to the weights (tokenizer.save_pretrained(path))"
            )
        tokenizer = open_folder(
            AutoTokenizer.from_pretrained, path, what=what, thing="tokenizer", config=config
        )
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise UsageError(f"`dtype` must be a torch dtype name such as float32 or bfloat16; got {dtype!r}")
    kwargs: dict[str, Any] = {"dtype": torch_dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        target = torch.device(device)
    except RuntimeError as err:
        raise UsageError(f"`device` must name a torch device such as cpu or cuda; got {device!r}") from err
    if target.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"`device` {device}: CUDA is not available on this machine")
    model = load_model_folder(path, what=what, **kwargs)
    return model.to(target).eval(), tokenizer


def is_difftransformer(model: nn.Module) -> bool:
    """True for our own models, whose attention modules carry a ``logits_hook`` slot."""
    return any(hasattr(m, "logits_hook") for m in model.modules())


def max_context(model: nn.Module) -> int | None:
    """The longest sequence the model's config admits (max_position_embeddings), or None if it names none."""
    config = getattr(model, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def check_context_length(model: nn.Module, length: int, what: str = "`context_lengths`") -> None:
    """Refuse a sequence length the model cannot take, before any long work; ``what`` names where the length
    came from (its option in backticks, as the messages of the library do)."""
    if length < 1:
        raise UsageError(f"{what} must be positive; got {length}")
    limit = max_context(model)
    if limit is not None and length > limit:
        raise UsageError(
            f"{what}: {length} tokens exceeds the model's max_position_embeddings = {limit}; "
            "choose a shorter length or a model trained (or extended) for longer contexts"
        )


def fit_length(options: Any, model: nn.Module, given: frozenset[str]) -> Any:
    """``options`` with its ``length`` capped at the model's context, unless the user gave ``length`` (then the
    task's check refuses a length the model cannot take)."""
    limit = max_context(model)
    if "length" in given or limit is None:
        return options
    return dataclasses.replace(options, length=min(options.length, limit))


def capped(lengths: Sequence[int], limit: int) -> list[int]:
    """``lengths`` capped at ``limit``, distinct, in their order: [256, 1024] at 512 -> [256, 512]."""
    return list(dict.fromkeys(min(length, limit) for length in lengths))


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def load_texts(
    text_files: Sequence[str | os.PathLike] | None = None,
    data: str | None = None,
    split: str = "test",
    what: str = "text_file",
) -> list[str]:
    """Held-out documents: the user's text files (one document each) or a split of the built-in corpus.

    Args:
        text_files: paths of UTF-8 text files; when given, the corpus is not touched. ``what`` is the option
            that named them, for the messages.
        data: corpus name or path passed to ``difftransformer.data.load_corpus`` (None = built-in).
        split: "test" or "validation".
    """
    if text_files:
        texts = []
        for name in text_files:
            path = Path(name)
            if not path.is_file():
                raise MissingInputError(f"`{what}` {str(path)!r} does not exist")
            try:
                texts.append(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as err:
                raise UsageError(f"`{what}` {str(path)!r}: cannot read it as UTF-8 text: {err}") from err
        if not any(t.strip() for t in texts):
            raise UsageError(f"`{what}` {list(map(str, text_files))} contain no text")
        return texts
    if split not in ("test", "validation"):
        raise UsageError(f"`split` must be 'test' or 'validation' (held-out text); got {split!r}")
    from difftransformer.data import load_corpus

    splits = load_corpus(data)
    texts = list(getattr(splits, split))
    if not texts:
        raise UsageError(f"the {split} split of corpus {getattr(splits, 'name', data)!r} is empty")
    return texts


def token_stream(tokenizer, texts: Sequence[str], min_tokens: int) -> list[int]:
    """Tokenize documents (without special tokens) and concatenate until at least ``min_tokens`` ids.

    Documents are separated by the tokenizer's EOS id when it has one. Raises when the texts are too short.
    """
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
        if len(ids) >= min_tokens:
            return ids
    raise UsageError(f"the held-out texts give {len(ids)} tokens; at least {min_tokens} are needed")


@torch.no_grad()
def held_out_windows(token_ids: Sequence[int], length: int, count: int) -> torch.Tensor:
    """The first ``count`` windows of ``length`` tokens of ``token_ids`` as (count, length) ids; a UsageError naming
    `num_sequences` and `length` where the text is too short."""
    need = length * count
    if len(token_ids) < need:
        raise UsageError(
            f"held-out text gives {len(token_ids)} tokens; `num_sequences` {count} x `length` {length} are needed"
        )
    return torch.tensor(list(token_ids[:need]), dtype=torch.long).view(count, length)


def mean_token_nll(model: nn.Module, sequences: torch.Tensor, batch_size: int = 16) -> float:
    """Next-token NLL (nats) averaged over every predicted token of ``sequences`` (n, L), ``batch_size``
    sequences per forward pass (each sequence scores its own L - 1 predictions)."""
    if sequences.dim() != 2 or sequences.shape[0] == 0 or sequences.shape[1] < 2:
        raise UsageError(
            f"`sequences` must be (n >= 1, L >= 2) token ids; got shape {tuple(sequences.shape)}"
        )
    if batch_size < 1:
        raise UsageError(f"`batch_size` must be >= 1; got {batch_size}")
    was_training = model.training
    model.eval()
    device = model_device(model)
    total, count = 0.0, 0
    for start in range(0, sequences.shape[0], batch_size):
        ids = sequences[start : start + batch_size].to(device)
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        tokens = ids[:, 1:].numel()
        total, count = total + loss.item() * tokens, count + tokens
    model.train(was_training)
    return total / count


def save_results(results: dict, output_dir: str | os.PathLike | None, plot: Callable[[str], None]) -> dict:
    """Write a task's ``results`` as ``<task>.json`` into ``output_dir`` and draw them with ``plot(path)`` as
    ``<task>.png`` beside it (nothing when ``output_dir`` is None); returns ``results``."""
    if output_dir is not None:
        write_json(f"{output_dir}/{results['task']}.json", results)
        plot(f"{output_dir}/{results['task']}.png")
    return results
