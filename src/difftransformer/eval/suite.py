"""The evaluation suite on one model: every registered task with its light settings (what ``compare`` runs).

Each task picks its options from its light settings and the suite's context (:meth:`Task.light_options`):
contexts of one length (compare: the trained block size), magic numbers of the trained digits, haystacks and
held-out text from the test split, few samples. ``difftransformer eval TASK --model RUN_FOLDER`` runs a task with
its full settings. Every task writes its JSON and plots to OUTPUT_DIR/TASK/; :func:`run_suite` returns the
numbers a reader compares between models.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from difftransformer.data.needles import DEFAULT_NEEDLE, NeedleSpec
from difftransformer.errors import UsageError
from difftransformer.eval.options import to_json
from difftransformer.eval.registry import TASKS, get_task, parse_tasks, task_names
from difftransformer.eval.task import SuiteContext


@dataclass(frozen=True)
class SuiteSettings:
    """What the suite runs.

    Attributes:
        tasks: which tasks, registered names in registry order.
        context_length: tokens of every needle prompt and every held-out window.
        needle: what the needles are (their digits, sentence and question), those the models were trained on.
        needles: the N:R configurations of needle and of quant's needle check.
        seed: every task's draws (the same samples for every model).
        max_positions: the models' max_position_embeddings when known before they are trained (None: unknown); a
            length a task's light settings ask for beyond it is refused before any training.
        light: per task, overrides of its light settings (fields of its options dataclass, e.g.
            ``{"needle": {"samples": 1}}``, checked by it; ``{"mqar": {"lengths": [64, 256, 1024], "num_pairs": [4,
            16, 64]}}`` scores MQAR on that grid of lengths by pair counts); every other setting keeps the task's
            default (its ``light`` attribute); docs/performance.md says what the defaults cost.
    """

    tasks: tuple[str, ...] = TASKS
    context_length: int = 256
    needle: NeedleSpec = DEFAULT_NEEDLE
    needles: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 2))
    seed: int = 1234
    max_positions: int | None = None
    light: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parse_tasks(",".join(self.tasks))
        unknown = sorted(set(self.light) - set(task_names()))
        if unknown:
            raise UsageError(
                f"`light` names unknown tasks {unknown}; the tasks are {', '.join(task_names())}"
            )
        for name in ("context_length", "max_positions"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"`{name}` must be >= 1; got {value}")
        for task in self.tasks:
            self.light_settings(task)  # the task's options dataclass checks the overrides

    def light_settings(self, task: str) -> Any:
        """``task``'s light settings: its defaults with this suite's overrides."""
        return get_task(task).light_settings(**self.light.get(task, {}))


def held_out_tokens(tokenizer, texts: Sequence[str]) -> int:
    """Tokens that :func:`difftransformer.eval.common.token_stream` can cut from ``texts``."""
    eos = 0 if getattr(tokenizer, "eos_token_id", None) is None else 1
    return sum(len(ids) + eos for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"])


def suite_options(
    settings: SuiteSettings, tokenizer, texts: Sequence[str], skipped: dict[str, str] | None = None
) -> dict[str, Any]:
    """Every task's options (see :meth:`Task.light_options`), checked: call it before long work to fail early. A
    task that reads held-out text needs at least one window of ``context_length`` tokens of it. With ``skipped``
    (a dict), a task that cannot run at these settings is left out and ``skipped[task]`` says why, instead of
    raising."""
    context = SuiteContext(
        context_length=settings.context_length,
        needle=settings.needle,
        needles=settings.needles,
        seed=settings.seed,
        tokenizer=tokenizer,
        held_out_tokens=held_out_tokens(tokenizer, texts),
        max_positions=settings.max_positions,
    )
    options = {}
    for name in settings.tasks:
        task = get_task(name)
        try:
            if task.reads_text and context.held_out_tokens < context.context_length:
                raise UsageError(
                    f"the held-out texts give {context.held_out_tokens} tokens; {name} needs at least one window "
                    f"of `context_length` {context.context_length}"
                )
            options[name] = task.light_options(settings.light_settings(name), context)
        except UsageError as err:  # a setting the task refuses; anything else is a bug and propagates
            if skipped is None:
                raise
            skipped[name] = str(err)
    return options


def run_task(
    task: str,
    options: Any,
    model: nn.Module,
    tokenizer,
    texts: Sequence[str],
    output_dir: Path,
    progress: bool,
) -> dict:
    """Run one task with ``options`` (its options dataclass); it writes its files to ``output_dir``; return its summary numbers."""
    chosen = get_task(task)
    return chosen.summarise(chosen.run(model, tokenizer, texts, options, output_dir, progress))


def run_suite(
    model: nn.Module,
    tokenizer,
    texts: Sequence[str],
    settings: SuiteSettings,
    output_dir: str | Path,
    *,
    previous: dict | None = None,
    progress: bool = True,
) -> dict:
    """Run ``settings.tasks`` on ``model`` (held-out ``texts`` as haystacks and windows); every task writes its
    JSON and plots to OUTPUT_DIR/TASK/.

    ``previous``: an earlier return value for the same model; a task whose options are unchanged is taken from it
    instead of being run again.

    Returns a JSON-able dict: ``options`` (task -> the options it ran with), ``seconds`` (task -> wall time of its
    run) and ``summary`` (task -> its numbers, :meth:`Task.summarise`; each task's docstring and
    docs/evaluation.md say what they are).
    """
    previous = previous or {}
    suite: dict[str, dict] = {"options": {}, "seconds": {}, "summary": {}}
    for task, options in suite_options(settings, tokenizer, texts).items():
        stored = to_json(options)  # the form in which an earlier result is read back from disk
        if previous.get("options", {}).get(task) == stored and task in previous.get("summary", {}):
            summary, seconds = previous["summary"][task], previous["seconds"][task]
        else:
            start = time.perf_counter()
            summary = run_task(task, options, model, tokenizer, texts, Path(output_dir) / task, progress)
            seconds = time.perf_counter() - start
        suite["options"][task], suite["seconds"][task], suite["summary"][task] = stored, seconds, summary
    return suite
