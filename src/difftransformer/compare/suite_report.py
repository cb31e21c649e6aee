"""The evaluation suite's report sections at their earlier import path; they live in
:mod:`difftransformer.compare.report.suite`."""

from difftransformer.compare.report.suite import plot_task, suite_sections, task_table

__all__ = ["plot_task", "suite_sections", "task_table"]
