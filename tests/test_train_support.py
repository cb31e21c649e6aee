"""Shared helpers for the training and compare tests: a synthetic corpus, a byte-level BPE, packed blocks."""

from __future__ import annotations

import random

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

WORDS = (
    "the king queen lord lady sword crown night day love death fair foul speak hath thou thee doth "
    "what where why Paris Rome magic number of is"
).split()


def synthetic_texts(count: int = 60, words: int = 200, seed: int = 0) -> list[str]:
    """Pseudo-sentences over a small vocabulary: enough structure that a model's loss drops within steps."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) + "." for _ in range(count)]


def small_tokenizer(texts: list[str], vocab_size: int = 320) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")


def pack(texts: list[str], tokenizer, block_size: int) -> torch.Tensor:
    """(n_blocks, block_size) int64: the texts' ids joined with EOS and cut into full blocks."""
    ids = []
    for text in texts:
        ids += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor(ids[: len(ids) // block_size * block_size], dtype=torch.long)
    return ids.view(-1, block_size)
