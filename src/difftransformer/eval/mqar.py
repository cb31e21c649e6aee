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

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.eval.common import (
    check_context_length,
    mean,
    model_device,
    parse_list,
    pyplot,
    save_figure,
)
from difftransformer.eval.task import UNIT, Chart, Column, LightSettings, Measure, Panel, SuiteContext, Task
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


def run_mqar(
    model: nn.Module,
    tokenizer=None,
    *,
    num_pairs: Sequence[int] = (4, 8, 16, 32, 64),
    num_queries: int | None = None,
    sequences: int = 64,
    batch_size: int = 16,
    first_id: int | None = None,
    seed: int = 0,
    output_dir=None,
    progress: bool = True,
) -> dict:
    """MQAR accuracy for each number of key-value pairs; ``num_queries`` defaults to num_pairs (every key
    asked once). Writes mqar.json and mqar.png."""
    vocab_size = int(model.config.vocab_size)
    # Default: skip the lowest ids (special and byte tokens), at most a quarter of a small vocabulary.
    first_id = min(256, vocab_size // 4) if first_id is None else first_id
    key_ids, value_ids = usable_ids(vocab_size, first_id, tokenizer)
    for n in num_pairs:
        q = n if num_queries is None else min(num_queries, n)
        check_context_length(model, 2 * (n + q), "--num-pairs (2 x (pairs + queries) tokens)")
        if n > min(len(key_ids), len(value_ids)):
            raise ValueError(
                f"--num-pairs {n} exceeds the {min(len(key_ids), len(value_ids))} usable key ids"
            )
    rng = np.random.default_rng(seed)
    rows = []
    for n in tqdm(num_pairs, desc="mqar", unit="setting", disable=not progress):
        q = n if num_queries is None else min(num_queries, n)
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


@dataclass(frozen=True)
class MqarLight(LightSettings):
    """mqar in a comparison: every power of two from 4 pairs up to ``max_pairs`` whose sequence (keys, values,
    queries) fits the context; sequences per setting."""

    max_pairs: int = 64
    sequences: int = 16


# Accuracy at or below this counts as "at chance": associative recall not learned.
CHANCE_MARGIN = 0.05


class MqarTask(Task):
    """Multi-query associative recall on raw vocabulary ids."""

    name = "mqar"
    title = "Multi-query associative recall (mqar)"
    help = "multi-query associative recall: in-context key-value recall on raw vocabulary ids"
    reads_text = False
    needs_tokenizer = False
    light = MqarLight()

    def configure(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("mqar")
        group.add_argument("--num-pairs", default="4,8,16,32,64", help="key-value pairs per sequence "
                           "(comma-separated)")  # fmt: skip
        group.add_argument("--num-queries", type=int, default=None, help="queries per sequence (default: "
                           "every key)")  # fmt: skip
        group.add_argument("--sequences", type=int, default=64, help="sequences per setting (default 64)")
        group.add_argument(
            "--batch-size", type=int, default=16, help="sequences per forward pass (default 16)"
        )
        group.add_argument("--first-id", type=int, default=None, help="lowest vocabulary id used for keys/values "
                           "(default 256, or a quarter of a smaller vocabulary)")  # fmt: skip

    def options(self, args: argparse.Namespace, model: nn.Module) -> dict:
        return dict(
            num_pairs=parse_list(args.num_pairs, int, "--num-pairs"), num_queries=args.num_queries,
            sequences=args.sequences, batch_size=args.batch_size, first_id=args.first_id, seed=args.seed,
        )  # fmt: skip

    def light_options(self, light: MqarLight, suite: SuiteContext) -> dict:
        pairs = fitting_pairs(suite.context_length, light.max_pairs)
        if not pairs:
            raise ValueError(
                f"mqar needs a context of at least 16 tokens; got context_length {suite.context_length}"
            )
        return dict(num_pairs=pairs, sequences=light.sequences, seed=suite.seed)

    def run(self, model, tokenizer, texts, options, output_dir: Path, progress: bool) -> dict:
        return run_mqar(model, tokenizer, **options, output_dir=output_dir, progress=progress)

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
