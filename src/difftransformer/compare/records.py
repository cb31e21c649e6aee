"""One trained and evaluated model of a comparison, as the report and the claims read it (and results.json holds
it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from difftransformer.storage import versions

EVALUATION_JSON = "evaluation.json"  # a run folder's record (RunRecord.to_json)
RESULTS_JSON = "results.json"  # a comparison folder's records and settings


@dataclass
class RunRecord:
    """One trained model: which variant (its spec, e.g. "diff(subln=none)"), seed and scale, where it lives, and
    what it scored (``suite``: what :func:`difftransformer.eval.suite.run_suite` returned; ``harness``: the
    lm-evaluation-harness tasks' metrics, ``{"options": ..., "metrics": {task: {metric: value}}}``, when asked);
    ``reused``: the model was trained by an earlier invocation with the same settings (its provenance.json says
    which); ``learning_rate``: the rate it trained at (None in records made before rates were recorded);
    ``layer_parameters``: the parameters in its decoder layers (None in records made before they were kept)."""

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
    reused: bool = False
    learning_rate: float | None = None
    layer_parameters: int | None = None

    def size(self, by: str) -> float:
        """The x of a scaling fit: ``by="tokens"``, the training tokens; ``"parameters"``, those in the decoder
        layers, as scaling laws count a model (embeddings, final norm and head left out: at a small width with a
        large vocabulary they are most of it and would flatten the curve), or all of them in older records."""
        if by == "tokens":
            return float(self.tokens)
        return float(self.parameters if self.layer_parameters is None else self.layer_parameters)

    def to_json(self) -> dict:
        """The record as JSON types (the folder as a string)."""
        return {**dataclasses.asdict(self), "folder": str(self.folder)}

    @classmethod
    def from_json(cls, values: dict) -> RunRecord:
        """The record :meth:`to_json` wrote (records written before a field existed take its default)."""
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(
            **{
                **{key: value for key, value in values.items() if key in known},
                "folder": Path(values["folder"]),
            }
        )


@dataclass(frozen=True)
class SweepPoint:
    """One run of a learning-rate sweep: its arm (variant spec, scale), rate and seed, the steps it was to train and
    the step it reached (less when early stopping ended it), its last validation loss there, and whether its recall
    probe reached ``RECALL_THRESHOLD`` (None: trained without recall rows, or recorded before this was kept)."""

    variant: str
    scale: str
    learning_rate: float
    seed: int
    steps: int
    step: int
    validation_loss: float
    stopped_early: bool
    learned_recall: bool | None = None


def provenance_line(records: list[RunRecord]) -> str:
    """The report's first line: the versions that made it, and which of its runs an earlier invocation trained."""
    found = versions()
    reused = [record for record in records if record.reused]
    runs = (
        f"{len(records) - len(reused)} run(s) trained by this invocation, {len(reused)} reused from an earlier one "
        "with the same settings (each run folder's provenance.json records them)"
    )
    return (
        f"Made with difftransformer {found['difftransformer']}, torch {found['torch']} and transformers "
        f'{found["transformers"]}; {runs}; the settings are in results.json ("provenance").'
    )
