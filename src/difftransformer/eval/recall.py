"""Scoring multi-query associative recall (MQAR), as the ``mqar`` task and quant's MQAR check do: the key and
value ids of a model's vocabulary, and the share of queries a model answers. The sequences are
:mod:`difftransformer.data.mqar`'s, the generator training mixes in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from difftransformer.data.mqar import (
    MqarBatch,
    MqarSettings,
    MqarVocabulary,
    make_mqar_batch,
    mqar_vocabulary,
)
from difftransformer.errors import UsageError
from difftransformer.eval.common import model_device


def key_vocabulary(
    vocab_size: int, tokenizer: Any, first_id: int | None, pairs: int, pairs_field: str = "num_pairs"
) -> MqarVocabulary:
    """The key and value ids of a vocabulary of ``vocab_size`` ids from ``first_id`` (the tokenizer's special ids
    left out), refusing a ``first_id`` that leaves none and ``pairs`` key-value pairs they cannot hold
    (``pairs_field``: the option that asked for them, for the message)."""
    special = frozenset(getattr(tokenizer, "all_special_ids", None) or ())
    vocabulary = mqar_vocabulary(vocab_size, first_id, special)
    usable = min(len(vocabulary.keys), len(vocabulary.values))
    if pairs > usable:
        first = int(vocabulary.keys[0]) if len(vocabulary.keys) else first_id
        raise UsageError(
            f"`{pairs_field}` {pairs} needs {pairs} distinct keys and values; ids from {first} of the model's "
            f"{vocab_size} (`first_id`) hold {usable}: ask for at most {usable} pairs or lower `first_id`"
        )
    return vocabulary


@torch.no_grad()
def mqar_accuracy(model: nn.Module, batch: MqarBatch) -> float:
    """Share of ``batch``'s queries whose value is the model's argmax at the query key's position."""
    device = model_device(model)
    logits = model(input_ids=torch.from_numpy(batch.input_ids).to(device), use_cache=False).logits
    positions = torch.from_numpy(batch.query_positions).to(logits.device)
    predicted = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).argmax(-1).cpu()
    return float((predicted == torch.from_numpy(batch.targets)).float().mean())


def recall_accuracy(
    model: nn.Module,
    vocabulary: MqarVocabulary,
    settings: MqarSettings,
    sequences: int,
    batch_size: int,
    rng: np.random.Generator,
) -> float:
    """MQAR accuracy over ``sequences`` sequences of ``settings`` drawn from ``rng``, ``batch_size`` per forward
    pass (every sequence weighs the same)."""
    total, done = 0.0, 0
    while done < sequences:
        size = min(batch_size, sequences - done)
        total += mqar_accuracy(model, make_mqar_batch(rng, size, settings, vocabulary)) * size
        done += size
    return total / sequences
