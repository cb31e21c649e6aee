"""Trainer callbacks: a tqdm bar with loss, tokens/s and ETA, metrics appended to a CSV file, and Ctrl-C taken at
the end of a step."""

from __future__ import annotations

import csv
import io
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm.auto import tqdm
from transformers import TrainerCallback

from difftransformer.errors import UsageError
from difftransformer.storage import atomic_write
from difftransformer.train.traces import is_trace_column

CSV_FIELDS = (
    "step",
    "epoch",
    "loss",
    "eval_loss",
    "eval_perplexity",
    "learning_rate",
    "grad_norm",
    "tokens_per_second",
    "wall_seconds",
    "eval_mqar_accuracy",
)
# Files written before runs logged MQAR accuracy lack the last column; they are read alike.
_EARLIER_FIELDS = CSV_FIELDS[:-1]


# Tokens trained on between two global steps (first, last): the global batch in tokens times the steps, or what
# a length schedule makes of it (RecallMix.tokens_between).
TokenCount = Callable[[int, int], int]


class ProgressBar(TrainerCallback):
    """One tqdm bar over optimizer steps (main process only): the latest training loss, validation loss and
    tokens/s in its postfix; tqdm supplies the rate and ETA. ``tokens`` counts the tokens between two steps."""

    def __init__(self, tokens: TokenCount, desc: str = "train") -> None:
        self.tokens = tokens
        self.desc = desc
        self.bar = None
        self.postfix: dict[str, str] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc=self.desc, unit="step")
            self._start = (time.perf_counter(), state.global_step)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)
            elapsed = time.perf_counter() - self._start[0]
            steps = state.global_step - self._start[1]
            if elapsed > 0 and steps > 0:
                self.postfix["tok/s"] = f"{self.tokens(self._start[1], state.global_step) / elapsed:,.0f}"
            self.bar.set_postfix(self.postfix, refresh=False)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs:
            if "loss" in logs:
                self.postfix["loss"] = f"{logs['loss']:.3f}"
            if "eval_loss" in logs:
                self.postfix["val"] = f"{logs['eval_loss']:.3f}"
            self.bar.set_postfix(self.postfix)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        return control


class CtrlCAtStepEnd(TrainerCallback):
    """Ctrl-C (SIGINT) ends training with KeyboardInterrupt at the next step's end (or evaluation batch, or the
    start of training), while :meth:`armed`. Python raises KeyboardInterrupt at whatever bytecode runs when the
    signal comes: inside tqdm's constructor (the bar transformers builds to write each checkpoint's shards) it left
    a half-built bar, whose ``__del__`` then printed ``Exception ignored in: <function tqdm.__del__ ...>`` and a
    traceback after the command's one-line note. At a step's end no library object is half-built. A second Ctrl-C
    interrupts at once."""

    def __init__(self) -> None:
        self.requested = False

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the second Ctrl-C

    @contextmanager
    def armed(self) -> Iterator[None]:
        """SIGINT taken by this callback inside the block (main thread only; elsewhere the block runs untouched),
        the previous handler put back after it."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._request)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _interrupt_if_requested(self, args, state, control, **kwargs) -> None:
        if self.requested:
            raise KeyboardInterrupt

    on_train_begin = on_step_end = on_substep_end = on_prediction_step = _interrupt_if_requested


class CsvMetrics(TrainerCallback):
    """Appends one row per Trainer log to ``path`` (main process only) and flushes it, so a killed run keeps
    every row it logged. A resumed run drops rows past its restart step first, so the file holds one history.
    ``tokens`` counts the tokens between two steps (for tokens/s); ``trace_columns``
    (:func:`difftransformer.train.traces.trace_columns`) follow :data:`CSV_FIELDS`."""

    def __init__(
        self, path: str | os.PathLike, tokens: TokenCount, trace_columns: tuple[str, ...] = ()
    ) -> None:
        self.path = Path(path)
        self.tokens = tokens
        self.fields = CSV_FIELDS + tuple(trace_columns)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._truncate_after(state.global_step)
            self._start = (time.perf_counter(), state.global_step)
            if not self.path.exists():
                self._rewrite([])
        return control

    def _truncate_after(self, step: int) -> None:
        rows, current = [], False
        if self.path.exists():
            rows = read_metrics(self.path)
            with open(self.path, newline="") as handle:
                current = handle.readline().strip() == ",".join(
                    self.fields
                )  # an earlier file gets the new header
        kept = [row for row in rows if int(row["step"]) <= step]
        if len(kept) != len(rows) or not current:
            self._rewrite(kept)

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self.fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(self.path, text.getvalue())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or not any(key in logs for key in CSV_FIELDS[2:]):
            return control
        elapsed = time.perf_counter() - self._start[0]
        steps = state.global_step - self._start[1]
        row = {key: logs[key] for key in self.fields if key in logs}
        row.update(step=state.global_step, epoch=state.epoch, wall_seconds=f"{elapsed:.3f}")
        if "loss" in logs and elapsed > 0 and steps > 0:
            row["tokens_per_second"] = f"{self.tokens(self._start[1], state.global_step) / elapsed:.1f}"
        with open(self.path, "a", newline="") as handle:
            csv.DictWriter(handle, fieldnames=self.fields).writerow(row)
            handle.flush()
            os.fsync(handle.fileno())
        return control


def read_metrics(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a metrics CSV written by :class:`CsvMetrics`; UsageError if its header is not ours."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        header = tuple(reader.fieldnames or ())
        ours = header[: len(CSV_FIELDS)] == CSV_FIELDS and all(
            map(is_trace_column, header[len(CSV_FIELDS) :])
        )
        if not ours and header != _EARLIER_FIELDS:
            raise UsageError(
                f"{path} is not a metrics file: header {reader.fieldnames}, expected {CSV_FIELDS} and "
                "optionally per-layer lambda columns"
            )
        return list(reader)


def column(rows: list[dict[str, str]], name: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows where ``name`` is filled."""
    steps, values = [], []
    for row in rows:
        if row.get(name):
            steps.append(int(row["step"]))
            values.append(float(row[name]))
    return steps, values
