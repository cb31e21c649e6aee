"""Multi-query associative recall (Zoology, Arora et al. 2023) on raw vocabulary ids.

A sequence holds ``num_pairs`` key-value pairs ``k1 v1 k2 v2 ...`` followed by queries ``ka va kb vb ...``
(keys drawn again from the pairs, in random order). The model must predict each queried key's value at
the position right after the key; we read the argmax over the whole vocabulary (teacher forcing, one
forward per sequence). Accuracy = share of queries answered exactly.

The task is tokenizer-independent: keys and values are token ids drawn directly from the model's
vocabulary, keys from the lower half of [first_id, vocab_size) and values from the upper half, so a
key never doubles as a value. ``first_id`` (default 256, or a quarter of a smaller vocabulary) skips the special and byte-level ids at the
bottom of most vocabularies; ids the tokenizer marks special are excluded when a tokenizer is given.
A pretrained LM sees gibberish tokens, which is the point: only in-context recall can solve it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.eval.common import check_context_length, max_context, model_device
from difftransformer.eval.options import at_least, not_empty, option, with_settings
from difftransformer.eval.task import UNIT, Chart, Column, Measure, Panel, SuiteContext, Task
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean
from difftransformer.storage import write_json


def make_mqar_batch(
    rng: np.random.Generator,
    *,
    batch: int,
    num_pairs: int,
    num_queries: int,
    key_ids: np.ndarray,
    value_ids: np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw MQAR sequences.

    Returns:
        input_ids (batch, 2 * (num_pairs + num_queries)); query_positions (num_queries,) where the model
        must predict a value (the query key's position); targets (batch, num_queries) the values.
    """
    if num_queries > num_pairs:
        raise ValueError(f"num_queries ({num_queries}) must not exceed num_pairs ({num_pairs})")
    if num_pairs > min(len(key_ids), len(value_ids)):
        raise ValueError(f"num_pairs={num_pairs} exceeds the {min(len(key_ids), len(value_ids))} usable ids")
    rows, targets = [], []
    for _ in range(batch):
        keys = rng.choice(key_ids, size=num_pairs, replace=False)
        values = rng.choice(value_ids, size=num_pairs, replace=False)
        asked = rng.choice(num_pairs, size=num_queries, replace=False)
        context = np.stack([keys, values], 1).reshape(-1)
        queries = np.stack([keys[asked], values[asked]], 1).reshape(-1)
        rows.append(np.concatenate([context, queries]))
        targets.append(values[asked])
    query_positions = 2 * num_pairs + 2 * np.arange(num_queries)
    return (
        torch.tensor(np.array(rows), dtype=torch.long),
        torch.tensor(query_positions, dtype=torch.long),
        torch.tensor(np.array(targets), dtype=torch.long),
    )


def usable_ids(vocab_size: int, first_id: int = 256, tokenizer=None) -> tuple[np.ndarray, np.ndarray]:
    """Key ids (lower half) and value ids (upper half) of [first_id, vocab_size), special ids removed."""
    if not 0 <= first_id < vocab_size - 3:
        raise ValueError(f"first_id must lie in [0, vocab_size - 3 = {vocab_size - 3}); got {first_id}")
    ids = np.arange(first_id, vocab_size)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = ids[~np.isin(ids, list(special))] if special else ids
    half = len(ids) // 2
    return ids[:half], ids[half:]


@torch.no_grad()
def mqar_accuracy(model: nn.Module, input_ids, query_positions, targets) -> float:
    """Share of queries whose value is the model's argmax at the query key's position."""
    logits = model(input_ids=input_ids.to(model_device(model)), use_cache=False).logits
    predicted = logits[:, query_positions.to(logits.device)].argmax(-1).cpu()
    return float((predicted == targets).float().mean())


@dataclass(frozen=True)
class MqarOptions:
    """mqar's settings (``difftransformer eval mqar`` flags, :func:`run_mqar` keywords)."""

    num_pairs: list[int] = option([4, 8, 16, 32, 64], "key-value pairs per sequence, one setting each")
    num_queries: int | None = option(None, "queries per sequence (unset: every key, capped at the pairs)")
    sequences: int = option(64, "sequences per setting")
    batch_size: int = option(16, "sequences per forward pass")
    first_id: int | None = option(None, "lowest vocabulary id for keys and values (unset: 256, or a quarter of "
                                  "a smaller vocabulary)")  # fmt: skip
    seed: int = option(0, "seed of the draws")

    def __post_init__(self) -> None:
        not_empty(self, "num_pairs")
        at_least(self, 1, "num_pairs", "num_queries", "sequences", "batch_size")
        at_least(self, 0, "first_id")

    def queries(self, pairs: int) -> int:
        """Queries of a sequence of ``pairs`` key-value pairs."""
        return pairs if self.num_queries is None else min(self.num_queries, pairs)


def run_mqar(
    model: nn.Module,
    tokenizer=None,
    options: MqarOptions | None = None,
    *,
    output_dir=None,
    progress: bool = True,
    **settings: Any,
) -> dict:
    """MQAR accuracy for each number of key-value pairs (``options``, or its fields as keywords). Writes
    mqar.json and mqar.png."""
    options = with_settings(options, MqarOptions, settings)
    num_pairs, sequences, batch_size = options.num_pairs, options.sequences, options.batch_size
    first_id, seed = options.first_id, options.seed
    vocab_size = int(model.config.vocab_size)
    # Default: skip the lowest ids (special and byte tokens), at most a quarter of a small vocabulary.
    first_id = min(256, vocab_size // 4) if first_id is None else first_id
    key_ids, value_ids = usable_ids(vocab_size, first_id, tokenizer)
    for n in num_pairs:
        q = options.queries(n)
        check_context_length(model, 2 * (n + q), "--num-pairs (2 x (pairs + queries) tokens)")
        if n > min(len(key_ids), len(value_ids)):
            raise ValueError(
                f"--num-pairs {n} exceeds the {min(len(key_ids), len(value_ids))} usable key ids"
            )
    rng = np.random.default_rng(seed)
    rows = []
    for n in tqdm(num_pairs, desc="mqar", unit="setting", disable=not progress):
        q = options.queries(n)
        scores, done = [], 0
        while done < sequences:
            size = min(batch_size, sequences - done)
            batch = make_mqar_batch(
                rng, batch=size, num_pairs=n, num_queries=q, key_ids=key_ids, value_ids=value_ids
            )
            scores.append(mqar_accuracy(model, *batch) * size)
            done += size
        rows.append(dict(num_pairs=n, num_queries=q, accuracy=sum(scores) / sequences))
    results = dict(task="mqar", sequences=sequences, seed=seed, rows=rows)
    if output_dir is not None:
        write_json(f"{output_dir}/mqar.json", results)
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r["num_pairs"] for r in rows], [r["accuracy"] for r in rows], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("key-value pairs")
        ax.set_ylabel("recall accuracy")
        ax.set_title("multi-query associative recall")
        ax.grid(alpha=0.3)
        save_figure(fig, f"{output_dir}/mqar.png")
    return results


def fitting_pairs(context_length: int, most: int) -> list[int]:
    """Powers of two from 4 up to ``most`` whose MQAR sequence (every key queried: 4 tokens a pair) fits."""
    pairs, n = [], 4
    while n <= most and 4 * n <= context_length:
        pairs.append(n)
        n *= 2
    return pairs


# Accuracy at or below this counts as "at chance": associative recall not learned.
CHANCE_MARGIN = 0.05


class MqarTask(Task):
    """Multi-query associative recall on raw vocabulary ids."""

    name = "mqar"
    title = "Multi-query associative recall (mqar)"
    help = "multi-query associative recall: in-context key-value recall on raw vocabulary ids"
    reads_text = False
    needs_tokenizer = False
    Options = MqarOptions
    # In a comparison: every power of two from 4 pairs up to the largest of num_pairs whose sequence fits.
    light = MqarOptions(sequences=16)

    def fit(
        self, options: MqarOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
    ) -> MqarOptions:
        limit = max_context(model)
        if "num_pairs" in given or limit is None:
            return options
        pairs = [n for n in options.num_pairs if 2 * (n + options.queries(n)) <= limit]
        return dataclasses.replace(options, num_pairs=pairs) if pairs else options

    def light_options(self, light: MqarOptions, suite: SuiteContext) -> MqarOptions:
        pairs = fitting_pairs(suite.context_length, max(light.num_pairs))
        if not pairs:
            raise ValueError(
                f"mqar needs a context of at least 16 tokens; got context_length {suite.context_length}"
            )
        return dataclasses.replace(light, num_pairs=pairs, seed=suite.seed)

    def run(self, model, tokenizer, texts, options: MqarOptions, output_dir: Path, progress: bool) -> dict:
        return run_mqar(model, tokenizer, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        return {str(r["num_pairs"]): r["accuracy"] for r in results["rows"]}

    def columns(self, summary: dict) -> list[Column]:
        return [Column(f"{pairs} pairs", accuracy, 2) for pairs, accuracy in summary.items()]

    def describe(self, options: dict) -> str:
        return (
            f"Share of queried keys whose value is the model's argmax, {options['sequences']} sequences of random "
            "vocabulary ids per number of key-value pairs. Higher is better."
        )

    def chart(self, summary: dict) -> Chart:
        pairs = list(summary)
        return Chart("lines", "multi-query associative recall",
                     [Panel("recall accuracy", [f"{n} pairs" for n in pairs], UNIT)], xlabel="key-value pairs",
                     xticks=pairs)  # fmt: skip

    def measures(self, summary: dict) -> list[Measure]:
        return [Measure("MQAR accuracy averaged over pair counts", lambda s: mean(list(s.values())), True, 2,
                        at_chance=lambda s: mean(list(s.values())) <= CHANCE_MARGIN,
                        chance=f"accuracy about 0, counted up to {CHANCE_MARGIN}: a value is not guessed")]  # fmt: skip


TASK = MqarTask()
