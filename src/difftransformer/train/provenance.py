"""What a trained run folder says about how it was made: the settings of the run (preset, training options, data,
attention kind, the folder it started from) and the package versions, in ``provenance.json``.

``train`` appends one entry per invocation that trains (a resumed run has several), when its training starts
(:class:`ProvenanceRecorder`): an invocation refused on the way, or finding the run already complete, records
nothing. ``compare`` reads a run's entry before it
reuses the run and refuses one trained with other settings (:func:`differing_settings`).

Every save of the model (the run folder's final model, each ``checkpoint-N``) also records the folder's
fingerprint (:func:`record_fingerprint`: config.json's model-defining fields and the weights), which strict loading
(:mod:`difftransformer.models.loading`) checks, so that a config edit that keeps every shape, or weights changed
after the save, are refused rather than loaded as another model.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from difftransformer.data import DataOptions
from difftransformer.models.loading import FINGERPRINT_KEY, PROVENANCE_JSON, folder_fingerprint
from difftransformer.storage import jsonable, read_json, versions, write_json
from difftransformer.train.presets import Preset
from difftransformer.train.settings import TrainingSettings

# TrainingArguments fields that say where a run writes and how it reports, not what it trains: two runs that
# differ only in these trained alike.
NOT_RESULT_SETTINGS = frozenset({"output_dir", "logging_dir", "run_name", "report_to", "disable_tqdm"})
# Data options that say where the cache lives and how fast it is filled, not what the data is.
NOT_DATA_SETTINGS = frozenset({"cache_dir", "num_proc"})


def run_settings(
    *,
    preset: Preset,
    training: TrainingSettings,
    data: DataOptions,
    attention: str,
    init_from: str | None = None,
) -> dict[str, Any]:
    """The settings that decide what a run trains, as JSON data: the preset (its name, model shape and data recipe),
    every training option except :data:`NOT_RESULT_SETTINGS` (the preset's training overrides applied), the data
    options, the attention kind (a variant's spec, with its overrides) and the pretrained folder it starts from."""
    options = json.loads(training.to_json_string())
    shape = {
        key: value
        for key, value in dataclasses.asdict(preset).items()
        if key not in ("description", "training")
    }
    return jsonable(
        {
            "attention": attention,
            "init_from": os.path.abspath(init_from) if init_from else None,
            "preset": shape,
            "training": {key: value for key, value in options.items() if key not in NOT_RESULT_SETTINGS},
            "data": {
                key: value for key, value in dataclasses.asdict(data).items() if key not in NOT_DATA_SETTINGS
            },
        }
    )


def record_provenance(folder: str | os.PathLike, **settings: Any) -> Path:
    """Append this invocation's :func:`run_settings` (``settings`` are its keywords) and the package versions to
    ``folder/provenance.json``; returns its path."""
    path = Path(folder) / PROVENANCE_JSON
    record = read_json(path) if path.is_file() else {}
    entry = {"settings": run_settings(**settings), "versions": versions()}
    return write_json(path, {**record, "invocations": [*record.get("invocations", []), entry]})


def record_fingerprint(folder: str | os.PathLike) -> Path:
    """Record in ``folder/provenance.json`` the fingerprint of the model just saved there
    (:func:`~difftransformer.models.loading.folder_fingerprint`), which every strict load of the folder checks;
    returns its path. Called by the main process after each save, once the files are complete."""
    path = Path(folder) / PROVENANCE_JSON
    record = read_json(path) if path.is_file() else {}
    return write_json(path, {**record, FINGERPRINT_KEY: folder_fingerprint(folder)})


class ProvenanceRecorder(TrainerCallback):
    """Records the run's settings (:func:`record_provenance` with ``settings``) in ``folder`` when its training
    starts, once every option, the data and the checkpoint to resume have been checked; in the main process only."""

    def __init__(self, folder: str | os.PathLike, **settings: Any) -> None:
        self.folder, self.settings = folder, settings

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        if state.is_world_process_zero:
            record_provenance(self.folder, **self.settings)


def recorded_settings(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The settings of the last invocation recorded in ``folder`` (None when the folder records none)."""
    path = Path(folder) / PROVENANCE_JSON
    invocations = read_json(path).get("invocations") if path.is_file() else None
    return invocations[-1]["settings"] if invocations else None


def differing_settings(recorded: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(name, recorded value, current value) of every setting that differs between two :func:`run_settings`;
    the name is the field's own (``learning_rate``, ``block_size``), the group it sits in left out."""
    differ = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            differ += differing_settings(old, new)
        elif old != new:
            differ.append((key, old, new))
    return differ
