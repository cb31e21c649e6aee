"""A grid of runs as the scheduler sees it: each run's name, folder, log, arm and length, and what a worker does with
it."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from transformers import TrainerCallback

from difftransformer.compare.ray.resources import RunResources


class GridRun(Protocol):
    """What the scheduler needs of a run: a name, its folder and its log (where Ray's own account of a failed
    attempt goes), the arm whose runs early stopping compares, and its training steps (for the progress
    estimate)."""

    @property
    def name(self) -> str: ...

    folder: Path

    @property
    def log(self) -> Path: ...

    @property
    def arm(self) -> Hashable: ...

    @property
    def max_steps(self) -> int: ...


# work(run, callbacks, where): train (and evaluate) one run with the Trainer callbacks that report to the
# scheduler; ``where`` names the Ray node it runs on, for the run's log.
Work = Callable[[Any, Sequence[TrainerCallback], str], None]


@dataclass(frozen=True)
class Grid:
    """Runs to fan out and what to do with each.

    Attributes:
        runs: the runs, started in this order.
        work: trains (and evaluates) one run into its folder, with the given Trainer callbacks (:data:`Work`);
            called in the worker process (it travels there pickled, with what it holds: the prepared data, the
            settings).
        resources: each run's share of the cluster.
        retries: how often a run whose worker died is started again.
        early_stop: stop runs whose validation loss falls behind their arm's (ASHA over the training steps).
        desc: the progress display's label.
    """

    runs: tuple[GridRun, ...]
    work: Work
    resources: RunResources
    retries: int = 3
    early_stop: bool = False
    desc: str = "compare"
