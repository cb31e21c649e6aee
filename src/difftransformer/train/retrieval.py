"""Multi-needle retrieval blocks (the paper's §3.4 task) to mix into training, drawn with the generator the
evaluation uses (:mod:`difftransformer.data.needles`).

A retrieval block is packed with episodes, each one :func:`difftransformer.data.needles.make_needle_sample` context
(Shakespeare haystack with N magic-number needles) and its question, answered for every needle in turn ("The magic
number of A is 123\nThe magic number of B is 456..."), episodes separated by EOS as packed documents are. Copying a
number from context is what the model must learn, and a tiny model needs many such copies before it does: answering
every needle, and packing short episodes (haystacks from none to the whole block) several to a block, gives about
ten times the supervised retrievals of one long question per block. The evaluation asks the same kind of question
with fresh cities, numbers and held-out haystack.
"""

from __future__ import annotations

import numpy as np
import torch

from difftransformer.data.needles import CITIES, DEFAULT_NEEDLE, NeedleSpec, make_needle_sample
from difftransformer.errors import UsageError


def follow_up_template(spec: NeedleSpec) -> str:
    """The question's last line (from its last newline on): the answer prefix, asked again for each further
    needle."""
    template = spec.question_template
    return template[template.rfind("\n") :] if "\n" in template else "\n" + template


class _EpisodeSizer:
    """Token counts of an episode's parts for given cities, to size its haystack before drawing it."""

    def __init__(self, tokenizer, spec: NeedleSpec) -> None:
        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        # A number's token count depends on its digits only loosely (byte-level BPE): budget the widest.
        number = spec.widest_number()
        self.needle = {c: count(spec.needle_template.format(city=c, number=number)) + 2 for c in CITIES}
        self.answer = count(" " + number) + 2
        self.follow_up = {c: count(follow_up_template(spec).format(city=c)) for c in CITIES}
        self.count = count
        self.question_template = spec.question_template

    def fixed_tokens(self, cities: list[str]) -> int:
        """Needles, question and every answer: all of an episode but its haystack."""
        # The sample's context makes room for its longest question (one per queried city).
        question = max(
            self.count(self.question_template.format(cities=", ".join(cities), city=c)) for c in cities
        )
        return (
            sum(self.needle[c] for c in cities)
            + question
            + self.answer * len(cities)
            + sum(self.follow_up[c] for c in cities[1:])
        )


class NeedleRows:
    """Draws retrieval blocks of ``block_size`` tokens, one per call, each packed with episodes of 1..max_needles
    needles (the first at a uniform random depth) in a haystack of uniform random length, every needle answered,
    EOS after each; the space no further episode fits in is filled with haystack. ``stream`` is tokenized haystack
    text (1-D ids; a memory-mapped one stays on disk: each episode reads only the window it uses)."""

    def __init__(
        self,
        stream: list[int] | torch.Tensor | np.ndarray,
        tokenizer,
        block_size: int,
        *,
        max_needles: int = 4,
        needle: NeedleSpec = DEFAULT_NEEDLE,
    ) -> None:
        self.ids = stream.numpy() if isinstance(stream, torch.Tensor) else np.asarray(stream)
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.max_needles = max_needles
        self.needle = needle
        self.sizer = _EpisodeSizer(tokenizer, needle)
        smallest = min(self.sizer.fixed_tokens([c]) for c in CITIES) + 1
        if block_size < 2 * smallest:
            raise UsageError(
                f"`block_size` must be at least {2 * smallest} for the needle rows that `needle_fraction` draws "
                f"in; got {block_size}: give `needle_fraction` 0 to train without them, or a longer `block_size`"
            )
        if len(self.ids) <= block_size:
            raise UsageError(
                f"the haystack stream must hold more than {block_size} tokens; got {len(self.ids)}"
            )

    def row(self, rng: np.random.Generator) -> list[int]:
        """One retrieval block (``block_size`` ids) drawn with ``rng``."""
        sizer, tokenizer, ids = self.sizer, self.tokenizer, self.ids
        row: list[int] = []
        while True:
            room = self.block_size - len(row) - 1  # an EOS ends each episode
            needles = int(rng.integers(1, self.max_needles + 1))
            cities = [CITIES[i] for i in rng.choice(len(CITIES), size=needles, replace=False)]
            fixed = sizer.fixed_tokens(cities)
            if fixed > room:
                break
            # Mostly short haystacks (more episodes, more copies), sometimes up to the whole free room.
            haystack = int((room - fixed) * rng.random() ** 2)
            answers = sizer.answer * needles + sum(sizer.follow_up[c] for c in cities[1:])
            sample = make_needle_sample(
                tokenizer,
                ids,
                context_tokens=fixed - answers + haystack,
                num_needles=needles,
                num_queries=needles,
                depth=float(rng.random()),
                rng=rng,
                spec=self.needle,
                cities=cities,
            )
            row += sample.prompt_ids[0] + sample.answer_ids[0]
            for city, answer in zip(sample.cities[1:], sample.answer_ids[1:]):
                row += tokenizer(follow_up_template(self.needle).format(city=city), add_special_tokens=False)[
                    "input_ids"
                ]
                row += answer
            row.append(tokenizer.eos_token_id)
        start = int(rng.integers(0, len(ids) - self.block_size))
        return (row + ids[start : start + self.block_size].tolist())[: self.block_size]
