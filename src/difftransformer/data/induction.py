"""Repeated random segments: the induction rows that let a small model learn in-context recall.

A row is random ids with one segment of it repeated later, at a random place; only the repeat's tokens after its
first carry labels (-100 elsewhere). Predicting them needs an induction circuit: find where the current token
stood before and copy what followed it. That circuit is exactly what associative recall (:mod:`.mqar`) needs, but
trained on MQAR alone a 2-layer model sits for thousands of steps at "some value from the context" (accuracy
1/pairs), because recall rewards the circuit only once both of its layers work. Repeats supervise many positions
a row, at offsets that change from row to row (a fixed offset would be learned positionally instead), and with
half of the training rows of this kind the models of ``make study-retrieval`` learn MQAR within a few hundred
steps (docs/results/retrieval).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from difftransformer.data.mqar import IGNORE_INDEX
from difftransformer.errors import UsageError

SHORTEST_SEGMENT = 4  # tokens of the repeated segment, at least


@dataclass(frozen=True)
class InductionBatch:
    """``input_ids`` (n, T) int64 random ids with one segment repeated; ``labels`` (n, T) int64, the repeat's
    tokens after its first (predictable from the first copy), -100 elsewhere."""

    input_ids: np.ndarray
    labels: np.ndarray


def make_induction_batch(
    rng: np.random.Generator, count: int, length: int, ids: np.ndarray
) -> InductionBatch:
    """Draw ``count`` rows of ``length`` tokens from ``ids``; in each, a segment of ``SHORTEST_SEGMENT`` up to a
    third of the row is repeated at a random later offset."""
    ids = np.asarray(ids)
    if length < 3 * SHORTEST_SEGMENT:
        raise UsageError(f"`length` must be >= {3 * SHORTEST_SEGMENT} for induction rows; got {length}")
    if ids.ndim != 1 or len(ids) < 2:
        raise UsageError(f"`ids` must be a 1-D array of at least 2 token ids; got shape {ids.shape}")
    if count < 1:
        raise ValueError(f"count must be >= 1; got {count}")
    inputs = ids[rng.integers(0, len(ids), size=(count, length))].astype(np.int64)
    labels = np.full((count, length), IGNORE_INDEX, dtype=np.int64)
    for row in range(count):
        size = int(rng.integers(SHORTEST_SEGMENT, length // 3 + 1))
        first = int(rng.integers(0, length - 2 * size + 1))
        second = int(rng.integers(first + size, length - size + 1))
        inputs[row, second : second + size] = inputs[row, first : first + size]
        labels[row, second + 1 : second + size] = inputs[row, second + 1 : second + size]
    return InductionBatch(inputs, labels)
