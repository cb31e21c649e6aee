"""Corpus splits, and the deterministic document-level split used for the user's own data."""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from difftransformer.errors import UsageError

SPLITS = ("train", "validation", "test")


class CorpusError(UsageError):
    """Input text that cannot be used: missing, empty, unreadable, undecodable or too small."""


@dataclass(frozen=True)
class CorpusSplits:
    """A corpus cut into train / validation / test documents (each a ``str``); no document is in two splits."""

    name: str
    train: list[str]
    validation: list[str]
    test: list[str]

    def sizes(self) -> dict[str, dict[str, int]]:
        """Documents and characters per split."""
        return {
            split: {"documents": len(docs), "characters": sum(len(d) for d in docs)}
            for split, docs in (("train", self.train), ("validation", self.validation), ("test", self.test))
        }

    def documents(self, split: str) -> Iterator[str]:
        """The documents of ``split`` (``train``, ``validation`` or ``test``), in order."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return iter(getattr(self, split))


def held_out_ids(
    n: int, *, seed: int, validation_fraction: float, test_fraction: float
) -> tuple[frozenset[int], frozenset[int]] | None:
    """The indices of the validation and test documents among ``n``, by a seeded shuffle of ``range(n)``; None
    when ``n`` is too small to leave a training document (then split by position). The fractions are checked."""
    for arg, value in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= value < 1.0:
            raise CorpusError(f"`{arg}` must be in [0, 1), got {value}")
    if validation_fraction + test_fraction >= 1.0:
        raise CorpusError(
            f"`validation_fraction` + `test_fraction` must be below 1 to leave training data, "
            f"got {validation_fraction} + {test_fraction}"
        )
    n_val = max(1, round(validation_fraction * n)) if validation_fraction > 0 else 0
    n_test = max(1, round(test_fraction * n)) if test_fraction > 0 else 0
    if n - n_val - n_test < 1:
        return None
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return frozenset(order[:n_val]), frozenset(order[n_val : n_val + n_test])


def split_documents(
    name: str,
    documents: Sequence[str],
    *,
    seed: int = 0,
    validation_fraction: float = 0.05,
    test_fraction: float = 0.05,
) -> CorpusSplits:
    """Assign whole documents to train / validation / test by a seeded shuffle.

    A split with a positive fraction gets at least one document. When there are too few documents for that
    (typically one big text file), every document is instead cut at line breaks into a leading train part, a
    validation part and a trailing test part, in proportion to the fractions, and a warning says so.
    Documents keep their input order inside each split.
    """
    if not documents:
        raise CorpusError(f"{name}: no documents to split")
    ids = held_out_ids(
        len(documents), seed=seed, validation_fraction=validation_fraction, test_fraction=test_fraction
    )
    if ids is None:
        warn_split_by_position(name, len(documents), validation_fraction, test_fraction)
        return _split_by_position(name, documents, validation_fraction, test_fraction)
    val_ids, test_ids = ids
    train = [d for i, d in enumerate(documents) if i not in val_ids and i not in test_ids]
    return CorpusSplits(
        name=name,
        train=train,
        validation=[documents[i] for i in sorted(val_ids)],
        test=[documents[i] for i in sorted(test_ids)],
    )


def warn_split_by_position(name: str, n: int, validation_fraction: float, test_fraction: float) -> None:
    """Say that ``n`` documents are too few to split by document, so each is split by position."""
    warnings.warn(
        f"{name}: {n} document(s) are too few to split by document; splitting each one by position "
        f"(first {1 - validation_fraction - test_fraction:.0%} train, then validation, then test)",
        stacklevel=3,
    )


def _split_by_position(
    name: str, documents: Sequence[str], validation_fraction: float, test_fraction: float
) -> CorpusSplits:
    parts: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    for doc in documents:
        lines = doc.splitlines(keepends=True)
        if len(lines) < 3:
            raise CorpusError(
                f"{name}: a document of {len(lines)} line(s) cannot be split into train, validation and "
                "test; give more documents or more text"
            )
        # Cut points on line boundaries; each split keeps at least one line.
        val_start = min(max(1, round(len(lines) * (1 - validation_fraction - test_fraction))), len(lines) - 2)
        test_start = min(max(val_start + 1, round(len(lines) * (1 - test_fraction))), len(lines) - 1)
        pieces = {
            "train": lines[:val_start],
            "validation": lines[val_start:test_start],
            "test": lines[test_start:],
        }
        if validation_fraction == 0:
            pieces["train"] += pieces.pop("validation")
        if test_fraction == 0:
            pieces["validation" if validation_fraction else "train"] += pieces.pop("test")
        for split, chunk in pieces.items():
            text = "".join(chunk)
            if text.strip():
                parts[split].append(text)
    return CorpusSplits(name=name, **parts)
