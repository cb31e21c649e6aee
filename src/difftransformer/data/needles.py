"""Multi-needle retrieval samples (paper §3.4): the generator that training (retrieval blocks mixed into the
data) and evaluation (the needle, attention and quant tasks) share, and :class:`NeedleSpec`, what a needle is,
passed as one object by both.

A needle is a short sentence giving a city a magic number. N needles go into a haystack of ordinary text;
R of the cities are queried. The answer needle (the first queried city) sits at a chosen depth of the
context, every other needle at a random position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from difftransformer.errors import UsageError

CITIES: tuple[str, ...] = (
    "Amsterdam", "Athens", "Bangkok", "Barcelona", "Beijing", "Berlin", "Bogota", "Boston", "Brussels",
    "Budapest", "Cairo", "Chicago", "Copenhagen", "Dakar", "Dublin", "Edinburgh", "Florence", "Geneva",
    "Hamburg", "Havana", "Helsinki", "Istanbul", "Jakarta", "Kyoto", "Lagos", "Lima", "Lisbon", "London",
    "Madrid", "Manila", "Melbourne", "Miami", "Milan", "Montreal", "Moscow", "Mumbai", "Munich", "Nairobi",
    "Naples", "Oslo", "Paris", "Prague", "Quito", "Riga", "Rome", "Santiago", "Seattle", "Seoul",
    "Shanghai", "Singapore", "Stockholm", "Sydney", "Taipei", "Tokyo", "Toronto", "Valencia", "Vienna",
    "Warsaw", "Zagreb", "Zurich",
)  # fmt: skip

NEEDLE_TEMPLATE = " The magic number of {city} is {number}. "
QUESTION_TEMPLATE = "\nWhat are the magic numbers of {cities}?\nThe magic number of {city} is"


# The widest magic number a NumPy int64 draw holds (10**19 overflows it).
MAX_DIGITS = 18


@dataclass(frozen=True)
class NeedleSpec:
    """What a needle is, declared once for training, evaluation and compare: magic numbers of ``needle_digits``
    digits (no leading zero), hidden by ``needle_template`` (with {city} and {number}) and asked for by
    ``question_template`` (with {cities}, every queried city comma-joined, and {city}, the one whose number a prompt
    asks for, ending in the answer prefix). The field names are the flags that set them (``--needle-digits``); the
    evaluation tasks' options inherit them."""

    needle_digits: int = field(
        default=6,
        metadata={
            "help": f"digits of the magic numbers, 1 to {MAX_DIGITS} (models from `compare "
            "--preset tiny` were trained on 3)"
        },  # fmt: skip
    )
    needle_template: str = field(
        default=NEEDLE_TEMPLATE, metadata={"help": "needle sentence with {city} and {number}"}
    )
    question_template: str = field(
        default=QUESTION_TEMPLATE,
        metadata={"help": "question with {cities} and {city}, ending in the answer prefix"},
    )

    def __post_init__(self) -> None:
        if not 1 <= self.needle_digits <= MAX_DIGITS:
            raise UsageError(
                f"`needle_digits` must lie in [1, {MAX_DIGITS}] (a magic number is drawn as a 64-bit integer); "
                f"got {self.needle_digits}"
            )
        for name, fields in (("needle_template", ("{city}", "{number}")), ("question_template", ("{city}",))):
            missing = [f for f in fields if f not in getattr(self, name)]
            if missing:
                raise UsageError(f"`{name}` must contain {', '.join(missing)}; got {getattr(self, name)!r}")

    @property
    def needle_spec(self) -> NeedleSpec:
        """The spec alone (an evaluation task's options inherit these fields and carry others)."""
        return NeedleSpec(self.needle_digits, self.needle_template, self.question_template)

    def number(self, rng: np.random.Generator) -> str:
        """One magic number drawn from ``rng``."""
        return str(int(rng.integers(10 ** (self.needle_digits - 1), 10**self.needle_digits)))

    def widest_number(self) -> str:
        """The widest magic number, to budget its tokens (a byte-level BPE splits numbers unevenly)."""
        return "9" * self.needle_digits


DEFAULT_NEEDLE = NeedleSpec()


@dataclass
class NeedleSample:
    """One multi-needle retrieval sample; one prompt per queried city.

    Attributes:
        prompt_ids: R token-id lists; prompt r is the shared context, then the question ending in the
            answer prefix for queried city r ("... The magic number of {city_r} is").
        prompts: the same prompts as text (tokenizer.decode of prompt_ids).
        answers: R magic numbers as strings, in query order.
        answer_ids: R token-id lists of " {number}" (what greedy decoding should produce).
        cities, numbers: all N needles' cities and numbers, in insertion order (answer needle first).
        queried: indices into ``cities`` of the R queried needles (``queried[0] == 0``: the answer needle).
        answer_span: [start, end) token positions of the answer needle in every prompt.
        needle_spans: [start, end) of each of the N needles, same order as ``cities``.
        context_end: position where the question starts (the haystack and needles are [0, context_end)).
        depth: the answer needle's depth in [0, 1].
    """

    prompt_ids: list[list[int]]
    prompts: list[str]
    answers: list[str]
    answer_ids: list[list[int]]
    cities: list[str]
    numbers: list[str]
    queried: list[int]
    answer_span: tuple[int, int]
    needle_spans: list[tuple[int, int]] = field(default_factory=list)
    context_end: int = 0
    depth: float = 0.0


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def make_needle_sample(
    tokenizer,
    haystack_texts: Sequence[str] | Sequence[int],
    *,
    context_tokens: int,
    num_needles: int,
    num_queries: int,
    depth: float,
    rng: np.random.Generator,
    spec: NeedleSpec = DEFAULT_NEEDLE,
    cities: Sequence[str] = CITIES,
) -> NeedleSample:
    """Draw one sample of exactly ``context_tokens`` tokens per prompt (question included).

    The haystack is a window of the tokenized ``haystack_texts`` starting at a random offset; the needles
    are spliced in at token boundaries, so spans are exact in the ids the model sees. Cities (distinct)
    and magic numbers (``spec.needle_digits`` digits, no leading zero) are drawn from ``rng`` per sample.

    Args:
        tokenizer: a transformers tokenizer (called without special tokens).
        haystack_texts: documents (joined by newlines), or an already tokenized stream of ids (faster when
            drawing many samples: tokenize once with ``tokenizer(text)["input_ids"]``).
        context_tokens: total length of each prompt in tokens.
        num_needles: N >= 1.
        num_queries: R, 1 <= R <= N.
        depth: the answer needle's position as a fraction of the haystack, 0 (start) to 1 (end).
        rng: a NumPy generator; the same seed gives the same sample.
        spec: the magic numbers' digits, the needle sentence and the question.

    Raises:
        UsageError: impossible requests (R > N, more needles than cities, needles and question longer
            than the context, a haystack too short for it).
    """
    if num_needles < 1:
        raise UsageError(f"num_needles must be >= 1; got {num_needles}")
    if not 1 <= num_queries <= num_needles:
        raise UsageError(f"num_queries must lie in [1, num_needles={num_needles}]; got {num_queries}")
    if num_needles > len(cities):
        raise UsageError(f"num_needles={num_needles} exceeds the {len(cities)} available cities")
    if not 0.0 <= depth <= 1.0:
        raise UsageError(f"depth must lie in [0, 1]; got {depth}")

    chosen = [cities[i] for i in rng.choice(len(cities), size=num_needles, replace=False)]
    numbers = [spec.number(rng) for _ in chosen]
    queried = [
        0,
        *sorted(rng.choice(np.arange(1, num_needles), size=num_queries - 1, replace=False).tolist()),
    ]
    needle_ids = [
        encode(tokenizer, spec.needle_template.format(city=c, number=n)) for c, n in zip(chosen, numbers)
    ]
    query_cities = ", ".join(chosen[i] for i in queried)
    question_ids = [
        encode(tokenizer, spec.question_template.format(cities=query_cities, city=chosen[i])) for i in queried
    ]
    # Prompts must all have the same context; pad shorter questions by taking a longer haystack.
    longest_question = max(len(q) for q in question_ids)
    budget = context_tokens - sum(len(n) for n in needle_ids) - longest_question
    if budget < 1:
        raise UsageError(
            f"{num_needles} needles and the question need {context_tokens - budget + 1} tokens, more than "
            f"context_tokens={context_tokens}; use fewer needles or a longer context"
        )

    # An id stream is sliced where it lies: copying it per sample made drawing many samples quadratic in its size.
    stream = (
        haystack_texts
        if len(haystack_texts) and isinstance(haystack_texts[0], (int, np.integer))
        else encode(tokenizer, "\n".join(haystack_texts))
    )
    if len(stream) < budget:
        raise UsageError(
            f"the haystack has {len(stream)} tokens; a {context_tokens}-token context needs {budget}"
        )
    start = int(rng.integers(0, len(stream) - budget + 1))
    haystack = np.asarray(stream[start : start + budget]).tolist()

    # Insertion points in the haystack: the answer needle at its depth, the others uniformly at random.
    points = [round(depth * budget)] + rng.integers(0, budget + 1, size=num_needles - 1).tolist()
    order = sorted(range(num_needles), key=lambda i: (points[i], i))
    context: list[int] = []
    spans: list[tuple[int, int]] = [(0, 0)] * num_needles
    cursor = 0
    for i in order:
        context.extend(haystack[cursor : points[i]])
        cursor = points[i]
        spans[i] = (len(context), len(context) + len(needle_ids[i]))
        context.extend(needle_ids[i])
    context.extend(haystack[cursor:])

    prompt_ids = []
    for ids in question_ids:
        # Each prompt keeps the shared context; shorter questions are left-filled with extra haystack so
        # every prompt has exactly context_tokens tokens and the needle spans stay put.
        fill = np.asarray(stream[start + budget : start + budget + longest_question - len(ids)]).tolist()
        prompt_ids.append(context + fill + ids)
    if any(len(p) != context_tokens for p in prompt_ids):
        raise UsageError(f"the haystack is too short to fill {context_tokens} tokens for every question")
    return NeedleSample(
        prompt_ids=prompt_ids,
        prompts=[tokenizer.decode(p) for p in prompt_ids],
        answers=[numbers[i] for i in queried],
        answer_ids=[encode(tokenizer, " " + numbers[i]) for i in queried],
        cities=chosen,
        numbers=numbers,
        queried=queried,
        answer_span=spans[0],
        needle_spans=spans,
        context_end=len(context),
        depth=depth,
    )
