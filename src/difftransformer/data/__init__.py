"""Data for training: the built-in Shakespeare corpus or the user's text, a byte-level BPE tokenizer, and
tokenised text packed into cached fixed-length blocks."""

from difftransformer.data.blocks import BlockDataset, packed_blocks
from difftransformer.data.corpus import CorpusError, CorpusSplits, default_cache_dir
from difftransformer.data.files import load_corpus
from difftransformer.data.shakespeare import builtin_corpus
from difftransformer.data.tokenizer import EOS_TOKEN, PAD_TOKEN, load_tokenizer, train_tokenizer

__all__ = [
    "BlockDataset",
    "CorpusError",
    "CorpusSplits",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "builtin_corpus",
    "default_cache_dir",
    "load_corpus",
    "load_tokenizer",
    "packed_blocks",
    "train_tokenizer",
]
