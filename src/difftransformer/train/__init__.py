"""Training with the transformers Trainer: every setting declared once (``settings``), presets, runs that resume
exactly, the data they train on, and their checkpoints."""

from difftransformer.train.checkpoints import checkpoint_problem, last_good_checkpoint
from difftransformer.train.lock import RunDirectoryLocked, RunLock
from difftransformer.train.presets import PRESETS, RECIPE, Preset, get_preset
from difftransformer.train.runner import TrainResult, train_model
from difftransformer.train.settings import PresetOptions, RunOptions, TrainingSettings, tokens_per_step

__all__ = [
    "PRESETS",
    "RECIPE",
    "Preset",
    "PresetOptions",
    "RunDirectoryLocked",
    "RunLock",
    "RunOptions",
    "TrainResult",
    "TrainingSettings",
    "checkpoint_problem",
    "get_preset",
    "last_good_checkpoint",
    "tokens_per_step",
    "train_model",
]
