"""Multi-needle retrieval (paper §3.4): exact recall of magic numbers hidden in held-out text, scored by greedy
decoding, and the ``needle`` task. The grid of prompts and its scoring are :mod:`difftransformer.eval.haystack`'s
(the attention and quant tasks draw the same prompts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from difftransformer.data.needles import encode
from difftransformer.eval import chance, paper
from difftransformer.eval.haystack import (
    NeedleGrid,
    accuracy_by_config,
    fit_needle_lengths,
    interval_by_config,
    needle_cells,
    parse_needle_configs,
    require_needles_fit,
    validate_needle_run,
)
from difftransformer.eval.task import UNIT, Chart, Column, Measure, Panel, SuiteContext, Task, interval_at
from difftransformer.plotting import pyplot, save_figure
from difftransformer.storage import write_json

# parse_needle_configs: compare's --needles reads N:R pairs with it, from here.
__all__ = ["TASK", "NeedleOptions", "NeedleTask", "parse_needle_configs", "plot_heatmap", "run_needle"]


@dataclass(frozen=True)
class NeedleOptions(NeedleGrid):
    """needle's settings (``difftransformer eval needle`` flags): a grid of needle prompts (:class:`NeedleGrid`,
    with :class:`~difftransformer.data.needles.NeedleSpec`'s fields)."""


def run_needle(
    model: nn.Module,
    tokenizer: Any,
    haystack_texts: Sequence[str],
    options: NeedleOptions,
    *,
    output_dir=None,
    progress: bool = True,
) -> dict:
    """Accuracy of exact-match recall for every (N, R), context length and depth of ``options``.

    Accuracy of a cell = share of queried numbers (samples x R) recalled exactly. Returns a dict with
    ``cells`` (one entry per (N, R, length, depth)) and ``by_config`` (accuracy per "N:R" averaged over
    lengths and depths). With ``output_dir``: needle.json and one depth-by-length heat map per (N, R).
    """
    stream = encode(tokenizer, "\n".join(haystack_texts))
    validate_needle_run(model, tokenizer, len(stream), options)
    cells = needle_cells(model, tokenizer, stream, options, progress)
    by_config = accuracy_by_config(cells, options.pairs)
    results = dict(
        task="needle", seed=options.seed, samples=options.samples, by_config=by_config, cells=cells
    )
    if output_dir is not None:
        write_json(f"{output_dir}/needle.json", results)
        for n, r in options.pairs:
            plot_heatmap(
                cells, n, r, options.context_lengths, options.depths, f"{output_dir}/needle_N{n}_R{r}.png"
            )
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
            seed=suite.seed, **dataclasses.asdict(suite.needle),
        )  # fmt: skip
        require_needles_fit(suite.tokenizer, options)
        return options

    def run(self, model, tokenizer, texts, options: NeedleOptions, output_dir: Path, progress: bool) -> dict:
        return run_needle(model, tokenizer, texts, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        """Accuracy per "N:R" and, under ``intervals``, its Wilson interval over the numbers asked."""
        return {
            **results["by_config"],
            "intervals": interval_by_config(results["cells"], results["samples"]),
        }

    @staticmethod
    def _configs(summary: dict) -> list[str]:
        return [key for key in summary if key != "intervals"]

    def columns(self, summary: dict) -> list[Column]:
        return [Column(f"N:R={config}", summary[config], 2) for config in self._configs(summary)]

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
                    paper=paper.needle_accuracy(config), at_chance=lambda s, c=config: chance.exact_at_chance(s[c]),
                    chance=chance.NEEDLE, interval=lambda s, c=config: interval_at(s, c))
            for config in self._configs(summary)
        ]  # fmt: skip


TASK = NeedleTask()
