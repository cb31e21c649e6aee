"""Multi-needle retrieval (paper §3.4): exact recall of magic numbers hidden in held-out text, scored by greedy
decoding, and the ``needle`` task. The samples come from :mod:`difftransformer.data.needles` (shared with
training's retrieval blocks); the needle options here serve the attention and quant tasks too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.data.needles import (
    CITIES,
    NEEDLE_TEMPLATE,
    QUESTION_TEMPLATE,
    NeedleSample,
    encode,
    make_needle_sample,
)
from difftransformer.errors import UsageError
from difftransformer.eval.common import capped, check_context_length, max_context, model_device
from difftransformer.eval.options import at_least, not_empty, option, with_settings
from difftransformer.eval.task import UNIT, Chart, Column, Measure, Panel, SuiteContext, Task
from difftransformer.plotting import pyplot, save_figure
from difftransformer.storage import write_json

DEFAULT_DEPTHS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


@torch.no_grad()
def greedy_decode(
    model: nn.Module, input_ids: list[int], max_new_tokens: int, eos_token_id=None
) -> list[int]:
    """Greedy continuation of one prompt; uses the KV cache when the model returns one."""
    device = model_device(model)
    ids = torch.tensor([input_ids], device=device)
    generated: list[int] = []
    past, step_input = None, ids
    for _ in range(max_new_tokens):
        out = model(input_ids=step_input, past_key_values=past, use_cache=True)
        next_id = int(out.logits[0, -1].argmax())
        generated.append(next_id)
        if eos_token_id is not None and next_id == eos_token_id:
            break
        past = getattr(out, "past_key_values", None)
        new = torch.tensor([[next_id]], device=device)
        step_input = new if past is not None else torch.cat([step_input, new], dim=1)
    return generated


_NUMBER = re.compile(r"\d+")


def number_matches(generated_text: str, answer: str) -> bool:
    """Exact match: the first run of digits in the generated text is the magic number."""
    found = _NUMBER.search(generated_text)
    return found is not None and found.group(0) == answer


def score_sample(model: nn.Module, tokenizer, sample: NeedleSample) -> list[bool]:
    """Greedy-decode each queried number; True where it matches exactly."""
    hits = []
    for prompt, answer, answer_ids in zip(sample.prompt_ids, sample.answers, sample.answer_ids):
        out = greedy_decode(model, prompt, len(answer_ids) + 2, getattr(tokenizer, "eos_token_id", None))
        hits.append(number_matches(tokenizer.decode(out), answer))
    return hits


def parse_needle_configs(text: str) -> list[tuple[int, int]]:
    """'1:1,2:2,4:2' -> [(1, 1), (2, 2), (4, 2)] as (N needles, R queries)."""
    configs = []
    for item in text.split(","):
        try:
            n, r = (int(x) for x in item.split(":"))
        except ValueError as err:
            raise UsageError(
                f"--needles must be N:R pairs separated by commas (e.g. 1:1,4:2); got {text!r}"
            ) from err
        if not 1 <= r <= n:
            raise UsageError(f"--needles: each N:R needs 1 <= R <= N; got {item!r}")
        configs.append((n, r))
    return configs


def needle_tokens(
    tokenizer, n: int, r: int, needle_template: str, question_template: str, digits: int
) -> int:
    """About how many tokens N needles and the question about R of them take (the longest city names)."""
    needle_len = max(
        len(encode(tokenizer, needle_template.format(city=c, number="9" * digits))) for c in CITIES[:n]
    )
    question = question_template.format(cities=", ".join(CITIES[:r]), city=CITIES[0])
    return n * needle_len + len(encode(tokenizer, question)) + 1


def needles_problem(tokenizer, options: NeedleOptions) -> str | None:
    """Why ``options``' needles and question cannot fit its shortest context (None when they fit)."""
    shortest = min(options.context_lengths)
    for n, r in options.pairs:
        need = needle_tokens(
            tokenizer, n, r, options.needle_template, options.question_template, options.needle_digits
        )
        if need > shortest:
            return (
                f"--needles {n}:{r} needs about {need} tokens of needles and question, more than the context "
                f"length {shortest}"
            )
    return None


def require_needles_fit(tokenizer, options: NeedleOptions) -> None:
    """ValueError (from :func:`needles_problem`) unless ``options``' needles and question fit its shortest context."""
    problem = needles_problem(tokenizer, options)
    if problem:
        raise UsageError(problem)


def validate_needle_run(model, tokenizer, stream_len: int, options: NeedleOptions) -> None:
    """Refuse impossible grids before any decoding: lengths the model cannot take, needles that cannot fit."""
    context_lengths = options.context_lengths
    for length in context_lengths:
        check_context_length(model, length)
    for n, _ in options.pairs:
        if n > len(CITIES):
            raise UsageError(f"--needles: N={n} exceeds the {len(CITIES)} available cities")
    require_needles_fit(tokenizer, options)
    if stream_len < max(context_lengths):
        raise UsageError(
            f"the haystack gives {stream_len} tokens; --context-lengths needs {max(context_lengths)}"
        )


@dataclass(frozen=True)
class NeedleOptions:
    """needle's settings (``difftransformer eval needle`` flags, :func:`run_needle` keywords); attention and quant
    extend them."""

    context_lengths: list[int] = option([1024], "prompt lengths in tokens")
    needles: list[str] = option(["1:1", "2:2", "4:2", "6:2"], "N:R pairs (N needles, R of them queried)")
    depths: list[float] = option(list(DEFAULT_DEPTHS), "answer-needle depths in [0, 1] (0: first token)")
    samples: int = option(50, "samples per (N:R, length, depth) cell")
    needle_template: str = option(NEEDLE_TEMPLATE, "needle sentence with {city} and {number}")
    question_template: str = option(QUESTION_TEMPLATE, "question with {cities} and {city}, ending in the answer "
                                    "prefix")  # fmt: skip
    needle_digits: int = option(6, "digits of the magic numbers (models from `compare --preset tiny` were "
                                "trained on 3)")  # fmt: skip
    seed: int = option(0, "seed of the samples")

    def __post_init__(self) -> None:
        not_empty(self, "context_lengths", "needles", "depths")
        at_least(self, 1, "context_lengths", "samples", "needle_digits")
        parse_needle_configs(",".join(self.needles))  # refuses anything but N:R pairs with 1 <= R <= N
        for depth in self.depths:
            if not 0.0 <= depth <= 1.0:
                raise UsageError(f"`depths` must lie in [0, 1]; got {list(self.depths)}")
        for name, fields in (("needle_template", ("{city}", "{number}")), ("question_template", ("{city}",))):
            missing = [f for f in fields if f not in getattr(self, name)]
            if missing:
                raise UsageError(f"`{name}` must contain {', '.join(missing)}; got {getattr(self, name)!r}")

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The (N needles, R queried) pairs of :attr:`needles`."""
        return parse_needle_configs(",".join(self.needles))


def fit_needle_lengths(
    options: NeedleOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
) -> NeedleOptions:
    """``options`` with context lengths the user did not give capped at the model's context, and N:R pairs the
    user did not give kept only where their needles and question fit the shortest length."""
    limit = max_context(model)
    if limit is None:
        return options
    if "context_lengths" not in given:
        options = dataclasses.replace(options, context_lengths=capped(options.context_lengths, limit))
    if "needles" not in given and len(CITIES) >= max(n for n, _ in options.pairs):
        shortest = min(options.context_lengths)
        digits, templates = options.needle_digits, (options.needle_template, options.question_template)
        kept = [
            f"{n}:{r}"
            for n, r in options.pairs
            if needle_tokens(tokenizer, n, r, *templates, digits) <= shortest
        ]
        if kept and kept != options.needles:
            options = dataclasses.replace(options, needles=kept)
    return options


def run_needle(
    model: nn.Module,
    tokenizer,
    haystack_texts: Sequence[str],
    options: NeedleOptions | None = None,
    *,
    output_dir=None,
    progress: bool = True,
    **settings: Any,
) -> dict:
    """Accuracy of exact-match recall for every (N, R), context length and depth.

    Accuracy of a cell = share of queried numbers (samples x R) recalled exactly. Returns a dict with
    ``cells`` (one entry per (N, R, length, depth)) and ``by_config`` (accuracy per "N:R" averaged over
    lengths and depths). With ``output_dir``: needle.json and one depth-by-length heat map per (N, R).
    ``options``: a :class:`NeedleOptions`, or its fields as keywords.
    """
    options = with_settings(options, NeedleOptions, settings)
    context_lengths, needle_configs, depths = options.context_lengths, options.pairs, options.depths
    samples, seed, number_digits = options.samples, options.seed, options.needle_digits
    needle_template, question_template = options.needle_template, options.question_template
    stream = encode(tokenizer, "\n".join(haystack_texts))
    validate_needle_run(model, tokenizer, len(stream), options)
    rng = np.random.default_rng(seed)
    total = len(needle_configs) * len(context_lengths) * len(depths) * samples
    cells = []
    with tqdm(total=total, desc="needle", unit="sample", disable=not progress) as bar:
        for n, r in needle_configs:
            for length in context_lengths:
                for depth in depths:
                    hits: list[bool] = []
                    for _ in range(samples):
                        sample = make_needle_sample(
                            tokenizer, stream, context_tokens=length, num_needles=n, num_queries=r,
                            depth=depth, rng=rng, needle_template=needle_template,
                            question_template=question_template,
                            number_digits=number_digits,
                        )  # fmt: skip
                        hits.extend(score_sample(model, tokenizer, sample))
                        bar.update(1)
                    cells.append(
                        dict(needles=n, queries=r, length=length, depth=depth, accuracy=float(np.mean(hits)))
                    )
    by_config = {
        f"{n}:{r}": float(np.mean([c["accuracy"] for c in cells if (c["needles"], c["queries"]) == (n, r)]))
        for n, r in needle_configs
    }
    results = dict(task="needle", seed=seed, samples=samples, by_config=by_config, cells=cells)
    if output_dir is not None:
        write_json(f"{output_dir}/needle.json", results)
        for n, r in needle_configs:
            plot_heatmap(cells, n, r, context_lengths, depths, f"{output_dir}/needle_N{n}_R{r}.png")
    return results


def plot_heatmap(cells, n, r, lengths, depths, path) -> None:
    """Depth (rows) by context length (columns) accuracy heat map for one (N, R)."""
    plt = pyplot()
    grid = np.array(
        [[next(c["accuracy"] for c in cells if (c["needles"], c["queries"], c["length"], c["depth"]) == (n, r, L, d))
          for L in lengths] for d in depths]
    )  # fmt: skip
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1 + 0.6 * len(depths)))
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(L) for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    for (i, j), value in np.ndenumerate(grid):
        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("answer needle depth")
    ax.set_title(f"multi-needle retrieval, N={n}, R={r}")
    fig.colorbar(image, ax=ax, label="accuracy")
    save_figure(fig, path)


# The paper's 4K-context multi-needle accuracy, (Transformer, DIFF) per N:R.
PAPER_ACCURACY = {"1:1": (1.00, 1.00), "2:2": (0.85, 0.92), "4:2": (0.62, 0.84), "6:2": (0.55, 0.85)}
# Accuracy at or below this counts as "at chance": a few lucky samples are not retrieval.
CHANCE_MARGIN = 0.05
CHANCE = f"accuracy 0, counted up to {CHANCE_MARGIN}: a magic number is not guessed"


class NeedleTask(Task):
    """Multi-needle retrieval: share of queried magic numbers recalled exactly, per N:R."""

    name = "needle"
    title = "Multi-needle retrieval (needle)"
    help = "multi-needle retrieval: recall of magic numbers hidden in held-out text"
    Options = NeedleOptions
    # In a comparison the N:R pairs, the context and the digits are the suite's.
    light = NeedleOptions(samples=6)

    def fit(
        self, options: NeedleOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
    ) -> NeedleOptions:
        return fit_needle_lengths(options, model, tokenizer, given)

    def light_options(self, light: NeedleOptions, suite: SuiteContext) -> NeedleOptions:
        options = dataclasses.replace(
            light, context_lengths=[suite.context_length], needles=[f"{n}:{r}" for n, r in suite.needles],
            needle_digits=suite.needle_digits, seed=suite.seed,
        )  # fmt: skip
        require_needles_fit(suite.tokenizer, options)
        return options

    def run(self, model, tokenizer, texts, options: NeedleOptions, output_dir: Path, progress: bool) -> dict:
        return run_needle(model, tokenizer, texts, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        return results["by_config"]

    def columns(self, summary: dict) -> list[Column]:
        return [Column(f"N:R={config}", accuracy, 2) for config, accuracy in summary.items()]

    def describe(self, options: dict) -> str:
        return (
            f"Share of queried magic numbers ({options['needle_digits']} digits) recalled exactly by greedy "
            f"decoding from {options['context_lengths'][0]}-token contexts of held-out text, per N:R (N needles, "
            f"R queried), with the answer needle at depths {options['depths']} ({options['samples']} per depth). "
            "Higher is better."
        )

    def chart(self, summary: dict) -> Chart:
        headers = [column.header for column in self.columns(summary)]
        return Chart("bars", "multi-needle retrieval", [Panel("exact-match accuracy", headers, UNIT)])

    def measures(self, summary: dict) -> list[Measure]:
        return [
            Measure(f"retrieval accuracy N:R={config}", lambda s, c=config: s[c], True, 2,
                    paper=(f"DIFF {PAPER_ACCURACY[config][1]:.2f} vs Transformer {PAPER_ACCURACY[config][0]:.2f} "
                           "(3B models, 4K context)") if config in PAPER_ACCURACY else "",
                    at_chance=lambda s, c=config: s[c] <= CHANCE_MARGIN,
                    chance=CHANCE)
            for config in summary
        ]  # fmt: skip


TASK = NeedleTask()
