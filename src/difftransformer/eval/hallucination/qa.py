"""Contextual question answering judged exactly: the QA family of the contextual-hallucination task.

A document is a run of short sentences, each stating one attribute of one person ("Anna lives in Paris.",
"Bruno works as a baker.", "Clara is 42 years old."). Every person in a document has a value for every
attribute kind of the document, so the distractors (the people other than the one asked about) share the
answer's attribute type. The question asks for one attribute of one person; the gold answer is stated once in
the document, at a chosen depth (the gold sentence's index over the last index).

Every value is a single word, so an answer is judged exactly (see :func:`extract_answer` and
:func:`judge_answer`):

- ``correct``: the gold value;
- ``confusion``: a value stated in the document other than the gold one (mostly another person's value of the
  asked attribute: the answer is grounded in the document but wrong);
- ``hallucination``: a word that occurs nowhere in the document (a contextual hallucination);
- ``other``: no answer, or a word of the document that is no stated value (a name, "lives", ...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from difftransformer.data.needles import CITIES
from difftransformer.errors import UsageError

CATEGORIES: tuple[str, ...] = ("correct", "hallucination", "confusion", "other")

NAMES: tuple[str, ...] = (
    "Adam", "Alice", "Anna", "Arthur", "Bruno", "Carl", "Clara", "Daniel", "David", "Diana", "Edgar", "Elena",
    "Emil", "Felix", "Fiona", "Frank", "Greta", "Harold", "Helen", "Henry", "Hugo", "Irene", "Ivan", "Jack",
    "Julia", "Karl", "Laura", "Lena", "Lucas", "Marco", "Maria", "Martin", "Nina", "Nora", "Oscar", "Otto",
    "Paula", "Peter", "Rosa", "Simon", "Sofia", "Thomas", "Vera", "Walter",
)  # fmt: skip


@dataclass(frozen=True)
class Attribute:
    """One attribute kind: how a document states it, how a question asks for it, and its possible values
    (single words)."""

    statement: str  # with {name} and {value}
    question: str  # with {name}
    values: tuple[str, ...]


ATTRIBUTES: dict[str, Attribute] = {
    "city": Attribute(
        "{name} lives in {value}.", "Where does {name} live?",
        tuple(c for c in CITIES if c not in NAMES),
    ),
    "job": Attribute(
        "{name} works as a {value}.", "What is {name}'s job?",
        ("baker", "farmer", "sailor", "doctor", "tailor", "painter", "soldier", "merchant", "teacher",
         "butcher", "singer", "miner", "nurse", "judge", "poet", "pilot", "lawyer", "potter", "weaver",
         "carpenter"),
    ),
    "colour": Attribute(
        "{name}'s favourite colour is {value}.", "What is {name}'s favourite colour?",
        ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "brown", "grey", "pink",
         "silver", "golden", "violet", "crimson", "scarlet"),
    ),
    "age": Attribute(
        "{name} is {value} years old.", "How old is {name}?", tuple(str(n) for n in range(18, 90))
    ),
    "pet": Attribute(
        "{name} keeps a {value}.", "What animal does {name} keep?",
        ("cat", "dog", "horse", "goat", "rabbit", "parrot", "tortoise", "hamster", "pony", "donkey", "ferret",
         "lizard", "canary", "pig", "duck", "sheep"),
    ),
}  # fmt: skip

QA_TEMPLATE = "{document}\n\nQuestion: {question}\nAnswer:"
ARTICLES = frozenset({"a", "an", "the"})


@dataclass(frozen=True)
class QAItem:
    """One contextual question.

    Attributes:
        document: the sentences, joined by spaces.
        question: the question (without the prompt template).
        answer: the gold value.
        entity, attribute: the person asked about and the attribute kind asked for.
        values: every attribute value stated in the document (the gold one included).
        depth: the depth cell the item was drawn for, in [0, 1].
        position, sentences: the gold sentence's index and the number of sentences.
        distractors: people in the document other than ``entity``.
    """

    document: str
    question: str
    answer: str
    entity: str
    attribute: str
    values: tuple[str, ...]
    depth: float
    position: int
    sentences: int
    distractors: int


def max_distractors(attributes: Sequence[str]) -> int:
    """The most distractors a document of these attribute kinds can hold (each person has distinct values)."""
    return min(len(NAMES), *(len(ATTRIBUTES[kind].values) for kind in attributes)) - 1


def check_qa_settings(depths: Sequence[float], distractors: Sequence[int], attributes: Sequence[str]) -> None:
    """Refuse depths outside [0, 1], unknown attribute kinds and distractor counts no document can hold."""
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise UsageError(f"`depths` must be a non-empty list of values in [0, 1]; got {list(depths)}")
    unknown = [kind for kind in attributes if kind not in ATTRIBUTES]
    if not attributes or unknown or len(set(attributes)) != len(attributes):
        raise UsageError(
            f"`attributes` must be distinct names from {', '.join(ATTRIBUTES)}; got {list(attributes)}"
        )
    most = max_distractors(attributes)
    if not distractors or any(not 0 <= k <= most for k in distractors):
        raise UsageError(
            f"`distractors` must be a non-empty list of counts in [0, {most}] (for `attributes` "
            f"{', '.join(attributes)}); got {list(distractors)}"
        )


def make_qa_item(
    rng: np.random.Generator, *, distractors: int, depth: float, attributes: Sequence[str] = tuple(ATTRIBUTES)
) -> QAItem:
    """Draw one item: ``distractors + 1`` people, distinct values per attribute kind, one sentence per
    (person, kind) in random order except the gold sentence, placed at index ``round(depth * (sentences -
    1))``."""
    check_qa_settings([depth], [distractors], attributes)
    people = [NAMES[i] for i in rng.choice(len(NAMES), size=distractors + 1, replace=False)]
    values = {}
    for kind in attributes:
        pool = ATTRIBUTES[kind].values
        values[kind] = [pool[i] for i in rng.choice(len(pool), size=len(people), replace=False)]
    asked = attributes[int(rng.integers(len(attributes)))]
    facts = [(p, kind) for p in range(len(people)) for kind in attributes if (p, kind) != (0, asked)]
    facts = [facts[i] for i in rng.permutation(len(facts))]
    position = round(depth * len(facts))
    facts.insert(position, (0, asked))
    sentences = [
        ATTRIBUTES[kind].statement.format(name=people[p], value=values[kind][p]) for p, kind in facts
    ]
    return QAItem(
        document=" ".join(sentences),
        question=ATTRIBUTES[asked].question.format(name=people[0]),
        answer=values[asked][0],
        entity=people[0],
        attribute=asked,
        values=tuple(v for kind in attributes for v in values[kind]),
        depth=depth,
        position=position,
        sentences=len(sentences),
        distractors=distractors,
    )


def make_qa_items(
    seed: int,
    *,
    depths: Sequence[float],
    distractors: Sequence[int],
    samples: int,
    attributes: Sequence[str] = tuple(ATTRIBUTES),
) -> list[QAItem]:
    """``samples`` items per (distractors, depth) cell, in that order. Each cell draws from its own generator,
    seeded by ``seed``, its distractor count and its depth, so that a cell's items do not depend on which
    other cells are asked for; the same seed gives the same items."""
    if samples < 1:
        raise UsageError(f"`samples` must be >= 1; got {samples}")
    check_qa_settings(depths, distractors, attributes)
    items = []
    for k in distractors:
        for depth in depths:
            rng = np.random.default_rng([seed, k, round(depth * 10**6)])
            items += [
                make_qa_item(rng, distractors=k, depth=depth, attributes=attributes) for _ in range(samples)
            ]
    return items


_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


def words(text: str) -> list[str]:
    """The lower-cased words of ``text``: runs of letters and digits, apostrophes inside a word kept, a
    possessive 's dropped ("Anna's" -> "anna")."""
    return [re.sub(r"'s$", "", w.replace("’", "'")) for w in _WORD.findall(text.lower())]


def extract_answer(continuation: str) -> str:
    """The answer in a continuation: its text up to the first newline, the first word there after any leading
    article (a, an, the), lower-cased; "" when there is none."""
    for word in words(continuation.split("\n", 1)[0]):
        if word not in ARTICLES:
            return word
    return ""


def answer_complete(continuation: str) -> bool:
    """Whether more text can no longer change :func:`extract_answer`: the continuation has a newline, or its
    first word after any articles is followed by a character that cannot continue it (decoding can stop)."""
    if "\n" in continuation:
        return True
    for match in _WORD.finditer(continuation.lower()):
        if match.group(0) not in ARTICLES:
            return match.end() < len(continuation)
    return False


def judge_answer(item: QAItem, answer: str) -> str:
    """One of :data:`CATEGORIES` for an extracted ``answer`` (see the module docstring)."""
    if answer == item.answer.lower():
        return "correct"
    if answer in {v.lower() for v in item.values}:
        return "confusion"
    if answer and answer not in set(words(item.document)):
        return "hallucination"
    return "other"


def rates(categories: Sequence[str]) -> dict[str, float]:
    """The share of each category (every one of :data:`CATEGORIES`, zeros included) in ``categories``."""
    if not categories:
        raise ValueError("rates need at least one judged answer")
    return {name: sum(c == name for c in categories) / len(categories) for name in CATEGORIES}


def evaluate_qa(
    items: Sequence[QAItem],
    generate: Callable[[str], str],
    *,
    template: str = QA_TEMPLATE,
    on_item: Callable[[], None] | None = None,
) -> dict:
    """Answer every item with ``generate`` (prompt -> continuation) and judge it exactly.

    Returns ``rates`` (overall), ``by_depth`` and ``by_distractors`` (each a list of rates with its cell value
    and item count) and ``outputs`` (per item: what it asked, the continuation, the extracted answer and its
    category). ``on_item`` is called after each item (a progress bar's update).
    """
    outputs = []
    for item in items:
        continuation = generate(template.format(document=item.document, question=item.question))
        answer = extract_answer(continuation)
        outputs.append(dict(
            entity=item.entity, attribute=item.attribute, gold=item.answer, continuation=continuation,
            answer=answer, category=judge_answer(item, answer), depth=item.depth, position=item.position,
            sentences=item.sentences, distractors=item.distractors,
        ))  # fmt: skip
        if on_item is not None:
            on_item()

    def cells(key: str) -> list[dict]:
        values = sorted({o[key] for o in outputs})
        return [
            {key: v, "items": len(group), **rates([o["category"] for o in group])}
            for v in values
            for group in [[o for o in outputs if o[key] == v]]
        ]

    return dict(
        rates=rates([o["category"] for o in outputs]),
        by_depth=cells("depth"),
        by_distractors=cells("distractors"),
        outputs=outputs,
    )
