"""What a comparison keeps on disk, and how it reads it back: one run's numbers (:class:`RunRecord`, a run folder's
evaluation.json and an entry of the comparison folder's results.json), one sweep run's point (:class:`SweepPoint`),
and the names of the files a run folder holds.

A record names its run folder relative to the folder that holds the file it is written in (the comparison folder
for results.json, the run folder itself for evaluation.json), so that a comparison folder copied or moved elsewhere
still names its own runs, and only those.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difftransformer.storage import read_json
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.recall import steps_to_recall
from difftransformer.train.runner import METRICS_CSV

EVALUATION_JSON = "evaluation.json"  # a run folder's record (RunRecord.to_json)
RESULTS_JSON = "results.json"  # a comparison folder's records and settings
RUN_LOG = "run.log"  # a run folder's log: every attempt's output, each under a header
USAGE_JSON = "usage.json"  # every attempt's wall and CPU seconds, in a run's folder


def _number(value: Any) -> float:
    """A float field as JSON holds it: NaN was written as null and infinities as strings (storage.jsonable)."""
    return math.nan if value is None else float(value)


@dataclass
class RunRecord:
    """One trained model: which variant (its spec, e.g. "diff(subln=none)"), seed and scale, where it lives, and
    what it scored (``suite``: what :func:`difftransformer.eval.suite.run_suite` returned; ``harness``: the
    lm-evaluation-harness tasks' metrics, ``{"options": ..., "metrics": {task: {metric: value}}}``, when asked);
    ``learning_rate``: the rate it trained at (None in records made before rates were recorded);
    ``layer_parameters``: the parameters in its decoder layers (None in records made before they were kept). A loss
    that is not a number (a diverged run, NaN weights) stays NaN."""

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
    learning_rate: float | None = None
    layer_parameters: int | None = None

    def size(self, by: str) -> float:
        """The x of a scaling fit: ``by="tokens"``, the training tokens; ``"parameters"``, those in the decoder
        layers, as scaling laws count a model (embeddings, final norm and head left out: at a small width with a
        large vocabulary they are most of it and would flatten the curve), or all of them in older records."""
        if by == "tokens":
            return float(self.tokens)
        return float(self.parameters if self.layer_parameters is None else self.layer_parameters)

    def to_json(self, root: Path) -> dict:
        """The record as JSON types, its folder relative to ``root`` (the folder of the file it goes into)."""
        return {**dataclasses.asdict(self), "folder": self.folder.relative_to(root).as_posix()}

    @classmethod
    def from_json(cls, values: dict, root: Path) -> RunRecord:
        """The record :meth:`to_json` wrote into a file in ``root`` (records written before a field existed take
        its default; an absolute folder, as records held before folders were relative, stays as written)."""
        known = {field.name for field in dataclasses.fields(cls)}
        kept = {key: value for key, value in values.items() if key in known}
        for name in ("tokens_per_second", "train_seconds", "validation_loss", "test_loss"):
            kept[name] = _number(kept[name])
        return cls(**{**kept, "folder": root / values["folder"]})


def read_evaluation(folder: Path) -> RunRecord:
    """The record in the run folder ``folder`` (its evaluation.json), as the run in that folder, wherever the
    file was written (a folder copied with its comparison keeps naming the copy)."""
    return dataclasses.replace(
        RunRecord.from_json(read_json(folder / EVALUATION_JSON), folder), folder=folder
    )


@dataclass(frozen=True)
class SweepPoint:
    """One run of a learning-rate sweep: its arm (variant spec, scale), rate and seed, the steps it was to train and
    the step it reached (less when early stopping ended it), its last validation loss there (NaN where there is
    none), and whether its recall probe reached ``RECALL_THRESHOLD`` (None: trained without recall rows, or recorded
    before this was kept)."""

    variant: str
    scale: str
    learning_rate: float
    seed: int
    steps: int
    step: int
    validation_loss: float
    stopped_early: bool
    learned_recall: bool | None = None

    @property
    def arm(self) -> tuple[str, str]:
        """(scale, variant spec): the runs a sweep compares."""
        return self.scale, self.variant

    @classmethod
    def from_json(cls, values: dict) -> SweepPoint:
        """The point as results.json holds it (``dataclasses.asdict``; a NaN loss written as null)."""
        return cls(**{**values, "validation_loss": _number(values["validation_loss"])})


def recall_curve(folder: Path) -> tuple[list[int], list[float]]:
    """(steps, accuracies) of the MQAR probe of the run in ``folder``; empty for a run trained without recall
    rows."""
    path = folder / METRICS_CSV
    return column(read_metrics(path), "eval_mqar_accuracy") if path.is_file() else ([], [])


def learned_recall(folder: Path) -> bool | None:
    """Whether the MQAR probe of the run in ``folder`` ever reached ``RECALL_THRESHOLD``; None for a run trained
    without recall rows."""
    steps, accuracies = recall_curve(folder)
    return steps_to_recall(steps, accuracies) is not None if steps else None


def usage_seconds(folders: Sequence[Path]) -> dict[str, float]:
    """The wall and CPU seconds of every attempt at the runs in ``folders`` (their usage.json files); an attempt
    whose worker was killed left none."""
    attempts = [
        attempt
        for folder in folders
        if (folder / USAGE_JSON).is_file()
        for attempt in read_json(folder / USAGE_JSON)["attempts"]
    ]
    return {key: sum(attempt[key] for attempt in attempts) for key in ("wall_seconds", "cpu_seconds")}
