"""The registry of evaluation tasks: the built-in ones, one line each, in the order the CLI lists them and reports
show them, then the tasks other packages register.

Each built-in name is a module ``difftransformer.eval.<name>`` exporting ``TASK``, an instance of
:class:`difftransformer.eval.task.Task` whose ``name`` is that name (see :mod:`difftransformer.eval.task` for how
to add one). Another package adds a task without touching this one, as lm-evaluation-harness's plugins do: an
entry point in the group ``difftransformer.eval_tasks`` whose name is the task's and whose object is its ``Task``
instance, e.g. in its pyproject.toml::

    [project.entry-points."difftransformer.eval_tasks"]
    mytask = "mypackage.mytask:TASK"

Such a task then runs as ``difftransformer eval mytask`` and ``compare --tasks mytask``, after the built-in ones.
Modules are imported when a task is first asked for, so listing the names costs no import.
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import EntryPoint, entry_points

from difftransformer.errors import UsageError
from difftransformer.eval.task import Task

TASKS: tuple[str, ...] = (
    "needle",
    "attention",
    "outliers",
    "quant",
    "lowbit",
    "longctx",
    "icl",
    "mqar",
    "hallucination",
)
ENTRY_POINT_GROUP = "difftransformer.eval_tasks"


@functools.cache
def plugin_tasks() -> dict[str, EntryPoint]:
    """The tasks installed packages register (entry points of :data:`ENTRY_POINT_GROUP`), by name, sorted; read
    once per process. A plugin cannot take a built-in name."""
    found = {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}
    taken = sorted(set(found) & set(TASKS))
    if taken:
        raise RuntimeError(
            f"entry points of {ENTRY_POINT_GROUP!r} take the built-in task names {taken} "
            f"(from {', '.join(str(found[name].value) for name in taken)})"
        )
    return dict(sorted(found.items()))


def task_names() -> tuple[str, ...]:
    """Every registered task: the built-in ones (:data:`TASKS`), then those other packages register."""
    return TASKS + tuple(plugin_tasks())


def get_task(name: str) -> Task:
    """The task registered as ``name``; an unknown name is a UsageError listing the registered ones."""
    if name in TASKS:
        task = importlib.import_module(f"difftransformer.eval.{name}").TASK
        where = f"difftransformer.eval.{name}.TASK"
    elif name in plugin_tasks():
        task = plugin_tasks()[name].load()
        where = f"the entry point {name} = {plugin_tasks()[name].value}"
    else:
        raise UsageError(f"`task` must be one of {', '.join(task_names())}; got {name!r}")
    if not isinstance(task, Task):
        raise TypeError(f"{where} is a {type(task).__name__}, not a difftransformer.eval.task.Task")
    if task.name != name:
        raise RuntimeError(f"{where} is named {task.name!r}; it must be named {name!r}")
    return task


def all_tasks() -> list[Task]:
    """Every registered task, in registry order."""
    return [get_task(name) for name in task_names()]


def parse_tasks(text: str) -> tuple[str, ...]:
    """'mqar,needle' -> ('needle', 'mqar'): distinct registered task names, returned in registry order."""
    names = task_names()
    tasks = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [t for t in tasks if t not in names]
    if unknown or not tasks or len(set(tasks)) != len(tasks):
        problem = f"unknown {', '.join(unknown)}" if unknown else "empty or repeated names"
        raise UsageError(
            f"`tasks` must be distinct comma-separated names from {', '.join(names)}; got {text!r} ({problem})"
        )
    return tuple(t for t in names if t in tasks)
