"""Contextual hallucination (the paper's Table 4), offline: the task (:mod:`.task`), exactly judged contextual QA
(:mod:`.qa`), summaries of documents (:mod:`.summaries`) and their judges (:mod:`.judges`). Both families prompt
the model with :mod:`difftransformer.eval.generation`'s greedy generator."""

from difftransformer.eval.hallucination.summaries import (
    SUMMARY_TEMPLATE,
    cut_words,
    evaluate_summaries,
    fit_document,
    load_documents,
)
from difftransformer.eval.hallucination.task import (
    TASK,
    HallucinationOptions,
    HallucinationTask,
    run_hallucination,
)

__all__ = [
    "SUMMARY_TEMPLATE",
    "TASK",
    "HallucinationOptions",
    "HallucinationTask",
    "cut_words",
    "evaluate_summaries",
    "fit_document",
    "load_documents",
    "run_hallucination",
]
