"""Attention-logit quantization (paper §3.8): dynamic absmax fake-quantisation of the logits alone.

"Dynamic absmax post-training" quantisation: nothing is calibrated; at every forward the scale is the
absolute maximum of the logits in a group, s = absmax / (2^(b-1) - 1), and each logit becomes
round(x / s) * s clipped to +-(2^(b-1) - 1) s (symmetric signed integers; b = 16 is int16, near lossless).
The group ("granularity") is one head's logit matrix of one sequence by default: a single outlier logit
then coarsens every logit of that head, which is exactly the effect the paper measures. "row" (one
query's logits) and "tensor" (all heads of a layer) are the finer and coarser alternatives. Only the
causally visible logits enter the absmax, as a kernel that skips masked blocks would see them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.data.mqar import MqarSettings
from difftransformer.data.needles import encode
from difftransformer.errors import UsageError
from difftransformer.eval import chance, paper
from difftransformer.eval.common import (
    check_context_length,
    fit_length,
    held_out_windows,
    mean_token_nll,
    save_results,
    token_stream,
)
from difftransformer.eval.haystack import (
    NeedleGrid,
    accuracy_by_config,
    fit_needle_lengths,
    interval_by_config,
    needle_cells,
    needles_problem,
    validate_needle_run,
)
from difftransformer.eval.logits import attention_logits, visible_keys
from difftransformer.eval.options import MOST, at_least, at_most, counts, distinct, not_empty, option
from difftransformer.eval.recall import key_vocabulary, recall_accuracy
from difftransformer.eval.task import UNIT, Chart, Column, Measure, Panel, SuiteContext, Task, interval_at
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean_interval, wilson_interval

GRANULARITIES: tuple[str, ...] = ("tensor", "head", "row")
# The widest logits quantised: a float32 logit carries 24 significant bits, so a grid of 2^(b-1) - 1 levels finer
# than that measures nothing more (and from 64 bits on the level count overflows the integers torch rounds to).
MOST_BITS = 24
# MQAR sequences scored at each width by the MQAR check.
MQAR_SEQUENCES = 64


def absmax_fake_quantize(
    logits: torch.Tensor, bits: int, granularity: str = "head", visible: torch.Tensor | None = None
) -> torch.Tensor:
    """Symmetric absmax fake-quantisation.

    Args:
        logits: (B, H, T, S).
        bits: integer width b in [2, :data:`MOST_BITS`]; levels are -(2^(b-1)-1) .. 2^(b-1)-1 times the scale.
        granularity: one scale per "tensor" (B, all heads), per "head" (B, H) or per "row" (B, H, T).
        visible: (T, S) bool; only True entries set the scale (others are quantised with it all the same).

    Returns:
        Same shape and dtype; entries of an all-zero group stay zero.
    """
    if not 2 <= bits <= MOST_BITS:
        raise UsageError(f"`bits` must lie in [2, {MOST_BITS}]; got {bits}")
    if granularity not in GRANULARITIES:
        raise UsageError(f"`granularity` must be one of {GRANULARITIES}; got {granularity!r}")
    if logits.dim() != 4:
        raise ValueError(f"logits must be (B, H, T, S); got shape {tuple(logits.shape)}")
    x = logits.float()
    magnitude = x.abs() if visible is None else x.abs().masked_fill(~visible, 0.0)
    dims = {"tensor": (1, 2, 3), "head": (2, 3), "row": (3,)}[granularity]
    absmax = magnitude.amax(dim=dims, keepdim=True)
    qmax = 2 ** (bits - 1) - 1
    scale = torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))
    return (torch.round(x / scale).clamp(-qmax, qmax) * scale).to(logits.dtype)


class QuantizeLogits:
    """A logits hook that fake-quantises every layer's logits at ``bits`` (None: leave them as they are)."""

    def __init__(self, bits: int | None, granularity: str = "head"):
        self.bits, self.granularity = bits, granularity

    def __call__(self, module: nn.Module, logits: torch.Tensor) -> torch.Tensor:
        if self.bits is None:
            return logits
        visible = visible_keys(logits.shape[-2], logits.shape[-1], logits.device)
        return absmax_fake_quantize(logits, self.bits, self.granularity, visible)


@dataclass(frozen=True)
class QuantOptions(NeedleGrid):
    """quant's settings (``difftransformer eval quant`` flags): the held-out loss's, then a grid of needle prompts
    (:class:`NeedleGrid`) for the accuracy check at each width, and the MQAR check's."""

    context_lengths: list[int] = option([1024], "needle check: prompt lengths in tokens")
    needles: list[str] = option(
        ["1:1", "2:2", "4:2", "6:2"], "needle check: N:R pairs (N needles, R queried)"
    )
    length: int = option(512, "held-out window length in tokens")
    num_sequences: int = option(8, "held-out windows")
    bits: list[int] = option([16, 8, 6, 4], f"attention-logit bit widths, 2 to {MOST_BITS}")
    granularity: Literal["tensor", "head", "row"] = option("head", "one absmax scale per layer tensor, per head "
                                                           "or per query row")  # fmt: skip
    needle: bool = option(True, "measure needle accuracy at each width (--no-needle skips it)")
    samples: int = option(5, "needle check: samples per (N:R, length, depth) cell")
    mqar_pairs: int = option(0, f"key-value pairs of an MQAR check at each width, {MQAR_SEQUENCES} sequences (0 "
                             "skips it)")  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        not_empty(self, "bits")
        counts(self, "length", "num_sequences")
        at_least(self, 2, "bits")
        at_most(self, MOST_BITS, "bits")
        distinct(self, "bits")
        at_least(self, 0, "mqar_pairs")
        at_most(self, MOST, "mqar_pairs")
        if self.granularity not in GRANULARITIES:
            raise UsageError(f"`granularity` must be one of {GRANULARITIES}; got {self.granularity!r}")


def run_quant(
    model: nn.Module,
    tokenizer: Any,
    token_ids: Sequence[int],
    haystack_texts: Sequence[str] | None,
    options: QuantOptions,
    *,
    output_dir=None,
    progress: bool = True,
) -> dict:
    """Held-out loss and (with ``haystack_texts`` and ``options.needle``) needle accuracy, and (with
    ``options.mqar_pairs``) MQAR accuracy, with the logits quantised at each width of ``options``.

    The first row, bits = None, is the unquantised model through the same (materialized) attention path. Every
    width sees the same needle samples and MQAR sequences (same seed); every check is validated before the first
    width is measured.
    """
    check_context_length(model, options.length, "`length`")
    sequences = held_out_windows(token_ids, options.length, options.num_sequences)
    stream = None
    if haystack_texts is not None and options.needle:
        stream = encode(tokenizer, "\n".join(haystack_texts))
        validate_needle_run(model, tokenizer, len(stream), options)
    recall = None
    if options.mqar_pairs:
        settings = MqarSettings(options.mqar_pairs)
        check_context_length(model, settings.tokens, f"`mqar_pairs` {options.mqar_pairs} with its queries")
        vocabulary = key_vocabulary(
            int(model.config.vocab_size), tokenizer, None, options.mqar_pairs, pairs_field="mqar_pairs"
        )
        recall = (vocabulary, settings)
    rows = []
    for width in tqdm([None, *options.bits], desc="quant", unit="width", disable=not progress):
        with attention_logits(model, QuantizeLogits(width, options.granularity)):
            row = dict(bits=width, loss=mean_token_nll(model, sequences, batch_size=1))
            if stream is not None:
                cells = needle_cells(model, tokenizer, stream, options, False)
                by_config = accuracy_by_config(cells, options.pairs)
                row["needle_accuracy"] = float(np.mean(list(by_config.values())))
                row["needle_by_config"] = by_config
                intervals = interval_by_config(cells, options.samples)
                row["needle_interval"] = mean_interval(
                    list(by_config.values()), [intervals[c] for c in by_config]
                )
            if recall is not None:
                rng = np.random.default_rng([options.seed, options.mqar_pairs])
                row["mqar_accuracy"] = recall_accuracy(model, *recall, MQAR_SEQUENCES, 16, rng)
                trials = MQAR_SEQUENCES * recall[1].queries
                row["mqar_interval"] = wilson_interval(round(row["mqar_accuracy"] * trials), trials)
        rows.append(row)
    results = dict(
        task="quant", granularity=options.granularity, length=options.length,
        num_sequences=options.num_sequences, rows=rows,
    )  # fmt: skip
    return save_results(results, output_dir, lambda path: plot_quant(rows, path))


def plot_quant(rows: list[dict], path) -> None:
    """Loss (and needle and MQAR accuracy) against logit bit width; the unquantised model as a dashed line."""
    plt = pyplot()
    quantised = [r for r in rows if r["bits"] is not None]
    reference = next((r for r in rows if r["bits"] is None), None)
    panels = ["loss"] + [key for key in ("needle_accuracy", "mqar_accuracy") if key in rows[0]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), squeeze=False)
    for ax, key in zip(axes[0], panels):
        ax.plot([r["bits"] for r in quantised], [r[key] for r in quantised], marker="o")
        if reference is not None:
            ax.axhline(reference[key], ls="--", color="gray", label="unquantised")
            ax.legend()
        if key != "loss":
            ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("attention-logit bits")
        ax.set_ylabel(key.replace("_", " "))
        ax.invert_xaxis()
        ax.grid(alpha=0.3)
    fig.suptitle("dynamic absmax quantisation of attention logits")
    save_figure(fig, path)


def _width(key: str) -> str:
    return "full" if key == "unquantised" else f"{key}-bit"


class QuantTask(Task):
    """Attention-logit quantisation: held-out loss and needle accuracy with fake-quantised attention logits."""

    name = "quant"
    title = "Simulated attention-logit quantisation (quant)"
    help = "attention-logit quantisation: held-out loss and needle accuracy at fewer bits"
    Options = QuantOptions
    # In a comparison the N:R pairs, the context and the digits are the suite's; the answer needle at depth 0.5.
    light = QuantOptions(num_sequences=4, depths=[0.5], samples=2)

    def fit(
        self, options: QuantOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
    ) -> QuantOptions:
        return fit_length(fit_needle_lengths(options, model, tokenizer, given), model, given)

    def light_options(self, light: QuantOptions, suite: SuiteContext) -> QuantOptions:
        options = dataclasses.replace(
            light, length=suite.context_length, num_sequences=suite.windows(light.num_sequences),
            context_lengths=[suite.context_length], needles=[f"{n}:{r}" for n, r in suite.needles],
            seed=suite.seed, mqar_pairs=4, **dataclasses.asdict(suite.needle),
        )  # fmt: skip
        # The needle check where the suite's needles fit the context; the MQAR check (4 pairs) always.
        return dataclasses.replace(options, needle=needles_problem(suite.tokenizer, options) is None)

    def run(self, model, tokenizer, texts, options: QuantOptions, output_dir: Path, progress: bool) -> dict:
        check_context_length(model, options.length, "`length`")  # before reading the text
        ids = token_stream(tokenizer, texts, options.length * options.num_sequences)
        return run_quant(model, tokenizer, ids, texts, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        return {
            "unquantised" if row["bits"] is None else str(row["bits"]): dict(
                loss=row["loss"],
                needle_accuracy=row.get("needle_accuracy"),
                mqar_accuracy=row.get("mqar_accuracy"),
                # each accuracy's 95% interval (Wilson over the numbers and queries asked)
                intervals={
                    key: list(row[f"{key.removesuffix('_accuracy')}_interval"])
                    for key in ("needle_accuracy", "mqar_accuracy")
                    if row.get(f"{key.removesuffix('_accuracy')}_interval") is not None
                },
            )
            for row in results["rows"]
        }

    @staticmethod
    def _checks(summary: dict) -> list[tuple[str, str]]:
        """(summary key, column word) of the accuracy checks these results hold."""
        first = next(iter(summary.values()))
        return [(key, word) for key, word in (("needle_accuracy", "needle"), ("mqar_accuracy", "mqar"))
                if first.get(key) is not None]  # fmt: skip

    def columns(self, summary: dict) -> list[Column]:
        columns = [Column(f"loss {_width(k)}", row["loss"], 3) for k, row in summary.items()]
        for key, word in self._checks(summary):
            columns += [Column(f"{word} {_width(k)}", row[key], 2) for k, row in summary.items()]
        return columns

    def describe(self, options: dict) -> str:
        checks = []
        if options.get("needle", True):
            checks.append(
                f"needle accuracy (N:R as for needle, answer at depth 0.5, {options['samples']} per N:R)"
            )
        if options.get("mqar_pairs"):
            checks.append(f"MQAR accuracy ({options['mqar_pairs']} pairs, {MQAR_SEQUENCES} sequences)")
        return (
            f"Held-out loss ({options['num_sequences']} windows of {options['length']} tokens)"
            + "".join(f" and {check}" for check in checks)
            + f" with the attention logits fake-quantised by dynamic absmax per head at {options['bits']} bits; "
            "'full' is the unquantised model through the same path. Lower loss and higher accuracy are better."
        )

    def chart(self, summary: dict) -> Chart:
        widths = [_width(k) for k in summary]
        panels = [Panel("held-out loss", [f"loss {w}" for w in widths])]
        for _, word in self._checks(summary):
            panels.append(Panel(f"{word} accuracy", [f"{word} {w}" for w in widths], UNIT))
        return Chart("lines", "dynamic absmax quantisation of attention logits", panels,
                     xlabel="attention-logit precision", xticks=widths)  # fmt: skip

    def measures(self, summary: dict) -> list[Measure]:
        widths = sorted(int(k) for k in summary if k != "unquantised")
        measures = [Measure(f"loss with {widths[0]}-bit attention logits (simulated)", lambda s: s[str(widths[0])]["loss"],
                            False, 3, paper=paper.LOW_BIT)]  # fmt: skip
        checks = dict(self._checks(summary))
        if "needle_accuracy" in checks:
            bits = str(widths[0])
            measures.append(
                Measure(f"needle accuracy with {bits}-bit attention logits (simulated)", lambda s: s[bits]["needle_accuracy"],
                        True, 2, paper=paper.LOW_BIT,
                        at_chance=lambda s: chance.exact_at_chance(s[bits]["needle_accuracy"]), chance=chance.NEEDLE,
                        interval=lambda s: interval_at(s[bits], "needle_accuracy"))
            )  # fmt: skip
        if "mqar_accuracy" in checks:
            # The paper's two widths: where DIFF holds (6) and where both drop (4).
            for bits in [str(b) for b in widths if b in (4, 6)] or [str(widths[0])]:
                measures.append(
                    Measure(f"MQAR accuracy with {bits}-bit attention logits (simulated, 4 pairs)",
                            lambda s, b=bits: s[b]["mqar_accuracy"], True, 2, paper=paper.LOW_BIT,
                            at_chance=lambda s, b=bits: chance.exact_at_chance(s[b]["mqar_accuracy"]),
                            chance=chance.MQAR, interval=lambda s, b=bits: interval_at(s[b], "mqar_accuracy"))
                )  # fmt: skip
        return measures


TASK = QuantTask()
