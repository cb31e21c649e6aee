"""Chance levels: below what a measure says nothing, so that the report calls a comparison of two models that
both sit there "not measurable here" instead of judging noise.

An exact answer (a magic number, an MQAR value, a QA word) is not guessed: chance is about 0, and a few lucky
samples are not retrieval, hence a margin. A classification over k classes is guessed with accuracy 1/k.
"""

from __future__ import annotations

# Accuracy at or below this counts as "at chance" where an exact answer is asked for.
EXACT_MARGIN = 0.05
# Accuracy at most this far above 1/classes counts as "at chance" for a classification.
CLASSIFICATION_MARGIN = 0.1

NEEDLE = f"accuracy 0, counted up to {EXACT_MARGIN}: a magic number is not guessed"
MQAR = f"accuracy about 0, counted up to {EXACT_MARGIN}: a value is not guessed"
QA = f"accuracy 0, counted up to {EXACT_MARGIN}: the model does not read the document"
CLASSIFICATION = (
    f"accuracy 1/classes (0.20 for 5), counted up to {CLASSIFICATION_MARGIN} above it at every shot count"
)
NO_RECALL = "neither model recalls"


def exact_at_chance(accuracy: float | None) -> bool:
    """Whether an exact-answer accuracy sits at chance (None, no value, does not)."""
    return accuracy is not None and accuracy <= EXACT_MARGIN
