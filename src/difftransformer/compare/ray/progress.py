"""The one progress display of a comparison's grid: runs done, running and waiting, and the time left."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ray.tune.progress_reporter import TrialProgressCallback
from tqdm.auto import tqdm

if TYPE_CHECKING:
    from typing import TextIO

    from difftransformer.compare.ray.grid import GridRun

# Seconds between two plain progress lines while no run starts or ends (output that is not a terminal: a log).
PLAIN_EVERY = 60.0


class GridProgress(TrialProgressCallback):
    """One line for the whole grid: runs done, running and waiting, and the time left, estimated from the training
    steps the runs have made since the grid started; a run started again after its worker died is said once.
    On a terminal the line is redrawn in place; elsewhere (a log file, a pipe) it is written as plain lines, one
    when a run starts or ends and otherwise one every :data:`PLAIN_EVERY` seconds. Tune's own per-trial printer is a
    :class:`TrialProgressCallback` too, which this one replaces."""

    def __init__(self, runs: Sequence[GridRun], desc: str, stream: TextIO | None = None) -> None:
        super().__init__()
        self.runs = runs
        self.start = time.monotonic()
        self.first_step: dict[int, int] = {}  # where each run stood when this grid first heard of it
        self.step: dict[int, int] = {}
        self.running: set[int] = set()
        self.done: set[int] = set()
        self.desc = desc
        self.stream = stream or sys.stderr
        self.bar = (
            tqdm(total=len(runs), bar_format="{desc}", file=self.stream) if self.stream.isatty() else None
        )
        self.said: tuple[tuple[int, int] | None, float] = (
            None,
            0.0,
        )  # the last plain line's counts, and when
        self._show()

    def __getstate__(self) -> dict:
        """Tune pickles its callbacks with the experiment's state; the stream and the bar stay here."""
        return {key: value for key, value in self.__dict__.items() if key not in ("bar", "stream")}

    def _index(self, trial) -> int:
        return trial.config["run"]

    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.add(self._index(trial))
        self._show()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        index = self._index(trial)
        if "step" in result:
            self.first_step.setdefault(index, result["step"])
            self.step[index] = result["step"]
        self._show()

    def on_trial_complete(self, iteration, trials, trial, **info):
        index = self._index(trial)
        self.running.discard(index)
        self.done.add(index)
        self.step[index] = self.runs[index].max_steps
        self._show()

    def on_trial_recover(self, iteration, trials, trial, **info):
        tqdm.write(
            f"{self.runs[self._index(trial)].name}: its worker died; started again from its last checkpoint"
        )

    def on_trial_error(self, iteration, trials, trial, **info):
        index = self._index(trial)
        self.running.discard(index)
        self.done.add(index)
        self._show()

    def _time_left(self) -> str:
        made = sum(step - self.first_step.get(index, step) for index, step in self.step.items())
        total = sum(run.max_steps for run in self.runs)
        reached = sum(self.step.get(index, 0) for index in range(len(self.runs)))
        elapsed = time.monotonic() - self.start
        if made <= 0 or elapsed <= 0:
            return "?"
        seconds = (total - reached) / (made / elapsed)
        return time.strftime("%H:%M:%S", time.gmtime(max(0, math.ceil(seconds))))

    def _show(self) -> None:
        waiting = len(self.runs) - len(self.done) - len(self.running)
        elapsed = time.strftime("%H:%M:%S", time.gmtime(time.monotonic() - self.start))
        text = (
            f"{self.desc}: {len(self.done)}/{len(self.runs)} runs done, {len(self.running)} running, {waiting} "
            f"waiting; {elapsed} elapsed, about {self._time_left()} left"
        )
        if self.bar is not None:
            self.bar.set_description_str(text)
            return
        counts, now = (len(self.done), len(self.running)), time.monotonic()
        if counts != self.said[0] or now - self.said[1] >= PLAIN_EVERY:
            print(text, file=self.stream, flush=True)
            self.said = (counts, now)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
