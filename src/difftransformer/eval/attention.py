"""Attention allocation in multi-needle retrieval (paper Table 3).

For each sample the gold answer is appended to the prompt (teacher forcing) and we read the attention
rows of the *answer-producing positions*: the last prompt token and every answer token but the last, i.e.
the positions whose next-token prediction is an answer token. From each row we take

    answer share  = sum of a[j] over the answer needle's tokens          / sum of |a[j]| over all keys
    context share = sum of a[j] over the other context tokens            / sum of |a[j]| over all keys

where "context" is everything before the question except the answer needle (haystack and distractor
needles). The question and answer tokens are in the denominator only. Shares are averaged over answer
positions, heads, layers and samples (per layer on request), per depth.

Negative entries: a DIFF map A1 - lambda A2 can be negative (that is its noise cancelling). We count
entries with their sign in the numerator and by magnitude in the denominator: a region the head
cancels adds negative attention there, and the shares stay comparable across layers whose rows sum to
different totals (a DIFF row sums to 1 - lambda, a softmax row to 1). For softmax maps |a| = a, so the
definition is the ordinary share of attention mass. Absolute-value shares are reported alongside.

The task also draws the paper's figure of attention scores for the first prompt it reads (answer needle at the first
depth): per layer, a DIFF layer's two maps beside their difference, or a softmax layer's map, averaged over heads
or of one head (:func:`difftransformer.eval.maps.heatmap_panels`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.data.needles import encode, make_needle_sample
from difftransformer.errors import UsageError
from difftransformer.eval import paper
from difftransformer.eval.common import model_device
from difftransformer.eval.haystack import (
    NeedleGrid,
    fit_needle_lengths,
    require_needles_fit,
    validate_needle_run,
)
from difftransformer.eval.maps import Panels, allocation, attention_maps, check_head, heatmap_panels
from difftransformer.eval.options import at_least, option
from difftransformer.eval.task import Chart, Column, Measure, Panel, SuiteContext, Task, interval_at
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import bootstrap_interval, mean
from difftransformer.storage import write_json


@dataclass(frozen=True)
class AttentionOptions(NeedleGrid):
    """attention's settings (``difftransformer eval attention`` flags): a grid of needle prompts
    (:class:`NeedleGrid`) with exactly one context length and one N:R pair, and what to draw."""

    needles: list[str] = option(["4:1"], "one N:R pair (N needles, R of them queried; the first is read)")
    samples: int = option(10, "samples per depth")
    per_layer: bool = option(False, "also report shares per layer")
    heatmaps: bool = option(True, "draw attention_maps.png, the maps of the first prompt, layer by layer "
                            "(--no-heatmaps skips it)")  # fmt: skip
    heatmap_head: int | None = option(None, "the head the heatmaps show (unset: the mean over heads)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("context_lengths", "needles"):
            if len(getattr(self, name)) != 1:
                raise UsageError(f"attention takes exactly one `{name}` value; got {getattr(self, name)}")
        at_least(self, 0, "heatmap_head")


def run_attention(
    model: nn.Module,
    tokenizer: Any,
    haystack_texts: Sequence[str],
    options: AttentionOptions,
    *,
    output_dir=None,
    progress: bool = True,
) -> dict:
    """Attention shares on the answer needle and on the rest of the context, by depth (paper Table 3), for the
    prompts of ``options``. Writes attention.json, attention.png (shares against depth) and, unless
    ``options.heatmaps`` is off, attention_maps.png (the first prompt's maps)."""
    (context_length,), [(num_needles, num_queries)] = options.context_lengths, options.pairs
    stream = encode(tokenizer, "\n".join(haystack_texts))
    validate_needle_run(model, tokenizer, len(stream), options)
    if options.heatmaps:
        check_head(model, options.heatmap_head)
    # The gold answer's tokens follow the prompt (teacher forcing) as a greedy answer would: like needle's decoding,
    # only the prompt is held to max_position_embeddings (validate_needle_run), so a model trained on blocks of
    # exactly the context length is read at that length.
    rng = np.random.default_rng(options.seed)
    device = model_device(model)
    by_depth, heatmaps = [], None
    total = len(options.depths) * options.samples
    with tqdm(total=total, desc="attention", unit="sample", disable=not progress) as bar:
        for depth in options.depths:
            collected = []
            for _ in range(options.samples):
                sample = make_needle_sample(
                    tokenizer, stream, context_tokens=context_length, num_needles=num_needles,
                    num_queries=num_queries, depth=depth, rng=rng, spec=options.needle_spec,
                )  # fmt: skip
                prompt, answer = sample.prompt_ids[0], sample.answer_ids[0]
                ids = torch.tensor([prompt + answer[:-1]], device=device)
                if heatmaps is None and options.heatmaps:
                    heatmaps = heatmap_panels(model, ids, options.heatmap_head)
                rows = slice(len(prompt) - 1, len(prompt) - 1 + len(answer))
                maps = attention_maps(model, ids)
                collected.append(allocation(maps, rows, sample.answer_span, sample.context_end))
                bar.update(1)
            entry = {"depth": depth}
            for key in collected[0]:
                layers = np.mean([c[key] for c in collected], axis=0)
                entry[key] = float(layers.mean())
                entry[key + "_by_sample"] = [
                    float(c[key].mean()) for c in collected
                ]  # for its sampling interval
                if options.per_layer:
                    entry[key + "_per_layer"] = layers.tolist()
            by_depth.append(entry)
    results = dict(
        task="attention", context_length=context_length, needles=num_needles, queries=num_queries,
        samples=options.samples, by_depth=by_depth,
    )  # fmt: skip
    if output_dir is not None:
        write_json(f"{output_dir}/attention.json", results)
        plot_allocation(by_depth, f"{output_dir}/attention.png")
        if heatmaps is not None:
            what = "mean over heads" if options.heatmap_head is None else f"head {options.heatmap_head}"
            plot_heatmaps(
                heatmaps,
                f"{output_dir}/attention_maps.png",
                f"answer needle at depth {options.depths[0]}, {what}",
            )
    return results


def plot_allocation(by_depth: list[dict], path) -> None:
    """Answer-needle and rest-of-context shares against the answer needle's depth."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    depths = [e["depth"] for e in by_depth]
    ax.plot(depths, [e["answer"] for e in by_depth], marker="o", label="answer needle")
    ax.plot(depths, [e["context"] for e in by_depth], marker="s", label="rest of context")
    ax.set_xlabel("answer needle depth")
    ax.set_ylabel("share of attention")
    ax.set_title("attention allocation in retrieval")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def plot_heatmaps(layers: Sequence[Panels], path, subtitle: str) -> None:
    """One row of heatmaps per layer (query position down, key position across): a DIFF layer's two maps on one
    colour scale from 0 and their difference on a scale centred on 0 (its negative entries are the cancelling),
    or a softmax layer's map."""
    plt = pyplot()
    columns = max(len(panels) for panels in layers)
    fig, axes = plt.subplots(len(layers), columns, figsize=(3.6 * columns, 3.2 * len(layers)), squeeze=False)
    for row, panels in enumerate(layers):
        top = max(float(m.max()) for title, m in panels[:2])
        for column, (title, values) in enumerate(panels):
            ax = axes[row][column]
            if column == 2:  # the difference, signed
                bound = float(np.abs(values).max()) or 1.0
                image = ax.imshow(values, cmap="RdBu_r", vmin=-bound, vmax=bound, interpolation="nearest")
            else:
                image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=top or 1.0, interpolation="nearest")
            ax.set_title(f"layer {row}: {title}", fontsize=9)
            ax.set(xlabel="key position", ylabel="query position")
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        for column in range(len(panels), columns):
            axes[row][column].set_visible(False)
    fig.suptitle(f"attention maps of one prompt ({subtitle})")
    save_figure(fig, path)


class AttentionTask(Task):
    """Attention allocation in retrieval: shares of attention on the answer needle and on the rest of the context."""

    name = "attention"
    title = "Attention allocation in retrieval (attention)"
    help = "attention allocation in retrieval: attention on the answer needle against the rest (noise)"
    Options = AttentionOptions
    light = AttentionOptions(depths=[0.0, 0.5, 1.0], samples=2)

    def fit(
        self, options: AttentionOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
    ) -> AttentionOptions:
        return fit_needle_lengths(options, model, tokenizer, given)

    def light_options(self, light: AttentionOptions, suite: SuiteContext) -> AttentionOptions:
        options = dataclasses.replace(
            light, context_lengths=[suite.context_length], seed=suite.seed, **dataclasses.asdict(suite.needle)
        )
        require_needles_fit(suite.tokenizer, options)
        return options

    def run(
        self, model, tokenizer, texts, options: AttentionOptions, output_dir: Path, progress: bool
    ) -> dict:
        return run_attention(model, tokenizer, texts, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        """The shares averaged over depths and, under ``intervals``, their bootstrap intervals over the samples
        (every depth has as many, so their mean is the average over depths)."""
        depths = results["by_depth"]
        summary: dict[str, Any] = {key: mean([e[key] for e in depths]) for key in ("answer", "context")}
        intervals = {
            key: bootstrap_interval([value for e in depths for value in e.get(f"{key}_by_sample", [])])
            for key in ("answer", "context")
        }
        summary["intervals"] = {key: list(found) for key, found in intervals.items() if found is not None}
        return summary

    def columns(self, summary: dict) -> list[Column]:
        return [
            Column("answer share", summary["answer"], 3),
            Column("context share (noise)", summary["context"], 3),
        ]

    def describe(self, options: dict) -> str:
        return (
            f"Share of attention that the answer-producing positions put on the answer needle and on the rest "
            f"of the context (noise), {options['needles'][0]} needles in "
            f"{options['context_lengths'][0]}-token contexts with the answer needle at depths {options['depths']} "
            f"({options['samples']} per depth), averaged over heads, layers and depths. DIFF maps count negative "
            "entries with their sign. More on the answer and less on the noise is better."
        )

    def chart(self, summary: dict) -> Chart:
        headers = [column.header for column in self.columns(summary)]
        return Chart("bars", "attention allocation in retrieval", [Panel("share of attention", headers)])

    def measures(self, summary: dict) -> list[Measure]:
        return [
            Measure("attention on the answer needle", lambda s: s["answer"], True, 3, paper=paper.ANSWER_SHARE,
                    interval=lambda s: interval_at(s, "answer")),
            Measure("attention on the rest of the context (noise)", lambda s: s["context"], False, 3,
                    paper=paper.CONTEXT_SHARE, interval=lambda s: interval_at(s, "context")),
        ]  # fmt: skip


TASK = AttentionTask()
