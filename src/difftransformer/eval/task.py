"""The evaluation-task protocol: everything one of the paper's experiments provides, in one object.

Adding a task = one module + one registry line. Write ``difftransformer/eval/<name>.py`` with a subclass of
:class:`Task` and a module-level instance ``TASK``, then add its name to ``TASKS`` in
:mod:`difftransformer.eval.registry` (or, from another package, register ``TASK`` as an entry point of the group
``difftransformer.eval_tasks``). A task module imports the pieces below the tasks (``common``, ``maps``,
``haystack``, ``recall``, ``generation``, ``paper``, ``chance`` ...), never another task. From then on ``difftransformer eval <name>`` runs it with its full settings
(flags generated from its options dataclass, :attr:`Task.Options`; defaults the model cannot take fitted by
:meth:`Task.fit`), ``compare --tasks`` runs it on every trained model with its light settings (:attr:`Task.light`
and :meth:`Task.light_options`), and compare's report gives it a section: :meth:`Task.describe`, a table
(:meth:`Task.columns`, mean ± spread across seeds), a chart (:meth:`Task.chart`) and verdict sentences
(:meth:`Task.measures`). Nothing else changes; docs/evaluation.md explains each task.

The three data shapes a task produces:

- *options*: the settings of one run, an instance of the task's frozen options dataclass (:attr:`Task.Options`:
  every field JSON-able, checked in its ``__post_init__``); compare stores them as JSON and reuses an earlier
  result exactly when they are unchanged;
- *results*: what :meth:`Task.run` returns and writes to OUTPUT_DIR/<name>.json (with its plots beside);
- *summary*: the few numbers a reader compares between models (:meth:`Task.summarise`), JSON-able, the input of
  the table, the chart and the measures; beside every accuracy and share, under ``"intervals"`` and the same keys,
  its 95% sampling interval as ``[low, high]`` (:func:`interval_at` reads it).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

from torch import nn

from difftransformer.data.needles import NeedleSpec
from difftransformer.errors import UsageError


class Column(NamedTuple):
    """One column of a task's comparison table: its header, the value in one summary, the digits shown."""

    header: str
    value: float
    digits: int


class Measure(NamedTuple):
    """One verdict measure: its name, its value in one summary (None where that run has none), whether higher is
    better, and the digits shown.

    ``paper``: what the paper reports for this measure, with the model size and tokens it was measured at ("" when
    the paper makes no claim about it); a measure with a claim becomes a row of compare's claims table.
    ``at_chance``: whether one run's model sits at chance level on this measure (both models at chance in every
    run make the measure "not measurable here"); ``chance`` says what chance is, e.g. "accuracy 0.00: a 3-digit
    number is not guessed". ``interval``: the value's 95% sampling interval in one summary (None where that run's
    summary has none, as results written before intervals were recorded): Wilson for an accuracy, a bootstrap over
    sequences for an attention share (:mod:`difftransformer.stats`); compare's verdict never counts a difference
    inside it.
    """

    name: str
    value: Callable[[dict], float | None]
    higher_is_better: bool
    digits: int
    paper: str = ""
    at_chance: Callable[[dict], bool] | None = None
    chance: str = ""
    interval: Callable[[dict], tuple[float, float] | None] | None = None


def interval_at(summary: dict, *keys: str) -> tuple[float, float] | None:
    """The sampling interval a summary records under ``summary["intervals"][keys[0]][keys[1]]...`` (the same keys
    as the value's), or None where it records none."""
    found: Any = summary.get("intervals")
    for key in keys:
        if not isinstance(found, dict) or key not in found:
            return None
        found = found[key]
    return (
        (float(found[0]), float(found[1])) if isinstance(found, (list, tuple)) and len(found) == 2 else None
    )


@dataclass(frozen=True)
class Panel:
    """One panel of a comparison chart: the y label, the table columns (headers of :meth:`Task.columns`) along
    x, the y limits (None: automatic) and, in a ``"lines"`` chart whose panels have different columns, this
    panel's x labels (None: the chart's)."""

    ylabel: str
    columns: Sequence[str]
    ylim: tuple[float, float] | None = None
    xticks: Sequence[str] | None = None


@dataclass(frozen=True)
class Chart:
    """How compare's report draws a task across variants, declared rather than drawn: ``"bars"`` (one bar group
    per column of the single panel, one bar per variant) or ``"lines"`` (one line per variant in every panel, the
    columns along x labelled by ``xticks``). Error bars show the spread across seeds."""

    kind: Literal["bars", "lines"]
    title: str
    panels: Sequence[Panel]
    xlabel: str = ""
    xticks: Sequence[str] | None = None
    log: bool = False


UNIT = (-0.02, 1.02)  # y limits of an accuracy (share) panel


@dataclass(frozen=True)
class SuiteContext:
    """What the suite knows when it picks a task's light options for one model.

    Attributes:
        context_length: tokens of every prompt and held-out window (the trained block size in compare).
        needle: what the needles are (in compare, those the models were trained on).
        needles: the N:R needle configurations (needle, and quant's needle check).
        seed: every task's draws (the same samples for every model).
        tokenizer: the models' tokenizer (to size prompts).
        held_out_tokens: tokens of held-out text available (see :func:`difftransformer.eval.common.token_stream`).
        max_positions: the longest sequence the models will take (their max_position_embeddings), when known
            before they exist (None: unknown; a task then refuses a longer length when it runs).
    """

    context_length: int
    needle: NeedleSpec
    needles: tuple[tuple[int, int], ...]
    seed: int
    tokenizer: Any
    held_out_tokens: int
    max_positions: int | None = None

    def windows(self, wanted: int) -> int:
        """``wanted`` held-out windows of ``context_length``, or as many as the text holds (a small test split gets
        fewer windows rather than none)."""
        return min(wanted, self.held_out_tokens // self.context_length)


class Task(ABC):
    """One evaluation task. Subclasses set the class attributes and implement the abstract methods.

    Attributes:
        name: the command-line name (``difftransformer eval NAME``, ``compare --tasks NAME``) and the results
            file's stem.
        title: the report section's heading, e.g. "Multi-needle retrieval (needle)".
        help: one line for ``difftransformer eval --help``.
        reads_text: whether :meth:`run` needs held-out texts (haystacks, windows); the CLI then loads them and
            the suite checks that they hold at least one window.
        needs_tokenizer: whether :meth:`run` needs the model's tokenizer (mqar does not).
        Options: the task's frozen options dataclass: its fields are ``difftransformer eval NAME``'s flags (a
            field named ``seed`` takes the shared ``--seed``); its ``run_<task>`` function takes one instance.
        light: the light settings for a comparison, ``dataclasses.replace(Options(), ...)`` (few samples, short
            runs); :meth:`light_options` fits them to the suite.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    help: ClassVar[str]
    reads_text: ClassVar[bool] = True
    needs_tokenizer: ClassVar[bool] = True
    Options: ClassVar[type]
    light: ClassVar[Any]

    def fit(self, options: Any, model: nn.Module, tokenizer: Any, given: frozenset[str]) -> Any:
        """``options`` with the lengths the user did not give (fields not in ``given``) fitted to what ``model``
        takes (its max_position_embeddings), the light way :meth:`light_options` fits a comparison's; lengths the
        user gave are left for :meth:`run` to refuse. Unchanged by default (a task with no lengths)."""
        return options

    @abstractmethod
    def light_options(self, light: Any, suite: SuiteContext) -> Any:
        """:meth:`run`'s options in a comparison, from ``light`` (:attr:`light` with the suite's overrides) and
        the suite's context; deterministic (compare reuses a result whose options are unchanged)."""

    @abstractmethod
    def run(
        self, model: nn.Module, tokenizer: Any, texts: Sequence[str] | None, options: Any, output_dir: Path,
        progress: bool,
    ) -> dict:  # fmt: skip
        """Run the task with ``options`` (an :attr:`Options`); write OUTPUT_DIR/NAME.json and its plots; return
        the results. A value the model cannot take raises a UsageError naming its field before any long work."""

    @abstractmethod
    def summarise(self, results: dict) -> dict:
        """The numbers a reader compares between models, from :meth:`run`'s results (JSON-able)."""

    @abstractmethod
    def columns(self, summary: dict) -> list[Column]:
        """The comparison table's columns for one run's summary (every run of a comparison has the same)."""

    @abstractmethod
    def describe(self, options: dict) -> str:
        """A paragraph for the report (``options``: the run's options as JSON, as compare stores them): what the numbers mean, which settings they came from, which way is
        better."""

    @abstractmethod
    def chart(self, summary: dict) -> Chart:
        """The comparison chart, in terms of :meth:`columns`' headers."""

    def measures(self, summary: dict) -> list[Measure]:
        """The verdict measures (one sentence each in the report's verdict); none by default."""
        return []

    def light_settings(self, **overrides: Any) -> Any:
        """:attr:`light` with ``overrides`` replaced (checked by :attr:`Options`); an unknown name is a ValueError
        naming the known ones."""
        known = [f.name for f in dataclasses.fields(self.light)]
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise UsageError(
                f"{self.name} has no light setting {', '.join(unknown)}; its settings are {', '.join(known)}"
            )
        return dataclasses.replace(self.light, **overrides)
