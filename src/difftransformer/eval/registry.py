"""The registry of evaluation tasks: one line per task, in the order the CLI lists them and reports show them.

Each name is a module ``difftransformer.eval.<name>`` exporting ``TASK``, an instance of
:class:`difftransformer.eval.task.Task` whose ``name`` is that name (see :mod:`difftransformer.eval.task` for how
to add one). Modules are imported when a task is first asked for, so listing the names costs no import.
"""

from __future__ import annotations

import importlib

from difftransformer.errors import UsageError
from difftransformer.eval.task import Task

TASKS: tuple[str, ...] = (
    "needle",
    "attention",
    "outliers",
    "quant",
    "longctx",
    "icl",
    "mqar",
    "hallucination",
)


def get_task(name: str) -> Task:
    """The task registered as ``name``; an unknown name is a ValueError listing the registered ones."""
    if name not in TASKS:
        raise UsageError(f"task must be one of {', '.join(TASKS)}; got {name!r}")
    task = importlib.import_module(f"difftransformer.eval.{name}").TASK
    if task.name != name:
        raise RuntimeError(
            f"difftransformer.eval.{name}.TASK is named {task.name!r}; it must be named {name!r}"
        )
    return task


def all_tasks() -> list[Task]:
    """Every registered task, in registry order."""
    return [get_task(name) for name in TASKS]


def parse_tasks(text: str) -> tuple[str, ...]:
    """'mqar,needle' -> ('needle', 'mqar'): distinct registered task names, returned in registry order."""
    tasks = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks or len(set(tasks)) != len(tasks):
        problem = f"unknown {', '.join(unknown)}" if unknown else "empty or repeated names"
        raise UsageError(
            f"--tasks must be distinct comma-separated names from {', '.join(TASKS)}; got {text!r} ({problem})"
        )
    return tuple(t for t in TASKS if t in tasks)
