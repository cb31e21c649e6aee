"""Early stopping within each arm of a learning-rate sweep: Ray Tune's ASHA, one instance per arm."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler


class PerArmASHA(FIFOScheduler):
    """ASHA (Li et al., 2018) applied to each arm's trials apart: a trial is stopped only for falling behind
    trials of its own arm (one variant at one size, its learning rates), never for a worse loss than another
    architecture's. ``arm`` names a trial's arm; the other keywords are :class:`ASHAScheduler`'s."""

    def __init__(self, arm: Callable[[Trial], Hashable], **asha: Any) -> None:
        super().__init__()
        self._arm, self._asha, self._arms = arm, asha, {}

    def _of(self, trial: Trial) -> ASHAScheduler:
        return self._arms.setdefault(self._arm(trial), ASHAScheduler(**self._asha))

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        self._of(trial).on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        return self._of(trial).on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        self._of(trial).on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        self._of(trial).on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return "; ".join(f"{arm}: {asha.debug_string()}" for arm, asha in self._arms.items())
