"""Training with the transformers Trainer: presets, runs that resume exactly, and the DIFF-vs-baseline comparison."""

from difftransformer.train.checkpoints import checkpoint_problem, last_good_checkpoint
from difftransformer.train.lock import RunDirectoryLocked, RunLock
from difftransformer.train.presets import PRESETS, Preset, get_preset
from difftransformer.train.runner import TrainOptions, TrainResult, train_model
from difftransformer.train.scaling import PowerLaw, fit_power_law, matching_ratio

__all__ = [
    "PRESETS",
    "PowerLaw",
    "Preset",
    "RunDirectoryLocked",
    "RunLock",
    "TrainOptions",
    "TrainResult",
    "checkpoint_problem",
    "fit_power_law",
    "get_preset",
    "last_good_checkpoint",
    "matching_ratio",
    "train_model",
]
