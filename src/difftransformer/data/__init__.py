"""Data for training and evaluation: the built-in Shakespeare corpus or the user's text, a byte-level BPE
tokenizer, tokenised text packed into cached, memory-mapped fixed-length blocks, and the multi-needle retrieval samples that
training mixes in and evaluation scores (``needles``). Caches live under :func:`difftransformer.storage.cache_dir`."""

from difftransformer.data.blocks import packed_blocks
from difftransformer.data.corpus import CorpusError, CorpusSplits
from difftransformer.data.files import FileCorpus, load_corpus, open_corpus
from difftransformer.data.needles import NeedleSample, make_needle_sample
from difftransformer.data.options import DataOptions, PrepareOptions
from difftransformer.data.shakespeare import builtin_corpus
from difftransformer.data.tokenizer import EOS_TOKEN, PAD_TOKEN, load_tokenizer, train_tokenizer

__all__ = [
    "CorpusError",
    "CorpusSplits",
    "DataOptions",
    "EOS_TOKEN",
    "FileCorpus",
    "NeedleSample",
    "PAD_TOKEN",
    "PrepareOptions",
    "builtin_corpus",
    "load_corpus",
    "load_tokenizer",
    "make_needle_sample",
    "open_corpus",
    "packed_blocks",
    "train_tokenizer",
]
