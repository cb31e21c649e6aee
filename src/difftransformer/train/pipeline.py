"""From a corpus to training tensors: tokenizer, packed blocks, and the retrieval mix-in, shared by ``train`` and
``compare`` so both see the same data for the same options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from difftransformer.data import load_tokenizer, open_corpus, packed_blocks, train_tokenizer
from difftransformer.train.mixture import MixedBlocks, RecallMix
from difftransformer.train.presets import Preset
from difftransformer.train.retrieval import mix_in, needle_training_blocks
from difftransformer.train.settings import DataOptions


@dataclass
class PreparedData:
    """Token blocks for training, validation (during training) and testing (after), the tokenizer, the held-out
    test documents (haystacks for retrieval checks, a list of str in memory), how many training blocks hold
    needles, and the recall rows drawn into training (:meth:`train_dataset`).

    Each ``*_blocks`` is an int64 ``torch.Tensor`` of shape (n, block_size) that views a memory-mapped cache file
    (:func:`difftransformer.data.packed_blocks`; copy-on-write, so indexing reads only the rows asked for and
    writing never changes the file). With needles mixed in, ``train_blocks`` is the in-memory mix instead."""

    tokenizer: object
    train_blocks: torch.Tensor
    validation_blocks: torch.Tensor
    test_blocks: torch.Tensor
    test_texts: list[str]
    needle_blocks: int
    corpus_name: str
    recall: RecallMix = RecallMix()
    seed: int = 0

    def train_dataset(self) -> MixedBlocks:
        """The training blocks with :attr:`recall`'s rows drawn in (from the data's seed: every run alike)."""
        return MixedBlocks(
            self.train_blocks,
            self.recall,
            len(self.tokenizer),
            special_ids=frozenset(self.tokenizer.all_special_ids),
            seed=self.seed,
        )


def prepare_data(
    *,
    data: list[str] | None,
    tokenizer_path: str | None,
    vocab_size: int,
    block_size: int,
    needle_fraction: float,
    needle_digits: int = 6,
    recall: RecallMix | None = None,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    num_proc: int | None = None,
) -> PreparedData:
    """Load ``data`` (None: the built-in Shakespeare), train a byte-level BPE on its training split (or load
    ``tokenizer_path``), pack every split into blocks, and replace ``needle_fraction`` of the training blocks with
    multi-needle retrieval examples whose haystacks come from the training text; ``recall`` rows are drawn in as
    the data is served (:meth:`PreparedData.train_dataset`). The corpus is streamed, never
    held in memory; ``num_proc`` processes tokenise it (default: the CPU count) when its blocks are not cached."""
    if not 0.0 <= needle_fraction < 1.0:
        raise ValueError(f"needle_fraction must be in [0, 1); got {needle_fraction}")
    corpus = open_corpus(data, cache_dir=cache_dir, seed=seed)
    tokenizer = (
        load_tokenizer(tokenizer_path)
        if tokenizer_path
        else train_tokenizer(corpus.documents("train"), vocab_size)
    )
    train, validation, test = (
        packed_blocks(
            lambda split=split: corpus.documents(split),
            tokenizer,
            block_size,
            cache_dir=cache_dir,
            num_proc=num_proc,
            desc=split,
        )
        for split in ("train", "validation", "test")
    )
    count = round(needle_fraction * train.shape[0])
    if count:
        needles = needle_training_blocks(
            train.flatten(), tokenizer, block_size, count, number_digits=needle_digits, seed=seed
        )
        train = mix_in(train, needles, seed=seed)
    return PreparedData(
        tokenizer=tokenizer,
        train_blocks=train,
        validation_blocks=validation,
        test_blocks=test,
        test_texts=list(corpus.documents("test")),
        needle_blocks=count,
        corpus_name=corpus.name,
        recall=recall or RecallMix(),
        seed=seed,
    )


def prepare_preset_data(preset: Preset, options: DataOptions, seed: int) -> PreparedData:
    """:func:`prepare_data` for a run of ``preset`` (its vocabulary, block size and retrieval mix) on the data and
    tokenizer ``options`` name, drawn with ``seed`` (``train`` and ``compare`` alike)."""
    return prepare_data(
        data=options.data,
        tokenizer_path=options.tokenizer,
        vocab_size=preset.vocab_size,
        block_size=preset.block_size,
        needle_fraction=preset.needle_fraction,
        needle_digits=preset.needle_digits,
        recall=preset.recall,
        seed=seed,
        cache_dir=options.cache_dir,
        num_proc=options.num_proc,
    )
