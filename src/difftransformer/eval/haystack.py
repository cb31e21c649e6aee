"""Needles in a haystack, as the needle, attention and quant tasks ask for them: the grid of prompts they share
(:class:`NeedleGrid`), its checks against a model and a tokenizer, its fitting to a model's context, and its
scoring by greedy decoding. The samples come from :mod:`difftransformer.data.needles` (shared with training's
retrieval blocks), whose :class:`~difftransformer.data.needles.NeedleSpec` says what a needle is.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn
from tqdm.auto import tqdm

from difftransformer.data.needles import CITIES, NeedleSample, NeedleSpec, encode, make_needle_sample
from difftransformer.errors import UsageError
from difftransformer.eval.common import capped, check_context_length, max_context
from difftransformer.eval.generation import greedy_ids
from difftransformer.eval.options import counts, distinct, not_empty, option, seeded
from difftransformer.flags import integer_pairs
from difftransformer.stats import wilson_interval

DEFAULT_DEPTHS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


def parse_needle_configs(text: str) -> list[tuple[int, int]]:
    """'1:1,2:2,4:2' -> [(1, 1), (2, 2), (4, 2)] as (N needles, R queries), 1 <= R <= N <= the cities there
    are."""
    configs = integer_pairs(text, "needles", "N:R as 1:1,4:2")
    for n, r in configs:
        if not 1 <= r <= n:
            raise UsageError(f"`needles`: each N:R needs 1 <= R <= N; got '{n}:{r}'")
        if n > len(CITIES):
            raise UsageError(f"`needles`: N={n} exceeds the {len(CITIES)} cities a needle can name")
    return configs


@dataclass(frozen=True)
class NeedleGrid(NeedleSpec):
    """The prompts of a needle run: for every N:R pair of ``needles``, context length and answer-needle depth,
    ``samples`` prompts drawn with ``seed``, of needles as :class:`NeedleSpec` says. The needle, attention and
    quant tasks' options extend it, each with its own defaults."""

    context_lengths: list[int] = option([1024], "prompt lengths in tokens")
    needles: list[str] = option(["1:1", "2:2", "4:2", "6:2"], "N:R pairs (N needles, R of them queried)")
    depths: list[float] = option(list(DEFAULT_DEPTHS), "answer-needle depths in [0, 1] (0: first token)")
    samples: int = option(50, "samples per (N:R, length, depth) cell")
    seed: int = option(0, "seed of the samples")

    def __post_init__(self) -> None:
        super().__post_init__()
        not_empty(self, "context_lengths", "needles", "depths")
        counts(self, "context_lengths", "samples")
        distinct(self, "context_lengths", "needles", "depths")
        seeded(self)
        parse_needle_configs(",".join(self.needles))  # refuses anything but N:R pairs with 1 <= R <= N
        if any(not 0.0 <= depth <= 1.0 for depth in self.depths):
            raise UsageError(f"`depths` must lie in [0, 1]; got {list(self.depths)}")

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The (N needles, R queried) pairs of :attr:`needles`."""
        return parse_needle_configs(",".join(self.needles))


def needle_tokens(tokenizer: Any, n: int, r: int, spec: NeedleSpec) -> int:
    """About how many tokens N needles and the question about R of them take (the longest city names)."""
    number = spec.widest_number()
    needle_len = max(
        len(encode(tokenizer, spec.needle_template.format(city=c, number=number))) for c in CITIES[:n]
    )
    question = spec.question_template.format(cities=", ".join(CITIES[:r]), city=CITIES[0])
    return n * needle_len + len(encode(tokenizer, question)) + 1


def needles_problem(tokenizer: Any, grid: NeedleGrid) -> str | None:
    """Why ``grid``'s needles and question cannot fit its shortest context (None when they fit)."""
    shortest = min(grid.context_lengths)
    for n, r in grid.pairs:
        need = needle_tokens(tokenizer, n, r, grid.needle_spec)
        if need > shortest:
            return (
                f"`needles` {n}:{r} needs about {need} tokens of needles and question, more than the context "
                f"length {shortest}"
            )
    return None


def require_needles_fit(tokenizer: Any, grid: NeedleGrid) -> None:
    """UsageError (from :func:`needles_problem`) unless ``grid``'s needles and question fit its shortest
    context."""
    problem = needles_problem(tokenizer, grid)
    if problem:
        raise UsageError(problem)


def validate_needle_run(model: nn.Module, tokenizer: Any, stream_len: int, grid: NeedleGrid) -> None:
    """Refuse an impossible grid before any decoding: lengths the model cannot take, needles that cannot fit, a
    haystack shorter than the longest context."""
    for length in grid.context_lengths:
        check_context_length(model, length, "`context_lengths`")
    require_needles_fit(tokenizer, grid)
    if stream_len < max(grid.context_lengths):
        raise UsageError(
            f"the haystack gives {stream_len} tokens; `context_lengths` needs {max(grid.context_lengths)}"
        )


def fit_needle_lengths(
    grid: NeedleGrid, model: nn.Module, tokenizer: Any, given: frozenset[str]
) -> NeedleGrid:
    """``grid`` with context lengths the user did not give capped at the model's context, and N:R pairs the user
    did not give kept only where their needles and question fit the shortest length."""
    limit = max_context(model)
    if limit is None:
        return grid
    if "context_lengths" not in given:
        grid = dataclasses.replace(grid, context_lengths=capped(grid.context_lengths, limit))
    if "needles" not in given:
        shortest = min(grid.context_lengths)
        kept = [
            f"{n}:{r}" for n, r in grid.pairs if needle_tokens(tokenizer, n, r, grid.needle_spec) <= shortest
        ]
        if kept and kept != grid.needles:
            grid = dataclasses.replace(grid, needles=kept)
    return grid


_NUMBER = re.compile(r"\d+")


def number_matches(generated_text: str, answer: str) -> bool:
    """Exact match: the first run of digits in the generated text is the magic number."""
    found = _NUMBER.search(generated_text)
    return found is not None and found.group(0) == answer


def score_sample(model: nn.Module, tokenizer: Any, sample: NeedleSample) -> list[bool]:
    """Greedy-decode each queried number; True where it matches exactly."""
    eos = getattr(tokenizer, "eos_token_id", None)
    hits = []
    for prompt, answer, answer_ids in zip(sample.prompt_ids, sample.answers, sample.answer_ids):
        out = greedy_ids(model, prompt, len(answer_ids) + 2, eos_token_id=eos)
        hits.append(number_matches(tokenizer.decode(out), answer))
    return hits


def needle_cells(
    model: nn.Module,
    tokenizer: Any,
    stream: Sequence[int],
    grid: NeedleGrid,
    progress: bool,
    desc: str = "needle",
) -> list[dict]:
    """Exact-recall accuracy of every (N, R, length, depth) cell of ``grid`` in the tokenized haystack ``stream``:
    the share of queried numbers (samples x R) recalled exactly by greedy decoding. One generator seeded by
    ``grid.seed`` draws every sample, cell by cell, so the same grid gives the same samples."""
    rng = np.random.default_rng(grid.seed)
    spec = grid.needle_spec
    total = len(grid.pairs) * len(grid.context_lengths) * len(grid.depths) * grid.samples
    cells = []
    with tqdm(total=total, desc=desc, unit="sample", disable=not progress) as bar:
        for n, r in grid.pairs:
            for length in grid.context_lengths:
                for depth in grid.depths:
                    hits: list[bool] = []
                    for _ in range(grid.samples):
                        sample = make_needle_sample(
                            tokenizer, stream, context_tokens=length, num_needles=n, num_queries=r, depth=depth,
                            rng=rng, spec=spec,
                        )  # fmt: skip
                        hits.extend(score_sample(model, tokenizer, sample))
                        bar.update(1)
                    cells.append(
                        dict(needles=n, queries=r, length=length, depth=depth, accuracy=float(np.mean(hits)))
                    )
    return cells


def accuracy_by_config(cells: Sequence[dict], pairs: Sequence[tuple[int, int]]) -> dict[str, float]:
    """Accuracy per "N:R", averaged over lengths and depths."""
    return {
        f"{n}:{r}": float(np.mean([c["accuracy"] for c in cells if (c["needles"], c["queries"]) == (n, r)]))
        for n, r in pairs
    }


def interval_by_config(cells: Sequence[dict], samples: int) -> dict[str, list[float]]:
    """The 95% Wilson interval of each "N:R"'s accuracy (:func:`accuracy_by_config`): every cell asks ``samples`` x
    R numbers, so the accuracy averaged over its cells is their pooled share of hits."""
    pooled: dict[str, list[int]] = {}
    for cell in cells:
        trials = samples * cell["queries"]
        counts = pooled.setdefault(f"{cell['needles']}:{cell['queries']}", [0, 0])
        counts[0] += round(cell["accuracy"] * trials)
        counts[1] += trials
    return {config: list(wilson_interval(hits, trials)) for config, (hits, trials) in pooled.items()}
