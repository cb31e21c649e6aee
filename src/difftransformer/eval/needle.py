"""Multi-needle retrieval (paper §3.4): the sample generator the training code reuses, and its scoring.

A needle is a short sentence giving a city a magic number. N needles go into a haystack of ordinary text;
R of the cities are queried. The answer needle (the first queried city) sits at a chosen depth of the
context, every other needle at a random position.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.eval.common import check_context_length, model_device, pyplot, save_figure, write_json

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
DEFAULT_DEPTHS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


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


def _encode(tokenizer, text: str) -> list[int]:
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
    needle_template: str = NEEDLE_TEMPLATE,
    question_template: str = QUESTION_TEMPLATE,
    number_digits: int = 6,
    cities: Sequence[str] = CITIES,
) -> NeedleSample:
    """Draw one sample of exactly ``context_tokens`` tokens per prompt (question included).

    The haystack is a window of the tokenized ``haystack_texts`` starting at a random offset; the needles
    are spliced in at token boundaries, so spans are exact in the ids the model sees. Cities (distinct)
    and magic numbers (``number_digits`` digits, no leading zero) are drawn from ``rng`` per sample.

    Args:
        tokenizer: a transformers tokenizer (called without special tokens).
        haystack_texts: documents (joined by newlines), or an already tokenized stream of ids (faster when
            drawing many samples: tokenize once with ``tokenizer(text)["input_ids"]``).
        context_tokens: total length of each prompt in tokens.
        num_needles: N >= 1.
        num_queries: R, 1 <= R <= N.
        depth: the answer needle's position as a fraction of the haystack, 0 (start) to 1 (end).
        rng: a NumPy generator; the same seed gives the same sample.
        needle_template: format string with {city} and {number}.
        question_template: format string with {cities} (all queried cities, comma-joined) and {city}
            (the one whose number this prompt asks for); it should end in the answer prefix.

    Raises:
        ValueError: impossible requests (R > N, more needles than cities, needles and question longer
            than the context, a haystack too short for it).
    """
    if num_needles < 1:
        raise ValueError(f"num_needles must be >= 1; got {num_needles}")
    if not 1 <= num_queries <= num_needles:
        raise ValueError(f"num_queries must lie in [1, num_needles={num_needles}]; got {num_queries}")
    if num_needles > len(cities):
        raise ValueError(f"num_needles={num_needles} exceeds the {len(cities)} available cities")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1]; got {depth}")
    if number_digits < 1:
        raise ValueError(f"number_digits must be >= 1; got {number_digits}")

    chosen = [cities[i] for i in rng.choice(len(cities), size=num_needles, replace=False)]
    numbers = [str(int(rng.integers(10 ** (number_digits - 1), 10**number_digits))) for _ in chosen]
    queried = [
        0,
        *sorted(rng.choice(np.arange(1, num_needles), size=num_queries - 1, replace=False).tolist()),
    ]
    needle_ids = [
        _encode(tokenizer, needle_template.format(city=c, number=n)) for c, n in zip(chosen, numbers)
    ]
    query_cities = ", ".join(chosen[i] for i in queried)
    question_ids = [
        _encode(tokenizer, question_template.format(cities=query_cities, city=chosen[i])) for i in queried
    ]
    # Prompts must all have the same context; pad shorter questions by taking a longer haystack.
    longest_question = max(len(q) for q in question_ids)
    budget = context_tokens - sum(len(n) for n in needle_ids) - longest_question
    if budget < 1:
        raise ValueError(
            f"{num_needles} needles and the question need {context_tokens - budget + 1} tokens, more than "
            f"context_tokens={context_tokens}; use fewer needles or a longer context"
        )

    stream = (
        list(haystack_texts)
        if len(haystack_texts) and isinstance(haystack_texts[0], (int, np.integer))
        else _encode(tokenizer, "\n".join(haystack_texts))
    )
    if len(stream) < budget:
        raise ValueError(
            f"the haystack has {len(stream)} tokens; a {context_tokens}-token context needs {budget}"
        )
    start = int(rng.integers(0, len(stream) - budget + 1))
    haystack = stream[start : start + budget]

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
        fill = stream[start + budget : start + budget + longest_question - len(ids)]
        prompt_ids.append(context + fill + ids)
    if any(len(p) != context_tokens for p in prompt_ids):
        raise ValueError(f"the haystack is too short to fill {context_tokens} tokens for every question")
    return NeedleSample(
        prompt_ids=prompt_ids,
        prompts=[tokenizer.decode(p) for p in prompt_ids],
        answers=[numbers[i] for i in queried],
        answer_ids=[_encode(tokenizer, " " + numbers[i]) for i in queried],
        cities=chosen,
        numbers=numbers,
        queried=queried,
        answer_span=spans[0],
        needle_spans=spans,
        context_end=len(context),
        depth=depth,
    )


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
            raise ValueError(
                f"--needles must be N:R pairs separated by commas (e.g. 1:1,4:2); got {text!r}"
            ) from err
        if not 1 <= r <= n:
            raise ValueError(f"--needles: each N:R needs 1 <= R <= N; got {item!r}")
        configs.append((n, r))
    return configs


def validate_needle_run(
    model,
    tokenizer,
    stream_len,
    context_lengths,
    configs,
    needle_template,
    question_template,
    number_digits=6,
):
    """Refuse impossible grids before any decoding: lengths the model cannot take, needles that cannot fit."""
    for length in context_lengths:
        check_context_length(model, length)
    for length in context_lengths:
        for n, r in configs:
            if n > len(CITIES):
                raise ValueError(f"--needles: N={n} exceeds the {len(CITIES)} available cities")
            needle_len = max(
                len(_encode(tokenizer, needle_template.format(city=c, number="9" * number_digits)))
                for c in CITIES[:n]
            )
            question = question_template.format(cities=", ".join(CITIES[:r]), city=CITIES[0])
            need = n * needle_len + len(_encode(tokenizer, question)) + 1
            if need > length:
                raise ValueError(
                    f"--needles {n}:{r} needs about {need} tokens of needles and question, more than the "
                    f"context length {length}"
                )
    if stream_len < max(context_lengths):
        raise ValueError(
            f"the haystack gives {stream_len} tokens; --context-lengths needs {max(context_lengths)}"
        )


def run_needle(
    model: nn.Module,
    tokenizer,
    haystack_texts: Sequence[str],
    *,
    context_lengths: Sequence[int] = (1024,),
    needle_configs: Sequence[tuple[int, int]] = ((1, 1), (2, 2), (4, 2), (6, 2)),
    depths: Sequence[float] = DEFAULT_DEPTHS,
    samples: int = 50,
    seed: int = 0,
    needle_template: str = NEEDLE_TEMPLATE,
    question_template: str = QUESTION_TEMPLATE,
    number_digits: int = 6,
    output_dir=None,
    progress: bool = True,
) -> dict:
    """Accuracy of exact-match recall for every (N, R), context length and depth.

    Accuracy of a cell = share of queried numbers (samples x R) recalled exactly. Returns a dict with
    ``cells`` (one entry per (N, R, length, depth)) and ``by_config`` (accuracy per "N:R" averaged over
    lengths and depths). With ``output_dir``: needle.json and one depth-by-length heat map per (N, R).
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1; got {samples}")
    for d in depths:
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"depths must lie in [0, 1]; got {d}")
    stream = _encode(tokenizer, "\n".join(haystack_texts))
    validate_needle_run(
        model,
        tokenizer,
        len(stream),
        context_lengths,
        needle_configs,
        needle_template,
        question_template,
        number_digits,
    )
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
