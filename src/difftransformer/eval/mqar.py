"""Multi-query associative recall (Zoology, Arora et al. 2023) on raw vocabulary ids.

Sequences come from :mod:`difftransformer.data.mqar` (the generator training mixes in): ``num_pairs`` key-value
pairs, then the queried keys among filler. The model must predict each queried key's value at the position right
after the key; we read the argmax over the whole vocabulary (one forward per sequence). Accuracy = share of
queries answered exactly.

One run scores every pair count at one sequence length each (the shortest that holds it, by default) or, with
``lengths``, a grid of sequence lengths by pair counts, Zoology's accuracy against sequence length: every cell
whose length holds its pairs and queries is scored, every other one is listed as skipped. Where the model looks
when it recalls (its attention allocation) is read at every length, at the smallest pair count that length holds.

The task is tokenizer-independent: keys and values are token ids drawn directly from the model's vocabulary, keys
from the lower half of [first_id, vocab_size) and values from the upper half, so a key never doubles as a value.
``first_id`` (default 256, or a quarter of a smaller vocabulary) skips the special and byte-level ids at the
bottom of most vocabularies; ids the tokenizer marks special are excluded when a tokenizer is given. A pretrained
LM sees gibberish tokens, which is the point: only in-context recall can solve it.
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

from difftransformer.data.mqar import MqarBatch, MqarSettings, make_mqar_batch
from difftransformer.errors import UsageError
from difftransformer.eval import chance, paper
from difftransformer.eval.common import check_context_length, max_context, model_device, save_results
from difftransformer.eval.maps import allocation, attention_maps
from difftransformer.eval.options import MOST, at_least, at_most, counts, distinct, not_empty, option, seeded
from difftransformer.eval.recall import key_vocabulary, recall_accuracy
from difftransformer.eval.task import UNIT, Chart, Column, Measure, Panel, SuiteContext, Task, interval_at
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import bootstrap_interval, mean, mean_interval, wilson_interval


@torch.no_grad()
def mqar_allocation(model: nn.Module, batch: MqarBatch) -> dict[str, list[float]]:
    """Attention allocation at recall, as the ``attention`` task reads it for needles: from each query key's
    position, the share of attention on its pair in the key-value block ("answer") and on the rest of what
    precedes the query ("context"), averaged over heads and layers; one value per query of ``batch``."""
    maps = attention_maps(model, torch.from_numpy(batch.input_ids).to(model_device(model)))
    shares: dict[str, list[float]] = {"answer": [], "context": []}
    for row, (queries, pairs) in enumerate(zip(batch.query_positions, batch.pair_positions)):
        row_maps = [layer[row : row + 1] for layer in maps]
        for query, pair in zip(queries.tolist(), pairs.tolist()):
            layers = allocation(row_maps, slice(query, query + 1), (pair, pair + 2), query)
            for key in shares:
                shares[key].append(float(layers[key].mean()))
    return shares


@dataclass(frozen=True)
class MqarOptions:
    """mqar's settings (``difftransformer eval mqar`` flags, the fields of :func:`run_mqar`'s options)."""

    num_pairs: list[int] = option([4, 8, 16, 32, 64], "key-value pairs per sequence, one setting each")
    num_queries: int | None = option(None, "queries per sequence (unset: every key, capped at the pairs)")
    lengths: list[int] | None = option(None, "sequence lengths in tokens: every pair count is scored at every "
                                       "length that holds its pairs and queries, queries spread over the filler "
                                       "(unset: each pair count at the shortest length that holds it, 4 tokens "
                                       "a pair)")  # fmt: skip
    sequences: int = option(64, "sequences per setting")
    batch_size: int = option(16, "sequences per forward pass")
    first_id: int | None = option(None, "lowest vocabulary id for keys and values (unset: 256, or a quarter of "
                                  "a smaller vocabulary)")  # fmt: skip
    seed: int = option(0, "seed of the draws")
    allocation: int = option(16, "sequences whose attention is read, at every length at the smallest pair count "
                             "it holds, --batch-size at a time: the share on the queried pair and on the rest of "
                             "the context (0 skips it)")  # fmt: skip

    def __post_init__(self) -> None:
        not_empty(self, "num_pairs", "lengths")
        counts(self, "num_pairs", "num_queries", "sequences", "batch_size", "lengths")
        at_least(self, 1, "first_id")
        at_least(self, 0, "allocation")
        at_most(self, MOST, "allocation")
        distinct(self, "num_pairs", "lengths")
        seeded(self)
        if not self.cells()[0]:
            raise UsageError(
                f"no length of `lengths` {self.lengths} holds any of `num_pairs` {self.num_pairs} with its "
                f"queries (4 tokens a pair when every key is queried)"
            )

    def queries(self, pairs: int) -> int:
        """Queries of a sequence of ``pairs`` key-value pairs."""
        return pairs if self.num_queries is None else min(self.num_queries, pairs)

    def cells(self) -> tuple[list[MqarSettings], list[dict]]:
        """(the settings scored, the cells skipped): every pair count at its shortest length, or with
        :attr:`lengths` every (length, pair count) whose length holds the pairs and their queries, length by
        length; each skipped cell says why."""
        if self.lengths is None:
            return [MqarSettings(n, self.queries(n)) for n in self.num_pairs], []
        scored, skipped = [], []
        for length in self.lengths:
            for n in self.num_pairs:
                need = MqarSettings(n, self.queries(n)).tokens
                if need <= length:
                    scored.append(MqarSettings(n, self.queries(n), length))
                else:
                    reason = f"{n} pairs and {self.queries(n)} queries need {need} tokens"
                    skipped.append(dict(tokens=length, num_pairs=n, reason=reason))
        return scored, skipped


def run_mqar(
    model: nn.Module, tokenizer: Any, options: MqarOptions, *, output_dir=None, progress: bool = True
) -> dict:
    """MQAR accuracy for every setting of ``options`` (:meth:`MqarOptions.cells`) and, unless
    ``options.allocation`` is 0, the attention allocation at every length. Every length and pair count is checked
    against the model before any scoring. Writes mqar.json and mqar.png with ``output_dir``.

    Returns ``rows`` (per setting scored: ``num_pairs``, ``num_queries``, ``tokens``, ``accuracy``), ``skipped``
    (the cells of a grid whose length cannot hold their pairs, with the reason) and ``allocation`` (per length:
    ``tokens``, ``num_pairs``, ``answer``, ``context``, and each sequence's shares under ``answer_by_sequence`` and
    ``context_by_sequence``, for their sampling intervals; with one length per pair count, the smallest count's)."""
    vocabulary = key_vocabulary(
        int(model.config.vocab_size), tokenizer, options.first_id, max(options.num_pairs)
    )
    cells, skipped = options.cells()
    for cell in cells:
        what = (
            "`lengths`" if options.lengths is not None else f"`num_pairs` {cell.num_pairs} with its queries"
        )
        check_context_length(model, cell.tokens, what)
    rows = []
    for cell in tqdm(cells, desc="mqar", unit="setting", disable=not progress):
        # Each cell draws from its own generator: its sequences do not depend on which other cells are scored.
        rng = np.random.default_rng([options.seed, cell.tokens, cell.num_pairs])
        accuracy = recall_accuracy(model, vocabulary, cell, options.sequences, options.batch_size, rng)
        rows.append(
            dict(num_pairs=cell.num_pairs, num_queries=cell.queries, tokens=cell.tokens, accuracy=accuracy)
        )
    shares = []
    for cell in allocation_cells(cells, options.lengths is None) if options.allocation else []:
        rng = np.random.default_rng([options.seed, 1, cell.tokens, cell.num_pairs])
        read: dict[str, list[float]] = {"answer": [], "context": []}
        for start in range(0, options.allocation, options.batch_size):
            size = min(options.batch_size, options.allocation - start)
            for key, values in mqar_allocation(model, make_mqar_batch(rng, size, cell, vocabulary)).items():
                read[key] += values
        # Every sequence asks cell.queries keys: the mean of its queries is the unit a bootstrap resamples.
        by_sequence = {
            f"{key}_by_sequence": [
                mean(values[i : i + cell.queries]) for i in range(0, len(values), cell.queries)
            ]
            for key, values in read.items()
        }
        shares.append(
            dict(
                tokens=cell.tokens,
                num_pairs=cell.num_pairs,
                **{k: mean(v) for k, v in read.items()},
                **by_sequence,
            )
        )
    results = dict(
        task="mqar", sequences=options.sequences, seed=options.seed, lengths=options.lengths,
        num_queries=options.num_queries, rows=rows, skipped=skipped, allocation=shares,
    )  # fmt: skip
    return save_results(results, output_dir, lambda path: plot_mqar(results, path))


def allocation_cells(cells: list[MqarSettings], per_pair_count: bool) -> list[MqarSettings]:
    """Where attention is read: the smallest pair count's setting when every pair count has its own length, else
    at every length the smallest pair count it holds."""
    if per_pair_count:
        return [min(cells, key=lambda cell: cell.num_pairs)]
    smallest: dict[int, MqarSettings] = {}
    for cell in cells:
        if cell.tokens not in smallest or cell.num_pairs < smallest[cell.tokens].num_pairs:
            smallest[cell.tokens] = cell
    return list(smallest.values())


def plot_mqar(results: dict, path) -> None:
    """Accuracy against pair counts (one length per pair count), or against sequence length (one line per pair
    count) beside the attention allocation against sequence length (a grid)."""
    plt = pyplot()
    rows = results["rows"]
    if results.get("lengths") is None:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r["num_pairs"] for r in rows], [r["accuracy"] for r in rows], marker="o")
        ax.set_xscale("log", base=2)
        ax.set(
            ylim=UNIT,
            xlabel="key-value pairs",
            ylabel="recall accuracy",
            title="multi-query associative recall",
        )
        ax.grid(alpha=0.3)
        save_figure(fig, path)
        return
    panels = 2 if results["allocation"] else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 3.8), squeeze=False)
    ax = axes[0][0]
    for pairs in sorted({r["num_pairs"] for r in rows}):
        cells = [r for r in rows if r["num_pairs"] == pairs]
        ax.plot(
            [r["tokens"] for r in cells], [r["accuracy"] for r in cells], marker="o", label=f"{pairs} pairs"
        )
    ax.set(
        ylim=UNIT,
        xlabel="sequence length (tokens)",
        ylabel="recall accuracy",
        title="MQAR accuracy by length",
    )
    if panels == 2:
        shares = results["allocation"]
        ax2 = axes[0][1]
        tokens = [e["tokens"] for e in shares]
        ax2.plot(tokens, [e["answer"] for e in shares], marker="o", label="queried pair")
        ax2.plot(tokens, [e["context"] for e in shares], marker="s", label="rest of the context")
        ax2.set(xlabel="sequence length (tokens)", ylabel="share of attention",
                title=f"attention at recall ({min(e['num_pairs'] for e in shares)}+ pairs)")  # fmt: skip
    for axis in axes[0]:
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    save_figure(fig, path)


def fitting_pairs(context_length: int, most: int) -> list[int]:
    """Powers of two from 4 up to ``most`` whose MQAR sequence (every key queried: 4 tokens a pair) fits."""
    pairs, n = [], 4
    while n <= most and 4 * n <= context_length:
        pairs.append(n)
        n *= 2
    return pairs


def _at(length: str, pairs: str) -> str:
    """The column of one grid cell."""
    return f"{length} tokens, {pairs} pairs"


def current_summary(summary: dict) -> dict:
    """``summary`` in today's form: summaries written before the attention allocation was read held only
    pairs -> accuracy."""
    if "accuracy" in summary or "by_length" in summary:
        return summary
    return dict(accuracy=dict(summary), answer_share=None, context_share=None)


class MqarTask(Task):
    """Multi-query associative recall on raw vocabulary ids."""

    name = "mqar"
    title = "Multi-query associative recall (mqar)"
    help = "multi-query associative recall: in-context key-value recall on raw vocabulary ids"
    reads_text = False
    needs_tokenizer = False
    Options = MqarOptions
    # In a comparison: every power of two from 4 pairs up to the largest of num_pairs whose sequence fits, or, with
    # lengths among the light settings, that grid of lengths by pair counts.
    light = MqarOptions(sequences=64)

    def fit(
        self, options: MqarOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
    ) -> MqarOptions:
        limit = max_context(model)
        if "num_pairs" in given or options.lengths is not None or limit is None:
            return options
        pairs = [n for n in options.num_pairs if MqarSettings(n, options.queries(n)).tokens <= limit]
        return dataclasses.replace(options, num_pairs=pairs) if pairs else options

    def light_options(self, light: MqarOptions, suite: SuiteContext) -> MqarOptions:
        if light.lengths is not None:
            longest = max(light.lengths)
            if suite.max_positions is not None and longest > suite.max_positions:
                raise UsageError(
                    f"mqar: `lengths` {light.lengths} reach {longest} tokens, beyond the models' "
                    f"max_position_embeddings = {suite.max_positions}"
                )
            options = dataclasses.replace(light, seed=suite.seed)
        else:
            pairs = fitting_pairs(suite.context_length, max(light.num_pairs))
            if not pairs:
                raise UsageError(
                    f"mqar needs a context of at least 16 tokens; got `context_length` {suite.context_length}"
                )
            options = dataclasses.replace(light, num_pairs=pairs, seed=suite.seed)
        # The models' vocabulary is the tokenizer's: a pair count it cannot hold is refused before any training.
        key_vocabulary(len(suite.tokenizer), suite.tokenizer, options.first_id, max(options.num_pairs))
        return options

    def run(self, model, tokenizer, texts, options: MqarOptions, output_dir: Path, progress: bool) -> dict:
        return run_mqar(model, tokenizer, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        """One length per pair count: ``accuracy`` (pairs -> accuracy) and the smallest count's
        ``answer_share`` and ``context_share``. A grid: ``by_length`` (length -> pairs -> accuracy, the cells
        scored) and ``allocation`` (length -> ``num_pairs``, ``answer``, ``context``). ``intervals``: Wilson
        intervals of the accuracies over their queries (every sequence asks the same number), bootstrap intervals
        over sequences of the shares, under the same keys."""
        shares = results.get("allocation") or []

        def accuracy_interval(row: dict) -> list[float]:
            trials = results["sequences"] * row["num_queries"]
            return list(wilson_interval(round(row["accuracy"] * trials), trials))

        def share_intervals(entry: dict) -> dict:
            found = {
                key: bootstrap_interval(entry.get(f"{key}_by_sequence", [])) for key in ("answer", "context")
            }
            return {key: list(interval) for key, interval in found.items() if interval is not None}

        if results.get("lengths") is None:
            first = shares[0] if shares else {}
            intervals = dict(accuracy={str(r["num_pairs"]): accuracy_interval(r) for r in results["rows"]})
            intervals.update({f"{key}_share": value for key, value in share_intervals(first).items()})
            return dict(
                accuracy={str(r["num_pairs"]): r["accuracy"] for r in results["rows"]},
                answer_share=first.get("answer"),
                context_share=first.get("context"),
                intervals=intervals,
            )
        by_length: dict[str, dict[str, float]] = {}
        accuracy_intervals: dict[str, dict[str, list[float]]] = {}
        for row in results["rows"]:
            by_length.setdefault(str(row["tokens"]), {})[str(row["num_pairs"])] = row["accuracy"]
            accuracy_intervals.setdefault(str(row["tokens"]), {})[str(row["num_pairs"])] = accuracy_interval(
                row
            )
        allocation = {
            str(e["tokens"]): dict(num_pairs=e["num_pairs"], answer=e["answer"], context=e["context"])
            for e in shares
        }
        intervals = dict(
            by_length=accuracy_intervals, allocation={str(e["tokens"]): share_intervals(e) for e in shares}
        )
        return dict(by_length=by_length, allocation=allocation, intervals=intervals)

    def columns(self, summary: dict) -> list[Column]:
        summary = current_summary(summary)
        if "by_length" in summary:
            columns = [
                Column(_at(length, pairs), accuracy, 2)
                for length, cells in summary["by_length"].items()
                for pairs, accuracy in cells.items()
            ]
            for length, shares in summary["allocation"].items():
                columns += [Column(f"{length} tokens, on the pair", shares["answer"], 3),
                            Column(f"{length} tokens, on the rest", shares["context"], 3)]  # fmt: skip
            return columns
        columns = [Column(f"{pairs} pairs", accuracy, 2) for pairs, accuracy in summary["accuracy"].items()]
        if summary["answer_share"] is not None:
            columns += [Column("attention on the pair", summary["answer_share"], 3),
                        Column("attention on the rest", summary["context_share"], 3)]  # fmt: skip
        return columns

    def describe(self, options: dict) -> str:
        if options.get("lengths") is not None:
            text = (
                f"Share of queried keys whose value is the model's argmax, {options['sequences']} sequences of random "
                f"vocabulary ids per cell of sequence lengths {options['lengths']} by key-value pairs "
                f"{options['num_pairs']}; a cell whose length cannot hold its pairs and queries (4 tokens a pair) is "
                "left out. Higher is better."
            )
            fewest = "the fewest pairs each length holds"
        else:
            text = (
                f"Share of queried keys whose value is the model's argmax, {options['sequences']} sequences of "
                "random vocabulary ids per number of key-value pairs. Higher is better."
            )
            fewest = "the fewest pairs"
        if options.get("allocation"):
            text += (
                f" Attention from each query to its pair and to the rest of the context before it "
                f"({options['allocation']} sequences of {fewest}, mean over heads and layers; a DIFF map "
                "counted with its sign, as shares of its absolute mass)."
            )
        return text

    def chart(self, summary: dict) -> Chart:
        summary = current_summary(summary)
        if "by_length" in summary:
            return self._length_chart(summary)
        pairs = list(summary["accuracy"])
        return Chart("lines", "multi-query associative recall",
                     [Panel("recall accuracy", [f"{n} pairs" for n in pairs], UNIT)], xlabel="key-value pairs",
                     xticks=pairs)  # fmt: skip

    @staticmethod
    def _length_chart(summary: dict) -> Chart:
        """Accuracy against sequence length, one panel per pair count, and the attention allocation against it."""
        lengths = list(summary["by_length"])
        counts = sorted({int(p) for cells in summary["by_length"].values() for p in cells})
        panels = []
        for pairs in map(str, counts):
            held = [length for length in lengths if pairs in summary["by_length"][length]]
            panels.append(Panel(f"recall accuracy, {pairs} pairs", [_at(length, pairs) for length in held], UNIT,
                                xticks=held))  # fmt: skip
        read = list(summary["allocation"])
        if read:
            panels += [
                Panel("attention on the queried pair", [f"{length} tokens, on the pair" for length in read],
                      xticks=read),
                Panel("attention on the rest of the context", [f"{length} tokens, on the rest" for length in read],
                      xticks=read),
            ]  # fmt: skip
        return Chart("lines", "multi-query associative recall against sequence length", panels,
                     xlabel="sequence length (tokens)")  # fmt: skip

    def measures(self, summary: dict) -> list[Measure]:
        if current_summary(summary) is summary:
            return self._measures(summary)
        # An older summary: every measure reads it in today's form.
        return [
            measure._replace(
                value=lambda s, f=measure.value: f(current_summary(s)),
                at_chance=measure.at_chance and (lambda s, f=measure.at_chance: f(current_summary(s))),
                interval=measure.interval and (lambda s, f=measure.interval: f(current_summary(s))),
            )
            for measure in self._measures(current_summary(summary))
        ]

    def _measures(self, summary: dict) -> list[Measure]:
        if "by_length" in summary:
            return self._length_measures(summary)

        def accuracy(pairs: str):
            return lambda s: s["accuracy"].get(pairs)

        def accuracy_interval(pairs: str):
            return lambda s: interval_at(s, "accuracy", pairs)

        def averaged_interval(s: dict):
            cells = list(s["accuracy"])
            return mean_interval(
                [s["accuracy"][p] for p in cells], [interval_at(s, "accuracy", p) for p in cells]
            )

        def at_chance(pairs: str):
            return lambda s: chance.exact_at_chance(s["accuracy"].get(pairs))

        def recalls_nothing(s: dict) -> bool:
            return mean(list(s["accuracy"].values())) <= chance.EXACT_MARGIN

        measures = [
            Measure(f"MQAR accuracy, {pairs} key-value pairs", accuracy(pairs), True, 2, paper.RETRIEVAL,
                    at_chance=at_chance(pairs), chance=chance.MQAR, interval=accuracy_interval(pairs))
            for pairs in summary["accuracy"]
        ]  # fmt: skip
        measures.append(
            Measure("MQAR accuracy averaged over pair counts", lambda s: mean(list(s["accuracy"].values())),
                    True, 2, at_chance=recalls_nothing, chance=chance.MQAR, interval=averaged_interval)
        )  # fmt: skip
        if summary["answer_share"] is not None:
            # Where neither model recalls, where it looks says nothing about retrieval.
            measures += [
                Measure("attention on the queried pair (MQAR)", lambda s: s["answer_share"], True, 3,
                        paper.ANSWER_SHARE, at_chance=recalls_nothing, chance=chance.NO_RECALL,
                        interval=lambda s: interval_at(s, "answer_share")),
                Measure("attention on the rest of the context (MQAR)", lambda s: s["context_share"], False, 3,
                        paper.CONTEXT_SHARE, at_chance=recalls_nothing, chance=chance.NO_RECALL,
                        interval=lambda s: interval_at(s, "context_share")),
            ]  # fmt: skip
        return measures

    @staticmethod
    def _length_measures(summary: dict) -> list[Measure]:
        """Per length: the accuracy averaged over the pair counts it holds and the allocation (claims rows), then
        every cell's accuracy (verdict sentences)."""

        def averaged(length: str):
            return lambda s: mean(list(s["by_length"][length].values())) if length in s["by_length"] else None

        def averaged_interval(length: str):
            def interval(s: dict):
                cells = s["by_length"].get(length, {})
                found = [interval_at(s, "by_length", length, pairs) for pairs in cells]
                return mean_interval(list(cells.values()), found)

            return interval

        def recalls_nothing(length: str):
            return lambda s: (
                length in s["by_length"]
                and mean(list(s["by_length"][length].values())) <= chance.EXACT_MARGIN
            )

        def share(length: str, key: str):
            return lambda s: s["allocation"][length][key] if length in s["allocation"] else None

        def cell(length: str, pairs: str):
            return lambda s: s["by_length"].get(length, {}).get(pairs)

        def cell_at_chance(length: str, pairs: str):
            return lambda s: chance.exact_at_chance(cell(length, pairs)(s))

        measures = []
        for length, cells in summary["by_length"].items():
            pairs = list(cells)
            held = pairs[0] if len(pairs) == 1 else f"{pairs[0]}-{pairs[-1]}"
            measures.append(
                Measure(f"MQAR accuracy at {length} tokens ({held} key-value pairs, averaged)", averaged(length),
                        True, 2, paper.RETRIEVAL, at_chance=recalls_nothing(length), chance=chance.MQAR,
                        interval=averaged_interval(length))
            )  # fmt: skip
            if length in summary["allocation"]:
                fewest = summary["allocation"][length]["num_pairs"]
                measures += [
                    Measure(f"attention on the queried pair (MQAR, {length} tokens, {fewest} pairs)",
                            share(length, "answer"), True, 3, paper.ANSWER_SHARE, at_chance=recalls_nothing(length),
                            chance=chance.NO_RECALL, interval=lambda s, n=length: interval_at(s, "allocation", n,
                                                                                               "answer")),
                    Measure(f"attention on the rest of the context (MQAR, {length} tokens, {fewest} pairs)",
                            share(length, "context"), False, 3, paper.CONTEXT_SHARE,
                            at_chance=recalls_nothing(length), chance=chance.NO_RECALL,
                            interval=lambda s, n=length: interval_at(s, "allocation", n, "context")),
                ]  # fmt: skip
        for length, cells in summary["by_length"].items():
            measures += [
                Measure(f"MQAR accuracy, {pairs} key-value pairs at {length} tokens", cell(length, pairs), True, 2,
                        at_chance=cell_at_chance(length, pairs), chance=chance.MQAR,
                        interval=lambda s, n=length, p=pairs: interval_at(s, "by_length", n, p))
                for pairs in cells
            ]  # fmt: skip
        return measures


TASK = MqarTask()
