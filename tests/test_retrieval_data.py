"""The retrieval training data: MQAR sequences (Zoology's construction) and induction rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from difftransformer.data.induction import SHORTEST_SEGMENT, make_induction_batch
from difftransformer.data.mqar import IGNORE_INDEX, MqarSettings, make_mqar_batch, mqar_vocabulary


@st.composite
def mqar_cases(draw):
    pairs = draw(st.integers(1, 12))
    queries = draw(st.integers(1, pairs))
    length = 2 * (pairs + queries) + 2 * draw(st.integers(0, 20))
    vocab = draw(st.integers(64, 600))
    return MqarSettings(pairs, queries, length), vocab, draw(st.integers(0, 2**31))


@settings(max_examples=60, deadline=None)
@given(mqar_cases())
def test_mqar_construction(case):
    spec, vocab_size, seed = case
    vocabulary = mqar_vocabulary(vocab_size)
    if spec.num_pairs > min(len(vocabulary.keys), len(vocabulary.values)):
        return
    batch = make_mqar_batch(np.random.default_rng(seed), 5, spec, vocabulary)
    assert batch.input_ids.shape == batch.labels.shape == (5, spec.tokens)
    # Key and value ranges are disjoint, and the filler is in neither.
    assert not set(vocabulary.keys.tolist()) & set(vocabulary.values.tolist())
    assert vocabulary.filler not in set(vocabulary.keys.tolist()) | set(vocabulary.values.tolist())
    for row in range(5):
        ids, labels = batch.input_ids[row], batch.labels[row]
        keys, values = ids[0 : 2 * spec.num_pairs : 2], ids[1 : 2 * spec.num_pairs : 2]
        assert len(set(keys.tolist())) == spec.num_pairs  # unique keys
        assert np.isin(keys, vocabulary.keys).all() and np.isin(values, vocabulary.values).all()
        table = dict(zip(keys.tolist(), values.tolist()))
        # Labels only on the value after each queried key, and it is that key's value in the block.
        labelled = np.flatnonzero(labels != IGNORE_INDEX)
        assert len(labelled) == spec.queries
        assert (labelled >= 2 * spec.num_pairs + 1).all()
        for position in labelled:
            key = int(ids[position - 1])
            assert table[key] == labels[position]
            # The answer is not shown: a model that saw it could answer later queries by elimination.
            assert ids[position] == vocabulary.filler
        np.testing.assert_array_equal(batch.query_positions[row] + 1, labelled)
        assert len(set(ids[labelled - 1].tolist())) == spec.queries  # each key asked once
        # The pair a query asks about is where the key stands in the block.
        np.testing.assert_array_equal(ids[batch.pair_positions[row]], ids[batch.query_positions[row]])
        # Everything outside the block and the queries is filler.
        rest = np.ones(spec.tokens, dtype=bool)
        rest[: 2 * spec.num_pairs] = False
        rest[labelled - 1] = False
        assert (ids[rest] == vocabulary.filler).all()
    np.testing.assert_array_equal(
        batch.targets, np.take_along_axis(batch.labels, batch.query_positions + 1, 1)
    )


def test_mqar_is_deterministic_per_seed():
    vocabulary = mqar_vocabulary(512)
    spec = MqarSettings(8, 4, 64)
    a = make_mqar_batch(np.random.default_rng(3), 4, spec, vocabulary)
    b = make_mqar_batch(np.random.default_rng(3), 4, spec, vocabulary)
    c = make_mqar_batch(np.random.default_rng(4), 4, spec, vocabulary)
    np.testing.assert_array_equal(a.input_ids, b.input_ids)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert not np.array_equal(a.input_ids, c.input_ids)


def test_mqar_vocabulary_skips_special_ids():
    vocabulary = mqar_vocabulary(300, first_id=10, special_ids={10, 11, 299, 9})
    used = set(vocabulary.keys.tolist()) | set(vocabulary.values.tolist()) | {vocabulary.filler}
    assert not used & {9, 10, 11, 299}
    assert vocabulary.filler == 8


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (MqarSettings(0), "`num_pairs` must be >= 1"),
        (MqarSettings(4, 5), "`num_queries` must lie in"),
        (MqarSettings(4, 4, 10), "`length` must be >= 16"),
        (MqarSettings(200), "exceeds the"),
    ],
)
def test_mqar_refuses_impossible_settings(spec, message):
    with pytest.raises(ValueError, match=message):
        make_mqar_batch(np.random.default_rng(0), 1, spec, mqar_vocabulary(256))


def test_mqar_vocabulary_refuses_bad_first_id():
    with pytest.raises(ValueError, match="`first_id` must lie in"):
        mqar_vocabulary(100, first_id=99)


# --- induction rows ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(12, 200), st.integers(2, 50), st.integers(0, 2**31))
def test_induction_rows_repeat_a_segment_and_label_only_the_repeat(length, distinct, seed):
    ids = np.arange(100, 100 + distinct)
    batch = make_induction_batch(np.random.default_rng(seed), 4, length, ids)
    assert batch.input_ids.shape == batch.labels.shape == (4, length)
    assert np.isin(batch.input_ids, ids).all()
    for row, labels in zip(batch.input_ids, batch.labels):
        labelled = np.flatnonzero(labels != IGNORE_INDEX)
        # One run of labels: the repeat after its first token, at least SHORTEST_SEGMENT - 1 of them.
        assert len(labelled) >= SHORTEST_SEGMENT - 1
        np.testing.assert_array_equal(labelled, np.arange(labelled[0], labelled[-1] + 1))
        np.testing.assert_array_equal(labels[labelled], row[labelled])
        # The labelled tokens, and the one before them, stood earlier in the row in the same order.
        second, size = labelled[0] - 1, len(labelled) + 1
        segment = row[second : second + size]
        earlier = [s for s in range(0, second - size + 1) if np.array_equal(row[s : s + size], segment)]
        assert earlier, "the repeated segment has no earlier copy"


def test_induction_rows_are_deterministic_per_seed_and_refuse_bad_input():
    ids = np.arange(10, 60)
    a, b = (make_induction_batch(np.random.default_rng(5), 3, 40, ids) for _ in range(2))
    np.testing.assert_array_equal(a.input_ids, b.input_ids)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert not np.array_equal(
        a.input_ids, make_induction_batch(np.random.default_rng(6), 3, 40, ids).input_ids
    )
    with pytest.raises(ValueError, match="`length` must be >= 12"):
        make_induction_batch(np.random.default_rng(0), 1, 8, ids)
    with pytest.raises(ValueError, match="`ids` must be a 1-D array"):
        make_induction_batch(np.random.default_rng(0), 1, 40, np.array([3]))
