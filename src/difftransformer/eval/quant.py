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

from difftransformer.errors import UsageError
from difftransformer.eval.common import (
    check_context_length,
    fit_length,
    mean_token_nll,
    token_stream,
)
from difftransformer.eval.logits import attention_logits, visible_keys
from difftransformer.eval.mqar import CHANCE_MARGIN as MQAR_CHANCE_MARGIN
from difftransformer.eval.mqar import MqarOptions, run_mqar
from difftransformer.eval.needle import (
    CHANCE,
    CHANCE_MARGIN,
    NeedleOptions,
    fit_needle_lengths,
    needles_problem,
    run_needle,
)
from difftransformer.eval.options import at_least, not_empty, option, with_settings
from difftransformer.eval.task import UNIT, Chart, Column, Measure, Panel, SuiteContext, Task
from difftransformer.plotting import pyplot, save_figure
from difftransformer.storage import write_json

GRANULARITIES: tuple[str, ...] = ("tensor", "head", "row")


def absmax_fake_quantize(
    logits: torch.Tensor, bits: int, granularity: str = "head", visible: torch.Tensor | None = None
) -> torch.Tensor:
    """Symmetric absmax fake-quantisation.

    Args:
        logits: (B, H, T, S).
        bits: integer width b >= 2; levels are -(2^(b-1)-1) .. 2^(b-1)-1 times the scale.
        granularity: one scale per "tensor" (B, all heads), per "head" (B, H) or per "row" (B, H, T).
        visible: (T, S) bool; only True entries set the scale (others are quantised with it all the same).

    Returns:
        Same shape and dtype; entries of an all-zero group stay zero.
    """
    if bits < 2:
        raise UsageError(f"bits must be >= 2; got {bits}")
    if granularity not in GRANULARITIES:
        raise UsageError(f"granularity must be one of {GRANULARITIES}; got {granularity!r}")
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
class QuantOptions(NeedleOptions):
    """quant's settings (``difftransformer eval quant`` flags, :func:`run_quant` keywords): the held-out loss's, then
    needle's for the accuracy check at each width."""

    length: int = option(512, "held-out window length in tokens")
    num_sequences: int = option(8, "held-out windows")
    bits: list[int] = option([16, 8, 6, 4], "attention-logit bit widths")
    granularity: Literal["tensor", "head", "row"] = option("head", "one absmax scale per layer tensor, per head "
                                                           "or per query row")  # fmt: skip
    needle: bool = option(True, "measure needle accuracy at each width (--no-needle skips it)")
    samples: int = option(5, "needle samples per (N:R, length, depth) cell")
    mqar_pairs: int = option(0, "key-value pairs of an MQAR check at each width, 64 sequences (0 skips it)")

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 0, "mqar_pairs")
        not_empty(self, "bits")
        at_least(self, 1, "length", "num_sequences")
        at_least(self, 2, "bits")
        if self.granularity not in GRANULARITIES:
            raise UsageError(f"--granularity must be one of {GRANULARITIES}; got {self.granularity!r}")

    def needle_options(self) -> NeedleOptions:
        """The needle check's options: this object's needle fields."""
        return NeedleOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(NeedleOptions)})


def run_quant(
    model: nn.Module,
    tokenizer,
    token_ids: Sequence[int],
    haystack_texts: Sequence[str] | None = None,
    options: QuantOptions | None = None,
    *,
    output_dir=None,
    progress: bool = True,
    **settings: Any,
) -> dict:
    """Held-out loss and (with ``haystack_texts``) needle accuracy with the logits quantised at each width.

    The first row, bits = None, is the unquantised model through the same (materialized) attention path.
    ``options``: a :class:`QuantOptions`, or its fields as keywords; its needle fields go to
    :func:`difftransformer.eval.needle.run_needle`; every width sees the same needle samples (same seed).
    """
    options = with_settings(options, QuantOptions, settings)
    bits, granularity, length, num_sequences = (
        options.bits,
        options.granularity,
        options.length,
        options.num_sequences,
    )
    check_context_length(model, length, "--length")
    need = length * num_sequences
    if len(token_ids) < need:
        raise UsageError(
            f"held-out text gives {len(token_ids)} tokens; {num_sequences} x {length} are needed"
        )
    sequences = torch.tensor(list(token_ids[:need]), dtype=torch.long).view(num_sequences, length)
    check_needle = haystack_texts is not None and options.needle
    # Every width scores the same sequences (same seed).
    mqar_check = (
        MqarOptions(num_pairs=[options.mqar_pairs], seed=options.seed, allocation=0)
        if options.mqar_pairs
        else None
    )
    rows = []
    for width in tqdm([None, *bits], desc="quant", unit="width", disable=not progress):
        with attention_logits(model, QuantizeLogits(width, granularity)):
            row = dict(bits=width, loss=mean_token_nll(model, sequences, batch_size=1))
            if check_needle:
                needle = run_needle(
                    model, tokenizer, haystack_texts, options.needle_options(), progress=False
                )
                row["needle_accuracy"] = float(np.mean(list(needle["by_config"].values())))
                row["needle_by_config"] = needle["by_config"]
            if mqar_check is not None:
                recall = run_mqar(model, tokenizer, mqar_check, progress=False)
                row["mqar_accuracy"] = recall["rows"][0]["accuracy"]
        rows.append(row)
    results = dict(
        task="quant", granularity=granularity, length=length, num_sequences=num_sequences, rows=rows
    )
    if output_dir is not None:
        write_json(f"{output_dir}/quant.json", results)
        plot_quant(rows, f"{output_dir}/quant.png")
    return results


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


PAPER_LOW_BIT = (
    "zero-shot accuracy held down to 6-bit logits by DIFF, not by the Transformer; at 4 bits DIFF about 25 points "
    "higher (3B models)"
)


class QuantTask(Task):
    """Attention-logit quantisation: held-out loss and needle accuracy with fake-quantised attention logits."""

    name = "quant"
    title = "Attention-logit quantisation (quant)"
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
            needle_digits=suite.needle_digits, seed=suite.seed, mqar_pairs=4,
        )  # fmt: skip
        # The needle check where the suite's needles fit the context; the MQAR check (4 pairs) always.
        return dataclasses.replace(options, needle=needles_problem(suite.tokenizer, options) is None)

    def run(self, model, tokenizer, texts, options: QuantOptions, output_dir: Path, progress: bool) -> dict:
        check_context_length(model, options.length, "--length")  # before reading the text
        ids = token_stream(tokenizer, texts, options.length * options.num_sequences)
        return run_quant(model, tokenizer, ids, texts, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        return {
            "unquantised" if row["bits"] is None else str(row["bits"]): dict(
                loss=row["loss"],
                needle_accuracy=row.get("needle_accuracy"),
                mqar_accuracy=row.get("mqar_accuracy"),
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
            checks.append(f"MQAR accuracy ({options['mqar_pairs']} pairs, 64 sequences)")
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
        measures = [Measure(f"loss with {widths[0]}-bit attention logits", lambda s: s[str(widths[0])]["loss"],
                            False, 3, paper=PAPER_LOW_BIT)]  # fmt: skip
        checks = dict(self._checks(summary))
        if "needle_accuracy" in checks:
            bits = str(widths[0])
            measures.append(
                Measure(f"needle accuracy with {bits}-bit attention logits", lambda s: s[bits]["needle_accuracy"],
                        True, 2, paper=PAPER_LOW_BIT,
                        at_chance=lambda s: s[bits]["needle_accuracy"] <= CHANCE_MARGIN, chance=CHANCE)
            )  # fmt: skip
        if "mqar_accuracy" in checks:
            # The paper's two widths: where DIFF holds (6) and where both drop (4).
            for bits in [str(b) for b in widths if b in (4, 6)] or [str(widths[0])]:
                measures.append(
                    Measure(f"MQAR accuracy with {bits}-bit attention logits (4 pairs)",
                            lambda s, b=bits: s[b]["mqar_accuracy"], True, 2, paper=PAPER_LOW_BIT,
                            at_chance=lambda s, b=bits: s[b]["mqar_accuracy"] <= MQAR_CHANCE_MARGIN,
                            chance="accuracy about 0: a value is not guessed")
                )  # fmt: skip
        return measures


TASK = QuantTask()
