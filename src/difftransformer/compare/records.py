"""One trained and evaluated model of a comparison, as the report and the claims read it (and results.json holds
it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunRecord:
    """One trained model: which variant (its spec, e.g. "diff(subln=none)"), seed and scale, where it lives, and
    what it scored (``suite``: what :func:`difftransformer.eval.suite.run_suite` returned; ``harness``: the
    lm-evaluation-harness tasks' metrics, ``{"options": ..., "metrics": {task: {metric: value}}}``, when asked)."""

    variant: str
    seed: int
    scale: str
    folder: Path
    parameters: int
    tokens: int
    tokens_per_second: float
    train_seconds: float
    validation_loss: float
    test_loss: float
    suite: dict
    harness: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        """The record as JSON types (the folder as a string)."""
        return {**dataclasses.asdict(self), "folder": str(self.folder)}
