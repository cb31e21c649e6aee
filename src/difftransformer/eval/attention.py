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

from difftransformer.data.needles import make_needle_sample
from difftransformer.errors import UsageError
from difftransformer.eval.common import is_difftransformer, model_device
from difftransformer.eval.logits import attention_logits
from difftransformer.eval.needle import (
    NeedleOptions,
    fit_needle_lengths,
    require_needles_fit,
    validate_needle_run,
)
from difftransformer.eval.options import option, with_settings
from difftransformer.eval.task import Chart, Column, Measure, Panel, SuiteContext, Task
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean
from difftransformer.storage import write_json

PAPER_ANSWER_SHARE = "DIFF 0.27-0.40 vs Transformer 0.03-0.09 by depth (3B models, multi-needle retrieval)"
PAPER_CONTEXT_SHARE = "DIFF 0.01-0.02 vs Transformer 0.49-0.54 by depth (3B models, multi-needle retrieval)"


@torch.no_grad()
def attention_maps(model: nn.Module, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Per layer the (B, H, T, S) attention maps; for DIFF models the combined map A1 - lambda A2.

    Ours return the combined map directly. A transformers DiffLlama returns its 2h component maps; they are
    combined here as head j minus lambda times head j + h (its pairing). Others: their softmax maps.
    """
    if is_difftransformer(model):
        return list(model(input_ids=input_ids, output_attentions=True, use_cache=False).attentions)
    with attention_logits(model, None):
        maps = list(model(input_ids=input_ids, output_attentions=True, use_cache=False).attentions)
    if getattr(model.config, "model_type", "") == "diffllama":
        modules = [m for m in model.modules() if hasattr(m, "lambda_q1") and hasattr(m, "lambda_init")]
        combined = []
        for module, full in zip(modules, maps):
            lam = (
                torch.exp(torch.sum(module.lambda_q1 * module.lambda_k1))
                - torch.exp(torch.sum(module.lambda_q2 * module.lambda_k2))
                + module.lambda_init
            )
            half = full.shape[1] // 2
            combined.append(full[:, :half].float() - lam.float() * full[:, half:].float())
        maps = combined
    if any(m is None for m in maps):
        raise TypeError(f"{type(model).__name__} returned no attention maps with output_attentions=True")
    return maps


def allocation(
    maps: Sequence[torch.Tensor], rows: slice, answer_span: tuple[int, int], context_end: int
) -> dict[str, np.ndarray]:
    """Per-layer attention shares for one sequence (batch 0).

    Args:
        maps: per layer (1, H, T, S).
        rows: the answer-producing query positions.
        answer_span: [start, end) of the answer needle.
        context_end: the question starts here.

    Returns:
        "answer", "context", "answer_abs", "context_abs": arrays of shape (num_layers,), averaged over
        the rows and heads.
    """
    start, end = answer_span
    out: dict[str, list[float]] = {"answer": [], "context": [], "answer_abs": [], "context_abs": []}
    for layer_map in maps:
        a = layer_map[0, :, rows].double()  # (H, rows, S)
        total = a.abs().sum(-1).clamp_min(1e-30)
        context = torch.zeros(a.shape[-1], dtype=torch.bool, device=a.device)
        context[:context_end] = True
        context[start:end] = False
        for key, values in (("", a), ("_abs", a.abs())):
            out["answer" + key].append(float((values[..., start:end].sum(-1) / total).mean()))
            out["context" + key].append(float((values[..., context].sum(-1) / total).mean()))
    return {k: np.array(v) for k, v in out.items()}


@dataclass(frozen=True)
class AttentionOptions(NeedleOptions):
    """attention's settings (``difftransformer eval attention`` flags, :func:`run_attention` keywords): needle's,
    with exactly one context length and one N:R pair."""

    needles: list[str] = option(["4:1"], "one N:R pair (N needles, R of them queried; the first is read)")
    samples: int = option(10, "samples per depth")
    per_layer: bool = option(False, "also report shares per layer")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("context_lengths", "needles"):
            if len(getattr(self, name)) != 1:
                raise UsageError(f"attention takes exactly one `{name}` value; got {getattr(self, name)}")


def run_attention(
    model: nn.Module,
    tokenizer,
    haystack_texts: Sequence[str],
    options: AttentionOptions | None = None,
    *,
    output_dir=None,
    progress: bool = True,
    **settings: Any,
) -> dict:
    """Attention shares on the answer needle and on the rest of the context, by depth (paper Table 3).

    ``options``: an :class:`AttentionOptions`, or its fields as keywords; ``needle_digits`` is the digits of the
    magic numbers (a model trained on 3-digit needles is read on 3-digit ones). Writes attention.json and
    attention.png (shares against depth)."""
    options = with_settings(options, AttentionOptions, settings)
    (context_length,), [(num_needles, num_queries)] = options.context_lengths, options.pairs
    depths, samples, per_layer, seed = options.depths, options.samples, options.per_layer, options.seed
    stream = tokenizer("\n".join(haystack_texts), add_special_tokens=False)["input_ids"]
    validate_needle_run(model, tokenizer, len(stream), options)
    # The gold answer's tokens follow the prompt (teacher forcing) as a greedy answer would: like needle's decoding,
    # only the prompt is held to max_position_embeddings (validate_needle_run), so a model trained on blocks of
    # exactly the context length is read at that length.
    rng = np.random.default_rng(seed)
    device = model_device(model)
    by_depth = []
    with tqdm(total=len(depths) * samples, desc="attention", unit="sample", disable=not progress) as bar:
        for depth in depths:
            collected = []
            for _ in range(samples):
                sample = make_needle_sample(
                    tokenizer, stream, context_tokens=context_length, num_needles=num_needles,
                    num_queries=num_queries, depth=depth, rng=rng, needle_template=options.needle_template,
                    question_template=options.question_template, number_digits=options.needle_digits,
                )  # fmt: skip
                prompt, answer = sample.prompt_ids[0], sample.answer_ids[0]
                ids = torch.tensor([prompt + answer[:-1]], device=device)
                rows = slice(len(prompt) - 1, len(prompt) - 1 + len(answer))
                maps = attention_maps(model, ids)
                collected.append(allocation(maps, rows, sample.answer_span, sample.context_end))
                bar.update(1)
            entry = {"depth": depth}
            for key in collected[0]:
                layers = np.mean([c[key] for c in collected], axis=0)
                entry[key] = float(layers.mean())
                if per_layer:
                    entry[key + "_per_layer"] = layers.tolist()
            by_depth.append(entry)
    results = dict(
        task="attention", context_length=context_length, needles=num_needles, queries=num_queries,
        samples=samples, by_depth=by_depth,
    )  # fmt: skip
    if output_dir is not None:
        write_json(f"{output_dir}/attention.json", results)
        plot_allocation(by_depth, f"{output_dir}/attention.png")
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
            light, context_lengths=[suite.context_length], needle_digits=suite.needle_digits, seed=suite.seed
        )
        require_needles_fit(suite.tokenizer, options)
        return options

    def run(
        self, model, tokenizer, texts, options: AttentionOptions, output_dir: Path, progress: bool
    ) -> dict:
        return run_attention(model, tokenizer, texts, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        depths = results["by_depth"]
        return {key: mean([e[key] for e in depths]) for key in ("answer", "context")}

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
            Measure("attention on the answer needle", lambda s: s["answer"], True, 3, paper=PAPER_ANSWER_SHARE),
            Measure("attention on the rest of the context (noise)", lambda s: s["context"], False, 3,
                    paper=PAPER_CONTEXT_SHARE),
        ]  # fmt: skip


TASK = AttentionTask()
