"""Contextual hallucination (the paper's Table 4), offline: the task (:mod:`.task`), exactly judged contextual QA
(:mod:`.qa`), summaries of documents (:mod:`.summaries`) and their judges (:mod:`.judges`), and the greedy
generation both families prompt with (:mod:`.generation`)."""

from difftransformer.eval.hallucination.generation import Generate, greedy_generator, prompt_tokens
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
    "Generate",
    "HallucinationOptions",
    "HallucinationTask",
    "cut_words",
    "evaluate_summaries",
    "fit_document",
    "greedy_generator",
    "load_documents",
    "prompt_tokens",
    "run_hallucination",
]
