"""Long-context modelling (paper §3.5): cumulative average NLL by position on held-out text."""

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

from difftransformer.errors import UsageError
from difftransformer.eval import paper
from difftransformer.eval.common import (
    check_context_length,
    fit_length,
    model_device,
    save_results,
    token_stream,
)
from difftransformer.eval.options import at_least, counts, option
from difftransformer.eval.task import Chart, Column, Measure, Panel, SuiteContext, Task
from difftransformer.plotting import pyplot, save_figure


@torch.no_grad()
def position_nll(model: nn.Module, sequences: torch.Tensor, progress: bool = True) -> torch.Tensor:
    """Mean next-token NLL at each position over sequences.

    Args:
        sequences: (num_sequences, L) token ids; position i scores the prediction of token i + 1.

    Returns:
        (L - 1,) float64 NLL in nats, averaged over sequences.
    """
    total = torch.zeros(sequences.shape[1] - 1, dtype=torch.float64)
    device = model_device(model)
    for row in tqdm(sequences, desc="longctx", unit="seq", disable=not progress):
        ids = row[None].to(device)
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        total += nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none").double().cpu()
    return total / sequences.shape[0]


def cumulative_average(values: torch.Tensor) -> torch.Tensor:
    """c[i] = mean(values[0..i]): the paper's "cumulative average NLL up to position i"."""
    return torch.cumsum(values, 0) / torch.arange(1, values.shape[0] + 1, dtype=values.dtype)


@dataclass(frozen=True)
class LongctxOptions:
    """longctx's settings (``difftransformer eval longctx`` flags, the options :func:`run_longctx` takes)."""

    length: int = option(2048, "window length in tokens")
    num_sequences: int = option(8, "held-out windows")

    def __post_init__(self) -> None:
        counts(self, "length", "num_sequences")
        at_least(self, 2, "length")


def run_longctx(
    model: nn.Module,
    token_ids: Sequence[int],
    options: LongctxOptions,
    *,
    output_dir=None,
    progress: bool = True,
) -> dict:
    """Cut ``num_sequences`` non-overlapping windows of ``length`` tokens from ``token_ids`` and report the
    per-position and cumulative average NLL (positions 1..length-1, i.e. tokens predicted with 0..L-2
    tokens of context before them), ``num_sequences`` and ``length`` being ``options``'. Writes longctx.json and
    longctx.png."""
    length, num_sequences = options.length, options.num_sequences
    check_context_length(model, length, "`length`")
    need = length * num_sequences
    if len(token_ids) < need:
        raise UsageError(
            f"held-out text gives {len(token_ids)} tokens; `num_sequences` {num_sequences} x `length` {length} = "
            f"{need} are needed"
        )
    sequences = torch.tensor(list(token_ids[:need]), dtype=torch.long).view(num_sequences, length)
    nll = position_nll(model, sequences, progress)
    cumulative = cumulative_average(nll)
    results = dict(
        task="longctx",
        length=length,
        num_sequences=num_sequences,
        mean_nll=float(nll.mean()),
        positions=list(range(1, length)),
        nll=nll.tolist(),
        cumulative_nll=cumulative.tolist(),
    )
    return save_results(
        results, output_dir, lambda path: plot_cumulative([("model", cumulative.numpy())], path)
    )


def plot_cumulative(curves: Sequence[tuple[str, np.ndarray]], path) -> None:
    """Cumulative average NLL against position (log x), one line per model."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in curves:
        ax.plot(np.arange(1, len(values) + 1), values, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("position (tokens)")
    ax.set_ylabel("cumulative average NLL (nats)")
    ax.set_title("long-context NLL by position")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


class LongctxTask(Task):
    """Long-context modelling: next-token NLL by position, its mean and its cumulative average."""

    name = "longctx"
    title = "NLL by position (longctx)"
    help = "long-context modelling: cumulative average NLL by position on held-out text"
    Options = LongctxOptions
    light = LongctxOptions()  # the suite's context, as many of the 8 windows as the text holds

    def fit(
        self, options: LongctxOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
    ) -> LongctxOptions:
        return fit_length(options, model, given)

    def light_options(self, light: LongctxOptions, suite: SuiteContext) -> LongctxOptions:
        return dataclasses.replace(
            light, length=suite.context_length, num_sequences=suite.windows(light.num_sequences)
        )

    def run(self, model, tokenizer, texts, options: LongctxOptions, output_dir: Path, progress: bool) -> dict:
        check_context_length(model, options.length, "`length`")  # before reading the text
        ids = token_stream(tokenizer, texts, options.length * options.num_sequences)
        return run_longctx(model, ids, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        cumulative = results["cumulative_nll"]
        # The cumulative average at positions 1, 4, 16, ... and the last one (where it equals the mean NLL).
        positions, p = [], 1
        while p < len(cumulative):
            positions.append(p)
            p *= 4
        positions.append(len(cumulative))
        return dict(
            mean_nll=results["mean_nll"], cumulative_nll={str(p): cumulative[p - 1] for p in positions}
        )

    def columns(self, summary: dict) -> list[Column]:
        # The cumulative average at the last position is the mean NLL, which has its own column.
        positions = list(summary["cumulative_nll"].items())[:-1]
        return [Column("mean NLL", summary["mean_nll"], 3)] + [
            Column(f"cumulative NLL to {p}", value, 3) for p, value in positions
        ]

    def describe(self, options: dict) -> str:
        return (
            f"Next-token NLL (nats) on {options['num_sequences']} held-out windows of {options['length']} tokens: "
            "the mean, and the cumulative average from the first position up to the given one. Lower is better."
        )

    def chart(self, summary: dict) -> Chart:
        positions = list(summary["cumulative_nll"])
        headers = [f"cumulative NLL to {p}" for p in positions[:-1]] + ["mean NLL"]
        return Chart("lines", "long-context NLL by position", [Panel("cumulative average NLL (nats)", headers)],
                     xlabel="position (tokens)", xticks=positions)  # fmt: skip

    def measures(self, summary: dict) -> list[Measure]:
        return [Measure("mean NLL by position", lambda s: s["mean_nll"], False, 3,
                        paper=paper.LONG_CONTEXT)]  # fmt: skip


TASK = LongctxTask()
