"""Activation outliers (paper §3.8): top-k and median of |attention logits| and |hidden states|, streamed by
:class:`difftransformer.eval.magnitudes.RunningStats` (over 0.4M tokens the logits alone are far too many to keep).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.errors import UsageError
from difftransformer.eval import paper
from difftransformer.eval.common import (
    check_context_length,
    max_context,
    model_device,
    save_results,
    token_stream,
)
from difftransformer.eval.logits import attention_logits, visible_keys
from difftransformer.eval.magnitudes import RunningStats
from difftransformer.eval.options import at_least, at_most, counts, option
from difftransformer.eval.task import Chart, Column, Measure, Panel, SuiteContext, Task
from difftransformer.plotting import pyplot, save_figure

# The most tokens scanned: 2,500 times the paper's 0.4M, days of work for any model this package runs.
MOST_TOKENS = 10**9


class LogitStats:
    """A logits hook that feeds each map's causally visible logits into a RunningStats and changes nothing."""

    def __init__(self, stats: RunningStats | None = None):
        self.stats = stats or RunningStats()

    def __call__(self, module: nn.Module, logits: torch.Tensor) -> torch.Tensor:
        visible = visible_keys(logits.shape[-2], logits.shape[-1], logits.device)
        self.stats.update(logits[..., visible])
        return logits


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers: the first ModuleList named ``layers`` (Llama-family layout)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "layers" and isinstance(module, nn.ModuleList):
            return module
    raise TypeError(
        f"{type(model).__name__} has no ModuleList named 'layers'; cannot read each layer's output"
    )


@torch.no_grad()
def collect_outliers(model: nn.Module, sequences: torch.Tensor, progress: bool = True) -> dict:
    """Stream every sequence (N, L) through the model; return the summaries for logits and hidden states.

    Attention logits: every causally visible entry of every map (both component maps Q1K1^T and Q2K2^T of
    a DIFF head) of every layer, scaled by 1/sqrt(d), before softmax. Hidden states: every feature of
    every decoder layer's output, read with forward hooks on the layers (so the last one is taken before
    the final norm, whichever convention the model's ``hidden_states`` follows).
    """
    logit_stats, hidden_stats = LogitStats(), RunningStats()

    def record(module: nn.Module, inputs, output) -> None:
        hidden_stats.update(output[0] if isinstance(output, tuple) else output)

    handles = [layer.register_forward_hook(record) for layer in decoder_layers(model)]
    device = model_device(model)
    try:
        with attention_logits(model, logit_stats):
            for row in tqdm(sequences, desc="outliers", unit="seq", disable=not progress):
                model(input_ids=row[None].to(device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return dict(attention_logits=logit_stats.stats.summary(), hidden_states=hidden_stats.summary())


@dataclass(frozen=True)
class OutliersOptions:
    """outliers' settings (``difftransformer eval outliers`` flags, the options :func:`run_outliers` takes)."""

    length: int = option(1024, "window length in tokens")
    tokens: int = option(16384, "tokens to scan, in whole windows (paper: 400000)")

    def __post_init__(self) -> None:
        counts(self, "length")
        at_least(self, 1, "tokens")
        at_most(self, MOST_TOKENS, "tokens")
        if self.tokens < self.length:
            raise UsageError(f"`tokens` ({self.tokens}) must be at least `length` ({self.length})")


def run_outliers(
    model: nn.Module,
    token_ids: Sequence[int],
    options: OutliersOptions,
    *,
    output_dir=None,
    progress: bool = True,
) -> dict:
    """Top-1/2/3/10/100 and median of |logits| and |hidden states| over ``tokens`` tokens of held-out text,
    in windows of ``length`` (both ``options``'). Writes outliers.json and outliers.png."""
    tokens, length = options.tokens, options.length
    check_context_length(model, length, "`length`")
    num = tokens // length
    if len(token_ids) < num * length:
        raise UsageError(f"held-out text gives {len(token_ids)} tokens; `tokens` needs {num * length}")
    sequences = torch.tensor(list(token_ids[: num * length]), dtype=torch.long).view(num, length)
    results = dict(
        task="outliers", tokens=num * length, length=length, **collect_outliers(model, sequences, progress)
    )
    return save_results(results, output_dir, lambda path: plot_outliers(results, path))


def plot_outliers(results: dict, path) -> None:
    """Bar chart (log y) of top-k and median for logits and hidden states."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key in zip(axes, ("attention_logits", "hidden_states")):
        stats = results[key]
        names = [n for n in ("top1", "top2", "top3", "top10", "top100", "median") if n in stats]
        ax.bar(names, [stats[n] for n in names], color="tab:blue")
        ax.set_yscale("log")
        ax.set_title(key.replace("_", " "))
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"activation outliers over {results['tokens']} tokens")
    save_figure(fig, path)


class OutliersTask(Task):
    """Activation outliers: largest against median absolute attention logit and hidden state."""

    name = "outliers"
    title = "Activation outliers (outliers)"
    help = "activation outliers: top-k and median of |attention logits| and |hidden states|"
    Options = OutliersOptions
    # In a comparison: 4 windows of the suite's context (tokens // length windows), fewer if the text holds fewer.
    light = OutliersOptions(tokens=4 * OutliersOptions().length)

    def fit(
        self, options: OutliersOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
    ) -> OutliersOptions:
        limit = max_context(model)
        if "length" in given or limit is None or options.length <= limit:
            return options
        return dataclasses.replace(options, length=limit, tokens=max(options.tokens, limit))

    def light_options(self, light: OutliersOptions, suite: SuiteContext) -> OutliersOptions:
        windows = suite.windows(light.tokens // light.length)
        return dataclasses.replace(light, tokens=windows * suite.context_length, length=suite.context_length)

    def run(
        self, model, tokenizer, texts, options: OutliersOptions, output_dir: Path, progress: bool
    ) -> dict:
        check_context_length(model, options.length, "`length`")  # before reading the text
        ids = token_stream(tokenizer, texts, options.tokens)
        return run_outliers(model, ids, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        return {
            key: dict(top1=results[key]["top1"], median=results[key]["median"],
                      ratio=results[key]["top1"] / results[key]["median"])
            for key in ("attention_logits", "hidden_states")
        }  # fmt: skip

    def columns(self, summary: dict) -> list[Column]:
        columns = []
        for key, name in (("attention_logits", "logits"), ("hidden_states", "hidden states")):
            stats = summary[key]
            columns += [
                Column(f"{name} top-1", stats["top1"], 2),
                Column(f"{name} median", stats["median"], 3),
                Column(f"{name} top-1/median", stats["ratio"], 1),
            ]
        return columns

    def describe(self, options: dict) -> str:
        return (
            "Largest (top-1) and median absolute attention logit (before softmax) and hidden state (every "
            f"decoder layer's output) over {options['tokens']} held-out tokens in windows of {options['length']}; "
            "a smaller top-1/median ratio means milder outliers."
        )

    def chart(self, summary: dict) -> Chart:
        ratios = [c.header for c in self.columns(summary) if c.header.endswith("top-1/median")]
        return Chart("bars", "activation outliers", [Panel("top-1 / median of |x|", ratios)], log=True)

    def measures(self, summary: dict) -> list[Measure]:
        return [
            Measure(
                "attention-logit top-1/median",
                lambda s: s["attention_logits"]["ratio"],
                False,
                1,
                paper=paper.LOGIT_OUTLIERS,
            ),
            Measure(
                "hidden-state top-1/median",
                lambda s: s["hidden_states"]["ratio"],
                False,
                1,
                paper=paper.HIDDEN_OUTLIERS,
            ),
        ]


TASK = OutliersTask()
