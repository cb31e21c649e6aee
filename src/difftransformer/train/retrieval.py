"""Multi-needle retrieval blocks (SPEC §5) to mix into training, drawn with the evaluation suite's generator.

Each block is one :func:`difftransformer.eval.needle.make_needle_sample` prompt (Shakespeare haystack, N magic-number
needles, the question) followed by its answer and then more haystack, exactly ``block_size`` tokens, so a model
trained on them is asked, at evaluation, exactly the kind of question it has seen (with fresh cities, numbers and
haystack).
"""

from __future__ import annotations

import numpy as np
import torch

from difftransformer.eval.needle import make_needle_sample

# Room left after the prompt for the answer (a 6-digit number is at most 7 byte-level BPE tokens with its space).
ANSWER_ROOM = 8


def needle_training_blocks(
    stream: list[int] | torch.Tensor,
    tokenizer,
    block_size: int,
    count: int,
    *,
    max_needles: int = 4,
    max_queries: int = 2,
    number_digits: int = 6,
    seed: int = 0,
) -> torch.Tensor:
    """(count, block_size) int64 retrieval blocks with 1..max_needles needles at uniform random depths, each
    answering one of up to ``max_queries`` queried cities; ``stream`` is tokenized haystack text (1-D ids)."""
    if count < 0:
        raise ValueError(f"count must be >= 0; got {count}")
    if block_size <= ANSWER_ROOM:
        raise ValueError(f"block_size must exceed {ANSWER_ROOM}; got {block_size}")
    ids = stream.tolist() if isinstance(stream, torch.Tensor) else list(stream)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        needles = int(rng.integers(1, max_needles + 1))
        queries = int(rng.integers(1, min(needles, max_queries) + 1))
        sample = make_needle_sample(
            tokenizer,
            ids,
            context_tokens=block_size - ANSWER_ROOM,
            num_needles=needles,
            num_queries=queries,
            depth=float(rng.random()),
            rng=rng,
            number_digits=number_digits,
        )
        which = int(rng.integers(0, queries))
        row = sample.prompt_ids[which] + sample.answer_ids[which]
        # Fill to the block length with the haystack continuation after an EOS, as packed documents are.
        start = int(rng.integers(0, len(ids) - block_size))
        row = (row + [tokenizer.eos_token_id] + ids[start : start + block_size])[:block_size]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.long).view(count, block_size)


def mix_in(blocks: torch.Tensor, extra: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Replace ``len(extra)`` randomly chosen rows of ``blocks`` (n, T) with ``extra`` (m, T); same n, same order
    otherwise, so every variant trained on the result sees identical data in identical order."""
    if extra.shape[0] > blocks.shape[0]:
        raise ValueError(f"cannot mix {extra.shape[0]} blocks into {blocks.shape[0]}")
    mixed = blocks.clone()
    # A stream of its own: the Trainer's sampler draws torch.randperm(n) from the same seed, and positions
    # drawn that way would be the first ones it visits (every retrieval block first, then plain text only).
    rng = np.random.default_rng([seed, 0x6D6978])
    where = torch.from_numpy(rng.permutation(blocks.shape[0])[: extra.shape[0]])
    mixed[where] = extra
    return mixed
