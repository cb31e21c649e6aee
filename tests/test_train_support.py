"""Shared helpers for the training and compare tests, and their tests: a synthetic corpus, a byte-level BPE, packed
blocks (tests/conftest.py's ``data`` fixture is made of them)."""

from __future__ import annotations

import random
import signal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

WORDS = (
    "the king queen lord lady sword crown night day love death fair foul speak hath thou thee doth "
    "what where why Paris Rome magic number of is"
).split()
BLOCK = 32  # tokens per block of the ``data`` fixture


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


def as_from_a_shell() -> None:
    """``preexec_fn`` of a command a test interrupts: SIGINT unblocked and at its default, as an interactive shell
    starts a program. A child inherits an ignored SIGINT, and a test run started in the background by a
    non-interactive shell (``make test &``, nohup, many CI runners) has SIGINT ignored: its commands would sit
    through the test's Ctrl-C."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_synthetic_texts_are_fixed_by_their_seed():
    texts = synthetic_texts(count=5, words=7, seed=3)
    assert texts == synthetic_texts(count=5, words=7, seed=3) != synthetic_texts(count=5, words=7, seed=4)
    assert len(texts) == 5 and all(len(t.split()) == 7 and t.endswith(".") for t in texts)
    assert {word.rstrip(".") for t in texts for word in t.split()} <= set(WORDS)


def test_the_small_tokenizer_gives_back_the_text_and_ends_documents():
    texts = synthetic_texts(count=20)
    tokenizer = small_tokenizer(texts, vocab_size=300)
    assert tokenizer.decode(tokenizer(texts[0])["input_ids"]) == texts[0]
    assert (
        len(tokenizer) <= 300 and tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<|endoftext|>"
    )


def test_pack_joins_documents_with_eos_and_keeps_whole_blocks():
    texts = synthetic_texts(count=3, words=30)
    tokenizer = small_tokenizer(synthetic_texts(count=20))
    joined = [i for t in texts for i in [*tokenizer(t)["input_ids"], tokenizer.eos_token_id]]
    blocks = pack(texts, tokenizer, 16)
    assert blocks.dtype == torch.long and blocks.shape == (len(joined) // 16, 16)
    assert blocks.flatten().tolist() == joined[: blocks.numel()]
    first = len(tokenizer(texts[0])["input_ids"])
    assert blocks.flatten()[first] == tokenizer.eos_token_id  # the first document ends in EOS
