"""The paper's experiments as evaluation tasks that work on any transformers causal LM.

One module per task (needle, attention, outliers, quant, lowbit, longctx, icl, mqar, and the hallucination package), each
exporting a ``TASK`` that follows the protocol of :mod:`difftransformer.eval.task`; :mod:`difftransformer.eval.registry`
lists them (and the tasks other packages register as entry points), ``cli`` is ``difftransformer eval`` and ``suite``
runs every task with light settings on one model (what ``compare`` does). The tasks are siblings: none imports
another, and what several share lies below them: ``common`` (loading, lengths, held-out text), ``logits`` (attention
logits of any model), ``maps`` (attention maps and allocation), ``haystack`` (needle prompts), ``recall`` (MQAR
scoring), ``generation`` (greedy decoding), ``paper`` (the paper's numbers) and ``chance`` (chance levels). Adding a
task = one module + one registry line.
"""

from difftransformer.eval.registry import TASKS, all_tasks, get_task, parse_tasks, task_names
from difftransformer.eval.suite import SuiteSettings, run_suite
from difftransformer.eval.task import Task

__all__ = [
    "TASKS",
    "SuiteSettings",
    "Task",
    "all_tasks",
    "get_task",
    "parse_tasks",
    "run_suite",
    "task_names",
]
