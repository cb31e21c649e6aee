"""From a corpus to training tensors: tokenizer, packed blocks, and the retrieval mix-in, shared by ``train`` and
``compare`` so both see the same data for the same options."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from difftransformer.data import DataOptions, load_tokenizer, packed_blocks, train_tokenizer
from difftransformer.data.blocks import BlockFile, block_file
from difftransformer.data.needles import DEFAULT_NEEDLE, NeedleSpec
from difftransformer.train.mixture import MixedBlocks, RecallMix
from difftransformer.train.presets import Preset
from difftransformer.train.retrieval import NeedleRows


@dataclass
class PreparedData:
    """Token blocks for training, validation (during training) and testing (after), the tokenizer, the held-out
    test documents (haystacks for retrieval checks, a list of str in memory), and the recall rows drawn into training
    (:attr:`train_dataset`; needles as :attr:`needle` says).

    Each ``*_blocks`` is an int64 ``torch.Tensor`` of shape (n, block_size) that views a memory-mapped cache file
    (:func:`difftransformer.data.packed_blocks`; copy-on-write, so indexing reads only the rows asked for and
    writing never changes the file)."""

    tokenizer: object
    train_blocks: torch.Tensor
    validation_blocks: torch.Tensor
    test_blocks: torch.Tensor
    test_texts: list[str]
    corpus_name: str
    recall: RecallMix = RecallMix()
    needle: NeedleSpec = DEFAULT_NEEDLE
    seed: int = 0

    _BLOCKS = ("train_blocks", "validation_blocks", "test_blocks")

    def block_files(self) -> list[Path]:
        """The cache files the blocks view (none for blocks made in memory)."""
        return [Path(found.path) for name in self._BLOCKS if (found := block_file(getattr(self, name)))]

    def __getstate__(self) -> dict:
        """Pickled (for a comparison's workers): blocks that view a cache file travel as its name and are mapped
        again on unpickling, blocks made in memory travel whole; the training dataset is made again."""
        state = {key: value for key, value in self.__dict__.items() if key != "train_dataset"}
        for name in self._BLOCKS:
            state[name] = block_file(state[name]) or state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        for name in self._BLOCKS:
            if isinstance(state[name], BlockFile):
                state[name] = state[name].open()
        self.__dict__.update(state)

    @functools.cached_property
    def train_dataset(self) -> MixedBlocks:
        """The training blocks with :attr:`recall`'s rows drawn in (from the data's seed: every run alike); needle
        haystacks come from the training text itself. Built once and shared by every run of a comparison (it holds
        no per-run state)."""
        needles = None
        if self.recall.needle_fraction:
            block_size = self.train_blocks.shape[1]
            needles = NeedleRows(
                self.train_blocks.reshape(-1), self.tokenizer, block_size, needle=self.needle
            )
        return MixedBlocks(
            self.train_blocks,
            self.recall,
            len(self.tokenizer),
            special_ids=frozenset(self.tokenizer.all_special_ids),
            seed=self.seed,
            needles=needles,
        )


def prepare_data(
    *,
    options: DataOptions,
    vocab_size: int,
    block_size: int,
    recall: RecallMix | None = None,
    needle: NeedleSpec = DEFAULT_NEEDLE,
    seed: int = 0,
) -> PreparedData:
    """Open the corpus ``options`` name (:meth:`DataOptions.open_corpus`, split with ``seed``), train a byte-level
    BPE of ``vocab_size`` on its training split (or load ``options.tokenizer``) and pack every split into blocks of
    ``block_size``; ``recall`` rows (multi-needle retrieval examples whose haystacks come from the training text,
    MQAR and induction rows) are drawn in as the data is served (:attr:`PreparedData.train_dataset`). The corpus is
    streamed, never held in memory; ``options.num_proc`` processes tokenise it (default: the CPU count) when its
    blocks are not cached."""
    corpus = options.open_corpus(seed)
    tokenizer = (
        load_tokenizer(options.tokenizer)
        if options.tokenizer
        else train_tokenizer(corpus.documents("train"), vocab_size)
    )
    train, validation, test = (
        packed_blocks(
            lambda split=split: corpus.documents(split),
            tokenizer,
            block_size,
            cache_dir=options.cache_dir,
            num_proc=options.num_proc,
            desc=split,
        )
        for split in ("train", "validation", "test")
    )
    return PreparedData(
        tokenizer=tokenizer,
        train_blocks=train,
        validation_blocks=validation,
        test_blocks=test,
        test_texts=list(corpus.documents("test")),
        corpus_name=corpus.name,
        recall=recall or RecallMix(),
        needle=needle,
        seed=seed,
    )


def prepare_preset_data(preset: Preset, options: DataOptions, seed: int) -> PreparedData:
    """:func:`prepare_data` for a run of ``preset`` (its vocabulary, block size and retrieval mix) on the data and
    tokenizer ``options`` name, drawn with ``seed`` (``train`` and ``compare`` alike)."""
    return prepare_data(
        options=options,
        vocab_size=preset.vocab_size,
        block_size=preset.block_size,
        recall=preset.recall,
        needle=preset.needle,
        seed=seed,
    )
