"""Multi-query associative recall (Zoology, Arora et al. 2023): the sequences that training mixes in and the
``mqar`` evaluation scores, drawn by one generator.

A sequence opens with ``num_pairs`` key-value pairs ``k1 v1 k2 v2 ...``; after them, filler tokens with
``num_queries`` of the keys asked again at random places in random order. The model must predict each queried
key's value at the position right after the key; only those positions carry labels (-100 elsewhere, the
transformers convention: labels are aligned with the inputs and the model shifts them). The input at an answer
position is filler, not the value, as in Zoology: were the answers shown, a model could score by elimination
(a value not yet answered, 0.52 with 4 dense queries) without ever binding keys to values, and small models
settle there instead of learning recall.

Keys come from one range of ids and values from another, disjoint one (:func:`mqar_vocabulary`), keys are unique
within a sequence, so only recall from the context can answer. Ids are raw vocabulary ids: the task needs no
tokenizer, and a pretrained LM sees gibberish, which is the point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from difftransformer.errors import UsageError

IGNORE_INDEX = -100  # labels that carry no loss (transformers' convention)


@dataclass(frozen=True)
class MqarVocabulary:
    """Disjoint id ranges: ``keys`` (ascending ids), ``values`` (ascending ids) and the ``filler`` id between
    queries (in neither range)."""

    keys: np.ndarray
    values: np.ndarray
    filler: int


def mqar_vocabulary(
    vocab_size: int, first_id: int | None = None, special_ids: set[int] | frozenset[int] = frozenset()
) -> MqarVocabulary:
    """Keys from the lower half and values from the upper half of ``[first_id, vocab_size)`` with
    ``special_ids`` removed; the filler is the id just below ``first_id``.

    ``first_id`` None: 256, or a quarter of a vocabulary smaller than 1024, which skips the special and byte-level
    ids at the bottom of most vocabularies.
    """
    if vocab_size < 8:
        raise UsageError(f"`vocab_size` must be >= 8 for MQAR; got {vocab_size}")
    first_id = min(256, vocab_size // 4) if first_id is None else first_id
    if not 1 <= first_id < vocab_size - 3:
        raise UsageError(f"`first_id` must lie in [1, `vocab_size` - 3 = {vocab_size - 3}); got {first_id}")
    ids = np.arange(first_id, vocab_size)
    if special_ids:
        ids = ids[~np.isin(ids, sorted(special_ids))]
    half = len(ids) // 2
    filler = first_id - 1
    while filler in special_ids and filler > 0:
        filler -= 1
    return MqarVocabulary(keys=ids[:half], values=ids[half:], filler=int(filler))


@dataclass(frozen=True)
class MqarSettings:
    """One MQAR setting: ``num_pairs`` key-value pairs, ``num_queries`` of them asked (None: every key), in
    sequences of ``length`` tokens (None: the shortest that holds them, 2 x (pairs + queries))."""

    num_pairs: int
    num_queries: int | None = None
    length: int | None = None

    @property
    def queries(self) -> int:
        """Keys asked per sequence."""
        return self.num_pairs if self.num_queries is None else self.num_queries

    @property
    def tokens(self) -> int:
        """Tokens per sequence."""
        return 2 * (self.num_pairs + self.queries) if self.length is None else self.length

    def check(self, vocabulary: MqarVocabulary | None = None) -> None:
        """UsageError naming the field for a setting no sequence can have."""
        if self.num_pairs < 1:
            raise UsageError(f"`num_pairs` must be >= 1; got {self.num_pairs}")
        if not 1 <= self.queries <= self.num_pairs:
            raise UsageError(
                f"`num_queries` must lie in [1, `num_pairs`={self.num_pairs}]; got {self.queries}"
            )
        shortest = 2 * (self.num_pairs + self.queries)
        if self.tokens < shortest:
            raise UsageError(
                f"`length` must be >= {shortest} for {self.num_pairs} pairs and {self.queries} queries; got "
                f"{self.tokens}"
            )
        if vocabulary is not None:
            usable = min(len(vocabulary.keys), len(vocabulary.values))
            if self.num_pairs > usable:
                raise UsageError(
                    f"num_pairs={self.num_pairs} exceeds the {usable} distinct keys and values of the vocabulary"
                )

    def label(self) -> str:
        """A short name: "8 pairs", "8 pairs, 4 queries", "8 pairs @ 256"."""
        text = f"{self.num_pairs} pairs"
        if self.num_queries is not None and self.num_queries != self.num_pairs:
            text += f", {self.num_queries} queries"
        if self.length is not None:
            text += f" @ {self.length}"
        return text


@dataclass(frozen=True)
class MqarBatch:
    """``input_ids`` (n, T) int64; ``labels`` (n, T) int64, the value at each queried value position and -100
    elsewhere; ``query_positions`` (n, R) the positions of the queried keys (where the value is predicted);
    ``pair_positions`` (n, R) the position of each queried key in the key-value block."""

    input_ids: np.ndarray
    labels: np.ndarray
    query_positions: np.ndarray
    pair_positions: np.ndarray

    @property
    def targets(self) -> np.ndarray:
        """(n, R) the values to predict at ``query_positions``."""
        return np.take_along_axis(self.labels, self.query_positions + 1, axis=1)


def make_mqar_batch(
    rng: np.random.Generator, count: int, settings: MqarSettings, vocabulary: MqarVocabulary
) -> MqarBatch:
    """Draw ``count`` sequences of ``settings`` from ``vocabulary``.

    Queries sit at random even offsets after the key-value block (each query a key and a filler token whose label
    is the key's value), uniformly spread over the filler, so a longer ``length`` puts them further from the pairs they ask about.
    """
    settings.check(vocabulary)
    if count < 1:
        raise ValueError(f"count must be >= 1; got {count}")
    pairs, queries, length = settings.num_pairs, settings.queries, settings.tokens
    inputs = np.full((count, length), vocabulary.filler, dtype=np.int64)
    labels = np.full((count, length), IGNORE_INDEX, dtype=np.int64)
    query_positions = np.empty((count, queries), dtype=np.int64)
    pair_positions = np.empty((count, queries), dtype=np.int64)
    slots = (length - 2 * pairs) // 2  # places a query (key, value) can take after the block
    for row in range(count):
        keys = rng.choice(vocabulary.keys, size=pairs, replace=False)
        values = rng.choice(vocabulary.values, size=pairs, replace=False)
        inputs[row, 0 : 2 * pairs : 2] = keys
        inputs[row, 1 : 2 * pairs : 2] = values
        asked = rng.choice(pairs, size=queries, replace=False)
        where = 2 * pairs + 2 * np.sort(rng.choice(slots, size=queries, replace=False))
        inputs[row, where] = keys[asked]
        labels[row, where + 1] = values[asked]
        query_positions[row] = where
        pair_positions[row] = 2 * asked
    return MqarBatch(inputs, labels, query_positions, pair_positions)
