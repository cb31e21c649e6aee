"""Data at scale: the packed blocks of the built-in corpus stay byte-identical, files are streamed (parquet
included), tokenised in parallel into a memory-mapped cache, and ranks read disjoint shares."""

from __future__ import annotations

import hashlib

import pytest

from difftransformer.data import load_corpus, packed_blocks, train_tokenizer

# sha256 of the int64 bytes of each split's blocks (block size 256), as packed before the blocks were streamed
# and memory-mapped: the study's and the demo's data must not move.
BUILTIN_BLOCKS = {
    320: {
        "train": ((12270, 256), "fef5c1987ca56acad35feb4821471b866cb58dc9c7690f46d07421b8882aeee8"),
        "validation": ((621, 256), "ce0dc8a918ce4df8d1ad398d2d0ac5f0c781bce787161b98df649769837f296f"),
        "test": ((605, 256), "fc56511a69f381975a22d7dcb175290bd8449705c01a682126660b14ca839763"),
    },
    4096: {
        "train": ((5855, 256), "7c8f0dbf1ed1c3fcf5212b65a1c810425e8bfdde4c93943c16b4ad47d4fe520e"),
        "validation": ((308, 256), "7d7bb58c4b58aadf7e852766bed1e99e15e5d833f6156c4ce6940d9583a5c7ab"),
        "test": ((304, 256), "b0aca323cd7433d9ee66372632fbe0fb69c16423aadf2ae874295d568415a95b"),
    },
}


@pytest.mark.parametrize("vocab_size", sorted(BUILTIN_BLOCKS))
def test_builtin_corpus_blocks_are_unchanged(vocab_size, tmp_path):
    corpus = load_corpus(None)
    tokenizer = train_tokenizer(corpus.train, vocab_size)
    for split, (shape, digest) in BUILTIN_BLOCKS[vocab_size].items():
        blocks = packed_blocks(getattr(corpus, split), tokenizer, 256, cache_dir=tmp_path)
        assert tuple(blocks.shape) == shape
        assert hashlib.sha256(blocks.numpy().tobytes()).hexdigest() == digest, split
