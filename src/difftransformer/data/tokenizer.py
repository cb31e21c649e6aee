"""Byte-level BPE tokenizer trained on the training split, as a transformers tokenizer."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from difftransformer.errors import MissingInputError, UsageError

EOS_TOKEN = "<|endoftext|>"  # ends every document; also the BOS token, as in GPT-2
PAD_TOKEN = "<|pad|>"  # separate from EOS so that masking padding never masks a document end
MIN_VOCAB_SIZE = 256 + 2  # every byte plus the two special tokens


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (GPT-2 pre-tokenisation, no normalisation, so decoding gives back the exact text)
    on ``texts``. Special tokens: ``<|endoftext|>`` (id 0; EOS and BOS) and ``<|pad|>`` (id 1). The result is
    the same for the same texts and vocabulary size. Save it with ``save_pretrained(dir)``; it then loads with
    ``AutoTokenizer.from_pretrained(dir)``."""
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise UsageError(
            f"`vocab_size` must be an integer >= {MIN_VOCAB_SIZE} (256 bytes + 2 special), got {vocab_size!r}"
        )
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of documents, got a single str")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stdout.isatty(),  # its bar writes blank lines when not on a terminal
    )
    seen = 0

    def counted(items: Iterable[str]) -> Iterable[str]:
        nonlocal seen
        for item in items:
            if not isinstance(item, str):
                raise TypeError(f"texts must hold str documents, got {type(item).__name__}")
            seen += len(item)
            yield item

    backend.train_from_iterator(counted(texts), trainer)
    if seen == 0:
        raise UsageError("`texts`: cannot train a tokenizer on no text")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )


# The files a saved transformers tokenizer is read from (one of them suffices).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str | Path, field: str = "tokenizer") -> PreTrainedTokenizerBase:
    """Load a saved tokenizer folder (ours, or any transformers tokenizer with an EOS token); never the hub. A
    folder that holds no tokenizer, or one transformers cannot read, is refused in one line naming ``field`` (the
    option the folder came in)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise MissingInputError(f"`{field}`: {str(path)!r} is not a folder holding a saved tokenizer")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise UsageError(
            f"`{field}`: {str(path)!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save one there "
            "with tokenizer.save_pretrained, or name a tokenizer folder"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"`{field}`: cannot load a tokenizer from {path}: {first_line}") from err
    if tokenizer.eos_token_id is None:
        raise UsageError(
            f"`{field}`: {path} defines no EOS token, which separates documents in packed blocks"
        )
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, path: str | Path) -> None:
    """``save_pretrained`` into a temporary folder beside ``path``, then move each file into ``path`` atomically,
    so a reader never sees a half-written file."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tokenizer.save_pretrained(tmp)
        for file in sorted(tmp.iterdir()):
            os.replace(file, path / file.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
