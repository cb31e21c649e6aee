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

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.eval.common import check_context_length, model_device, pyplot, save_figure, write_json


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
