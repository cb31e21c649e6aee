"""Judges of a text written from a source document: is it free of hallucination?

- :class:`EntityJudge` (``--judge entities``, offline and deterministic): the numbers and named entities of
  the output that occur nowhere in the source; the output is judged free when it is not empty and has none.
- :class:`ModelJudge` (``--judge MODEL_DIR``): any local causal LM, ideally instruction-tuned, with the
  paper's protocol: it reads the source and the output, is asked whether the output is accurate and free of
  hallucination, and its answer is read from its next-token probabilities of "Yes" and "No".

docs/evaluation.md ("Contextual hallucination") gives the definitions, their limits, and how they relate to
the paper's GPT-4o judgments.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from difftransformer.errors import UsageError
from difftransformer.eval.common import check_context_length, load_model_and_tokenizer, model_device
from difftransformer.stats import mean


@dataclass(frozen=True)
class Judgment:
    """One verdict: ``free`` (judged accurate and free of hallucination) and the judge's JSON-able details."""

    free: bool
    details: dict = field(default_factory=dict)


class Judge(ABC):
    """Judges outputs against their sources. ``name`` goes into the results."""

    name: str

    @abstractmethod
    def __call__(self, source: str, output: str) -> Judgment:
        """Judge ``output`` (written from ``source``)."""

    def check(self, sources: Sequence[str], output_tokens: int) -> None:
        """Refuse, before any generation, sources the judge cannot read with an output of ``output_tokens``.
        By default a judge reads texts of any length."""
        return None

    def aggregate(self, judgments: Sequence[Judgment]) -> dict:
        """The judge's numbers over many judgments: ``free``, the share judged free of hallucination."""
        if not judgments:
            raise ValueError("aggregate needs at least one judgment")
        return {"free": mean([float(j.free) for j in judgments])}


# Words that start sentences without being names ("The", "He", "In"); mid-sentence, a capital means a name
# ("in May", "The Times"), except for "I".
FUNCTION_WORDS = frozenset(
    """a about after all also an and another any are as at be because before but by can could did do does
    during each either every few for from had has have he her here hers him his how i if in into is it its
    just many may me might more most much must my neither no nor not now of on once one only or other our
    over same several she should since so some such than that the their them then there these they this
    those though through to too under until up upon was we were what when where whether which while who
    whom whose why will with within without would yet you your""".split()
)

_TOKEN = re.compile(r"[^\W_]+(?:['’.,\-][^\W_]+)*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _normalise(token: str) -> str:
    """Lower case, one apostrophe, no possessive, no thousands separator: how texts are compared."""
    token = token.lower().replace("’", "'")
    token = re.sub(r"'s?$", "", token)
    return re.sub(r"(?<=\d),(?=\d)", "", token)


def _source_index(source: str) -> tuple[str, set[str]]:
    """The source as one space-joined string of normalised tokens (for phrase look-up), and their set."""
    tokens = [_normalise(t) for t in _TOKEN.findall(source)]
    return " " + " ".join(tokens) + " ", set(tokens)


def extract_entities(text: str, common_words: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The numbers and named entities of ``text``, in order, as written (possessives dropped).

    A number is a token holding a digit ("6", "41.32", "1,000", "3G"). A named entity is a maximal run of
    capitalised tokens separated by single spaces ("Tony Blair", "New York Mercantile Exchange"); "I" is none.
    A sentence's first word counts only when it is no function word (:data:`FUNCTION_WORDS`) and its
    lower-case form is not in ``common_words`` (the lower-case words of the texts at hand), so that "Shares
    fell" does not make "Shares" a name while "Blair said" keeps "Blair".
    """
    entities: list[str] = []
    for sentence in _SENTENCE_END.split(text.strip()):
        run: list[str] = []
        run_end = 0
        for index, match in enumerate(_TOKEN.finditer(sentence)):
            raw = match.group(0)
            token = re.sub(r"['’]s?$", "", raw)
            if any(ch.isdigit() for ch in token):
                entities.extend([" ".join(run)] if run else [])
                entities.append(token)
                run = []
                continue
            lower = token.lower()
            name = token[:1].isupper() and token != "I"
            name = name and not (index == 0 and (lower in FUNCTION_WORDS or lower in common_words))
            if name and run and sentence[run_end : match.start()] == " ":
                run.append(token)
            else:
                entities.extend([" ".join(run)] if run else [])
                run = [token] if name else []
            run_end = match.end()
            if run and raw != token:  # a possessive closes its name: "Blair's Labour party"
                entities.append(" ".join(run))
                run = []
        entities.extend([" ".join(run)] if run else [])
    return entities


class EntityJudge(Judge):
    """Entity-level faithfulness without a reference: the output's numbers and named entities (see
    :func:`extract_entities`) that occur nowhere in the source are unsupported. A number is supported when the
    source has the same number (thousands separators ignored); a name when the source has the same words in a
    row, case ignored. The output is judged free when it is not empty and has no unsupported entity.

    Details per judgment: ``entities``, ``unsupported`` and ``rate`` (unsupported / entities; None without
    entities).
    """

    name = "entities"

    def __call__(self, source: str, output: str) -> Judgment:
        joined, tokens = _source_index(source)
        lower_words = {w for text in (source, output) for w in _TOKEN.findall(text) if w[:1].islower()}
        entities = extract_entities(output, lower_words)
        unsupported = []
        for entity in entities:
            parts = [_normalise(t) for t in _TOKEN.findall(entity)]
            supported = parts[0] in tokens if len(parts) == 1 else f" {' '.join(parts)} " in joined
            if not supported:
                unsupported.append(entity)
        rate = len(unsupported) / len(entities) if entities else None
        free = bool(output.strip()) and not unsupported
        return Judgment(free, dict(entities=entities, unsupported=unsupported, rate=rate))

    def aggregate(self, judgments: Sequence[Judgment]) -> dict:
        """Adds ``entity_hallucination_rate`` (all unsupported entities over all entities, None without any),
        ``entities`` (their count) and ``without_entities`` (the share of outputs naming nothing to check:
        judged free unless empty, a reason to read ``free`` with care)."""
        numbers = super().aggregate(judgments)
        total = sum(len(j.details["entities"]) for j in judgments)
        unsupported = sum(len(j.details["unsupported"]) for j in judgments)
        numbers["entity_hallucination_rate"] = unsupported / total if total else None
        numbers["entities"] = total
        numbers["without_entities"] = mean([float(not j.details["entities"]) for j in judgments])
        return numbers


JUDGE_TEMPLATE = (
    "Read a source document and a text written from it.\n\nDocument:\n{source}\n\nText:\n{output}\n\n"
    "Is the text accurate and free of hallucination with respect to the document? Answer Yes or No."
)
YES_WORDS: tuple[str, ...] = ("Yes", " Yes", "yes", " yes", "YES")
NO_WORDS: tuple[str, ...] = ("No", " No", "no", " no", "NO")


def _first_tokens(tokenizer, words: Sequence[str]) -> set[int]:
    return {ids[0] for ids in (tokenizer(w, add_special_tokens=False)["input_ids"] for w in words) if ids}


class ModelJudge(Judge):
    """A causal LM as a binary judge (the paper's protocol with a local model in GPT-4o's place).

    The prompt is :data:`JUDGE_TEMPLATE` as the user turn of the tokenizer's chat template when it has one
    (generation prompt added), else the plain text followed by "\\nAnswer:". From the next-token distribution,
    P(yes) and P(no) are the probabilities of the first tokens of :data:`YES_WORDS` and :data:`NO_WORDS`
    (tokens both lists start with are dropped); the output is judged free when P(yes) > P(no).

    Details per judgment: ``p_yes`` = P(yes) / (P(yes) + P(no)) and ``mass`` = P(yes) + P(no), the share of
    the judge's next-token probability on the two answers (low: the judge is not following the protocol).
    """

    def __init__(self, model: nn.Module, tokenizer: Any, name: str = "model"):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        yes, no = _first_tokens(tokenizer, YES_WORDS), _first_tokens(tokenizer, NO_WORDS)
        self.yes_ids, self.no_ids = sorted(yes - no), sorted(no - yes)
        if not self.yes_ids or not self.no_ids:
            raise UsageError(
                f"`judge` {name}: its tokenizer does not tell 'Yes' from 'No' by their first token"
            )

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, device: str | torch.device = "cpu", dtype: str = "float32"
    ) -> ModelJudge:
        """Load a local checkpoint directory (weights and tokenizer) as a judge."""
        model, tokenizer = load_model_and_tokenizer(path, dtype=dtype, device=str(device), what="judge")
        return cls(model, tokenizer, name=str(path))

    def prompt_ids(self, source: str, output: str) -> list[int]:
        """The judge's prompt for one (source, output) as token ids."""
        question = JUDGE_TEMPLATE.format(source=source, output=output)
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
            )
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(question + "\nAnswer:")["input_ids"])

    def check(self, sources: Sequence[str], output_tokens: int) -> None:
        longest = max(len(self.prompt_ids(source, "")) for source in sources)
        check_context_length(self.model, longest + output_tokens, f"`judge` {self.name} (prompt tokens)")

    @torch.no_grad()
    def __call__(self, source: str, output: str) -> Judgment:
        ids = self.prompt_ids(source, output)
        check_context_length(self.model, len(ids), f"`judge` {self.name} (prompt tokens)")
        input_ids = torch.tensor([ids], device=model_device(self.model))
        logits = self.model(input_ids=input_ids, use_cache=False).logits[0, -1].float()
        probs = torch.softmax(logits, dim=-1)
        yes, no = float(probs[self.yes_ids].sum()), float(probs[self.no_ids].sum())
        mass = yes + no
        p_yes = yes / mass if mass > 0 else 0.5
        return Judgment(p_yes > 0.5, dict(p_yes=p_yes, mass=mass))

    def aggregate(self, judgments: Sequence[Judgment]) -> dict:
        """Adds ``mean_p_yes`` and ``mean_mass`` (see the class docstring)."""
        numbers = super().aggregate(judgments)
        numbers["mean_p_yes"] = mean([j.details["p_yes"] for j in judgments])
        numbers["mean_mass"] = mean([j.details["mass"] for j in judgments])
        return numbers


def load_judge(spec: str | Judge, *, device: str | torch.device = "cpu", dtype: str = "float32") -> Judge:
    """``"entities"``: :class:`EntityJudge`; a checkpoint directory: :class:`ModelJudge`; a Judge: itself."""
    if isinstance(spec, Judge):
        return spec
    if spec == "entities":
        return EntityJudge()
    check_judge_spec(spec)
    return ModelJudge.from_pretrained(spec, device=device, dtype=dtype)


def check_judge_spec(spec: str) -> None:
    """Refuse a judge that is neither "entities" nor a local checkpoint directory, before any long work."""
    if spec != "entities" and not os.path.isfile(os.path.join(spec, "config.json")):
        raise UsageError(
            f"`judge` must be 'entities' or a local model directory with a config.json; got {spec!r}"
        )
