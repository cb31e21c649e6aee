"""The paper's numbers (Ye et al., *Differential Transformer*, arXiv 2410.05258), in one place: what every measure
and claim of a report is set against, each with the model size and data it was measured at.

Tasks point their :class:`~difftransformer.eval.task.Measure` at these; ``compare`` reads its training claims (loss,
scaling, the harness) from here too. Tables hold (Transformer, DIFF) pairs.
"""

from __future__ import annotations

# §3.1 and §3.2: language modelling and scaling.
LOSS = "DIFF 3.062 vs Transformer 3.087 validation loss (1.4B models, 10B tokens); lower at 830M-13.1B"
PARAMETERS = "62.2%: a 6.8B DIFF matches an 11B Transformer (830M-13.1B models, 10B tokens each)"
TOKENS = "63.7%: DIFF at 160B tokens matches the Transformer at 251B (3B models)"
HARNESS = (
    "The paper's zero-shot table (3B models, 350B tokens, LM Evaluation Harness): average 56.2 (DIFF) vs 55.4 "
    "(Transformer); HellaSwag 66.2 vs 63.4."
)

# §3.4, Table 2: multi-needle retrieval accuracy in 4K contexts, per N:R (N needles, R queried).
NEEDLE_ACCURACY: dict[str, tuple[float, float]] = {
    "1:1": (1.00, 1.00),
    "2:2": (0.85, 0.92),
    "4:2": (0.62, 0.84),
    "6:2": (0.55, 0.85),
}


def needle_accuracy(config: str) -> str:
    """The paper's claim for one N:R configuration ("" for one it did not measure)."""
    if config not in NEEDLE_ACCURACY:
        return ""
    transformer, diff = NEEDLE_ACCURACY[config]
    return f"DIFF {diff:.2f} vs Transformer {transformer:.2f} (3B models, 4K context)"


# The paper has no MQAR; the claim its rows stand for is key-information retrieval (multi-needle, §3.4).
RETRIEVAL = (
    "no MQAR in the paper; its retrieval claim: multi-needle accuracy 0.84 vs 0.62 (N=4, R=2, 4K context), "
    "DIFF better"
)

# §3.4, Table 3: attention allocation in multi-needle retrieval, by the answer needle's depth.
ANSWER_SHARE = "DIFF 0.27-0.40 vs Transformer 0.03-0.09 by depth (3B models, multi-needle retrieval)"
CONTEXT_SHARE = "DIFF 0.01-0.02 vs Transformer 0.49-0.54 by depth (3B models, multi-needle retrieval)"

# §3.5: long-context modelling.
LONG_CONTEXT = "DIFF lower at every position up to 64K tokens (3B models, 64K context)"

# §3.6: many-shot in-context learning and its robustness to the order of the demonstrations.
ICL_ACCURACY = (
    "DIFF 5-22 points higher as demonstrations grow (3B models, 64K context, TREC, TREC-fine, Banking-77, "
    "Clinic-150)"
)
ICL_ORDER = (
    "best minus worst of 10 orderings, TREC: DIFF 4.0 vs Transformer 19.0 points (random), 13.4 vs 56.7 "
    "(grouped by class) (3B models)"
)

# §3.7, Table 4: contextual hallucination, the share of outputs GPT-4o judged free of hallucination (3B models).
HALLUCINATION_SUMMARY: dict[str, tuple[float, float]] = {
    "XSum": (0.44, 0.53),
    "CNN/DM": (0.32, 0.41),
    "MultiNews": (0.42, 0.61),
}
HALLUCINATION_QA: dict[str, tuple[float, float]] = {
    "Qasper": (0.28, 0.39),
    "HotpotQA": (0.36, 0.46),
    "2WikiMQA": (0.29, 0.36),
}


def table_text(table: dict[str, tuple[float, float]]) -> str:
    """A table's (Transformer, DIFF) pairs as text: "XSum 0.44 / 0.53, ..."."""
    return ", ".join(f"{name} {transformer:.2f} / {diff:.2f}" for name, (transformer, diff) in table.items())


HALLUCINATION_QA_CLAIM = (
    "share judged accurate and free of hallucination (Transformer / DIFF): "
    f"{table_text(HALLUCINATION_QA)} (3B models, GPT-4o judge)"
)
HALLUCINATION_SUMMARY_CLAIM = (
    "share judged free of hallucination (Transformer / DIFF): "
    f"{table_text(HALLUCINATION_SUMMARY)} (3B models, GPT-4o judge)"
)


# §3.8: activation outliers (top-1 / median of the absolute values, 0.4M tokens) and low-bit attention.
LOGIT_OUTLIERS = "DIFF 38.8/3.3 = 12 vs Transformer 318.0/5.4 = 59 (3B models, 0.4M tokens)"
HIDDEN_OUTLIERS = "DIFF 1688.2/1.2 = 1407 vs Transformer 3608.6/0.6 = 6014 (3B models, 0.4M tokens)"
LOW_BIT = (
    "zero-shot accuracy held down to 6-bit logits by DIFF, not by the Transformer; at 4 bits DIFF about 25 points "
    "higher (3B models)"
)
