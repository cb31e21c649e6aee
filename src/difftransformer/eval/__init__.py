"""The paper's experiments as evaluation tasks that work on any transformers causal LM.

One module per task (needle, attention, outliers, quant, longctx, icl, mqar), each exporting a ``TASK`` that
follows the protocol of :mod:`difftransformer.eval.task`; :mod:`difftransformer.eval.registry` lists them, ``cli``
is ``difftransformer eval`` and ``suite`` runs every task with light settings on one model (what ``compare`` does).
``logits`` hooks attention logits on our models and on transformers models alike; ``common`` holds what the tasks
share. Adding a task = one module + one registry line.
"""

from difftransformer.eval.registry import TASKS, all_tasks, get_task, parse_tasks
from difftransformer.eval.suite import SuiteSettings, run_suite
from difftransformer.eval.task import Task

__all__ = ["TASKS", "SuiteSettings", "Task", "all_tasks", "get_task", "parse_tasks", "run_suite"]
