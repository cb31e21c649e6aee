"""Real low-bit quantizers (paper §3.8's outlook, deployment's practice): held-out loss and MQAR accuracy of a model
whose KV cache or weights are quantized the way models are deployed, against the same model in full precision.

- KV cache: transformers' ``QuantizedCache``. ``fp8`` stores keys and values as float8 e4m3 with one scale per
  layer tensor, set by the prompt and frozen; ``hqq-8`` and ``hqq-4`` store them as 8- or 4-bit integers in groups
  of ``q_group_size`` with HQQ's scales and zero points (needs hqq). Each window's prompt is written to the cache
  by one forward pass, then the window's last ``continuation`` tokens are predicted by a second pass that reads
  the prompt back from the cache: as a model decodes after a prompt, with its newest tokens in the cache's
  full-precision residual window (hqq) or quantized with the prompt's scale (fp8).
- Weights: the schemes of ``difftransformer quantize`` (:mod:`difftransformer.convert.quantize`), applied in memory
  with the numerics of the folder it writes: ``int8`` and ``int4`` weight-only (torchao), ``w8a8`` int8 weights and
  per-token int8 inputs (compressed-tensors). The modules a kind keeps in full precision and the output head stay.

Each quantizer's *degradation* is its loss (or accuracy) minus full precision's, paired on the same windows and
MQAR sequences, with a 95% t interval over them: the low-bit verdict judges how much a model loses, not where it
started. Beside each, the outlier ratio (top-1 / median of |x|) at that quantizer's input, in full precision: the
keys and values the cache stores, or the inputs of the linear layers the weight schemes convert.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import DynamicCache, QuantizedCache

from difftransformer.data.mqar import MqarSettings, make_mqar_batch
from difftransformer.errors import UsageError
from difftransformer.eval import chance, paper
from difftransformer.eval.common import (
    check_context_length,
    fit_length,
    held_out_windows,
    model_device,
    save_results,
    token_stream,
)
from difftransformer.eval.magnitudes import RunningStats
from difftransformer.eval.options import MOST, at_least, at_most, counts, distinct, option
from difftransformer.eval.recall import key_vocabulary
from difftransformer.eval.task import Chart, Column, Measure, Panel, SuiteContext, Task, interval_at
from difftransformer.models.quantization import (
    EXTRA,
    SCHEMES,
    model_full_precision_modules,
    quantize_weights,
    quantized_linears,
    tiling_problem,
)
from difftransformer.plotting import pyplot, save_figure
from difftransformer.stats import mean, paired_interval


@dataclass(frozen=True)
class CacheQuantizer:
    """One of transformers' quantized KV caches: its backend, bits (None: the backend's own) and package."""

    backend: str
    bits: int | None
    package: str | None  # the import name of what it needs beyond transformers

    def cache(self, model: nn.Module, group_size: int) -> QuantizedCache:
        if self.bits is None:
            return QuantizedCache(backend=self.backend, config=model.config)
        return QuantizedCache(
            self.backend,
            model.config,
            nbits=self.bits,
            q_group_size=group_size,
            residual_length=RESIDUAL_LENGTH,
        )


KV_CACHES = {
    "fp8": CacheQuantizer("fp8", None, None),
    "hqq-8": CacheQuantizer("hqq", 8, "hqq"),
    "hqq-4": CacheQuantizer("hqq", 4, "hqq"),
    "hqq-3": CacheQuantizer("hqq", 3, "hqq"),
    "hqq-2": CacheQuantizer("hqq", 2, "hqq"),
}
# The loss increase a quantizer may cost for its width to count as held (the study's floor: the fewest bits held)
HELD_NATS = 0.05
MQAR_SEQUENCES = 64  # MQAR sequences scored by every quantizer
# transformers' QuantizedLayer keeps up to this many newest tokens in full precision (its default residual_length):
# one pass over a shorter continuation is decoding it token by token
RESIDUAL_LENGTH = 128


def _installed(package: str | None) -> bool:
    return package is None or importlib.util.find_spec(package) is not None


def available_quantizers() -> tuple[list[str], list[str]]:
    """The KV caches and weight schemes whose packages this environment has (compare's light set)."""
    caches = [name for name, cache in KV_CACHES.items() if _installed(cache.package)]
    return caches, [name for name, scheme in SCHEMES.items() if _installed(scheme.package)]


@dataclass(frozen=True)
class LowbitOptions:
    """lowbit's settings (``difftransformer eval lowbit`` flags)."""

    length: int = option(512, "held-out window length in tokens")
    num_sequences: int = option(
        16, "held-out windows (each quantizer's degradation is paired over them; its interval needs two)"
    )
    continuation: int = option(
        64, "tokens at each window's end predicted while the rest is read from the cache"
    )
    kv_caches: list[str] | None = option(None, f"quantized KV caches among {', '.join(KV_CACHES)}, or none (unset: "
                                         "each one whose package is installed; hqq needs hqq)")  # fmt: skip
    weights: list[str] | None = option(None, f"weight schemes among {', '.join(SCHEMES)}, or none (unset: each "
                                       "one whose package is installed)")  # fmt: skip
    q_group_size: int | None = option(None, "values per scale and zero point of the hqq caches; it must divide one "
                                      "token's keys and values of a layer (unset: the largest of 64, 32, 16, 8, 4, 2, "
                                      "1 that does)")  # fmt: skip
    mqar_pairs: int = option(0, f"key-value pairs of an MQAR check, {MQAR_SEQUENCES} sequences (0 skips it)")
    seed: int = option(0, "MQAR draws")

    def __post_init__(self) -> None:
        counts(self, "length", "num_sequences", "continuation", "q_group_size")
        at_most(self, MOST, "num_sequences")
        at_least(self, 0, "mqar_pairs")
        at_most(self, MOST, "mqar_pairs")
        for field in ("kv_caches", "weights"):
            if getattr(self, field) == ["none"]:
                object.__setattr__(self, field, [])
        distinct(self, "kv_caches", "weights")
        if self.continuation >= self.length - 1:
            raise UsageError(
                f"`continuation` must leave a prompt in the window: at most `length` - 2 = {self.length - 2}; got "
                f"{self.continuation}"
            )
        for field, known in (("kv_caches", KV_CACHES), ("weights", SCHEMES)):
            unknown = [name for name in getattr(self, field) or [] if name not in known]
            if unknown:
                raise UsageError(f"`{field}` must be among {', '.join(known)}; got {', '.join(unknown)}")
        if self.kv_caches == [] and self.weights == []:
            raise UsageError("`kv_caches` and `weights` are both none: name at least one quantizer")

    def resolved(self) -> LowbitOptions:
        """These options with each unset list of quantizers made the installed ones (:func:`available_quantizers`);
        UsageError naming the extra, before any work, where a quantizer asked for by name lacks its package."""
        caches, schemes = available_quantizers()
        options = dataclasses.replace(
            self, kv_caches=caches if self.kv_caches is None else self.kv_caches,
            weights=schemes if self.weights is None else self.weights,
        )  # fmt: skip
        hqq = [name for name in options.kv_caches if KV_CACHES[name].backend == "hqq"]
        if hqq and options.continuation + 1 >= RESIDUAL_LENGTH:
            raise UsageError(
                f"`continuation` must be < {RESIDUAL_LENGTH - 1} with `kv_caches` {', '.join(hqq)}, whose newest "
                f"{RESIDUAL_LENGTH} tokens stay in full precision; got {options.continuation}"
            )
        wanted = [(f"kv_caches {name}", KV_CACHES[name].package) for name in options.kv_caches]
        wanted += [(f"weights {name}", SCHEMES[name].package) for name in options.weights]
        missing = [f"`{what}` needs {package}" for what, package in wanted if not _installed(package)]
        if missing:
            raise UsageError(f"{'; '.join(missing)}, which is not installed: {EXTRA}")
        if not options.kv_caches and not options.weights:
            raise UsageError(
                f"no quantizer to run: `kv_caches` {options.kv_caches}, `weights` {options.weights}"
            )
        return options


@torch.no_grad()
def cached_widths(model: nn.Module, token: torch.Tensor) -> set[int]:
    """The numbers of values one token's keys, and its values, take in each layer's cache (every KV head)."""
    cache = DynamicCache(config=model.config)
    model(input_ids=token.view(1, 1).to(model_device(model)), past_key_values=cache, use_cache=True)
    return {
        tensor.shape[1] * tensor.shape[-1] for layer in cache.layers for tensor in (layer.keys, layer.values)
    }


def hqq_group_size(options: LowbitOptions, widths: set[int]) -> int:
    """``options.q_group_size``, or where unset the largest power of two up to 64 dividing every one of ``widths``;
    a UsageError for a given size that does not divide them (HQQ groups a cache tensor's values in order, so a
    group must tile each token's)."""
    if options.q_group_size is None:
        return next(size for size in (64, 32, 16, 8, 4, 2, 1) if all(width % size == 0 for width in widths))
    if any(width % options.q_group_size for width in widths):
        raise UsageError(
            f"`q_group_size` must divide the values one token takes in each layer's cache, {sorted(widths)}; got "
            f"{options.q_group_size}"
        )
    return options.q_group_size


def windowed_layers(model: nn.Module) -> list[int]:
    """The layers transformers' QuantizedCache cannot hold: those whose layer type is not full attention."""
    types = getattr(model.config.get_text_config(decoder=True), "layer_types", None) or []
    return [index for index, kind in enumerate(types) if kind != "full_attention"]


Cache = Callable[[], Any]


@torch.no_grad()
def _continuation_nll(
    model: nn.Module, windows: torch.Tensor, continuation: int, new_cache: Cache
) -> list[float]:
    """Each window's mean NLL of its last ``continuation`` tokens, predicted by a forward pass over them (and the
    token before) that reads the rest of the window from a cache the prompt was written to."""
    device, split = model_device(model), windows.shape[1] - continuation - 1
    losses = []
    for window in windows:
        ids = window[None].to(device)
        cache = new_cache()
        model(input_ids=ids[:, :split], past_key_values=cache, use_cache=True)
        logits = model(input_ids=ids[:, split:], past_key_values=cache, use_cache=True).logits[0, :-1].float()
        losses.append(float(nn.functional.cross_entropy(logits, ids[0, split + 1 :])))
    return losses


@torch.no_grad()
def _mqar_accuracies(model: nn.Module, batch, pairs: int, new_cache: Cache) -> list[float]:
    """Each MQAR sequence's share of queries answered, the key-value block written to the cache first."""
    device, block = model_device(model), 2 * pairs
    accuracies = []
    for ids, positions, targets in zip(batch.input_ids, batch.query_positions, batch.targets):
        ids = torch.from_numpy(ids)[None].to(device)
        cache = new_cache()
        model(input_ids=ids[:, :block], past_key_values=cache, use_cache=True)
        logits = model(input_ids=ids[:, block:], past_key_values=cache, use_cache=True).logits[0]
        predicted = logits[torch.from_numpy(positions - block).to(device)].argmax(-1).cpu()
        accuracies.append(float((predicted == torch.from_numpy(targets)).float().mean()))
    return accuracies


@torch.no_grad()
def quantizer_inputs(model: nn.Module, windows: torch.Tensor, kept: tuple[str, ...]) -> dict:
    """The outlier ratios (top-1 / median of |x|) of what each quantizer reads, in full precision: the ``keys``
    and ``values`` the cache stores (every layer, every window) and the ``linear_inputs`` of the linear layers a
    weight scheme converts (every one but ``kept``)."""
    stats = {"keys": RunningStats(), "values": RunningStats(), "linear_inputs": RunningStats()}
    handles = [
        module.register_forward_pre_hook(lambda _, inputs: stats["linear_inputs"].update(inputs[0]))
        for _, module in quantized_linears(model, kept)
    ]
    try:
        for window in windows:
            cache = DynamicCache(config=model.config)
            model(input_ids=window[None].to(model_device(model)), past_key_values=cache, use_cache=True)
            for layer in cache.layers:
                stats["keys"].update(layer.keys)
                stats["values"].update(layer.values)
    finally:
        for handle in handles:
            handle.remove()
    return {name: s.top_k(1) / s.median() for name, s in stats.items() if s.count}


def _row(name: str, target: str, losses: list[float], accuracies: list[float] | None, full: dict) -> dict:
    """One quantizer's numbers and their degradation from ``full`` (the full-precision row), paired."""
    increase = [q - f for q, f in zip(losses, full["losses"])]
    row = dict(quantizer=name, target=target, loss=mean(losses), losses=losses, loss_increase=mean(increase),
               loss_increase_interval=paired_interval(increase))  # fmt: skip
    if accuracies is not None:
        change = [q - f for q, f in zip(accuracies, full["mqar_accuracies"])]
        row.update(mqar_accuracy=mean(accuracies), mqar_accuracies=accuracies, mqar_change=mean(change),
                   mqar_change_interval=paired_interval(change))  # fmt: skip
    return row


def run_lowbit(
    model: nn.Module, tokenizer: Any, token_ids: Sequence[int], options: LowbitOptions, *, output_dir=None,
    progress: bool = True,
) -> dict:  # fmt: skip
    """Full precision, then each of ``options``' KV caches and weight schemes, on the same held-out windows of
    ``token_ids`` (and MQAR sequences, with ``options.mqar_pairs``); every request is checked before any work.

    A quantizer the model's shapes cannot take is recorded as ``skipped`` with the reason: a KV cache on a model with
    sliding-window layers (transformers' QuantizedCache holds full attention only), a weight scheme whose groups do
    not tile a layer's inputs; every other refusal is a UsageError naming the option.
    """
    options = options.resolved()
    check_context_length(model, options.length, "`length`")
    kept = model_full_precision_modules(model)
    untileable = {
        name: problem for name in options.weights if (problem := tiling_problem(model, SCHEMES[name], kept))
    }
    windows = held_out_windows(token_ids, options.length, options.num_sequences)
    group_size = hqq_group_size(options, cached_widths(model, windows[0, 0]))
    batch = None
    if options.mqar_pairs:
        settings = MqarSettings(options.mqar_pairs)
        check_context_length(model, settings.tokens, f"`mqar_pairs` {options.mqar_pairs} with its queries")
        vocabulary = key_vocabulary(int(model.config.vocab_size), tokenizer, None, options.mqar_pairs,
                                    pairs_field="mqar_pairs")  # fmt: skip
        batch = make_mqar_batch(np.random.default_rng([options.seed, options.mqar_pairs]), MQAR_SEQUENCES, settings,
                                vocabulary)  # fmt: skip
    was_training = model.training
    model.eval()
    full_cache = lambda: DynamicCache(config=model.config)  # noqa: E731

    def measure(quantized: nn.Module, new_cache: Cache) -> tuple[list[float], list[float] | None]:
        losses = _continuation_nll(quantized, windows, options.continuation, new_cache)
        accuracies = (
            None if batch is None else _mqar_accuracies(quantized, batch, options.mqar_pairs, new_cache)
        )
        return losses, accuracies

    windowed = windowed_layers(model)
    steps = tqdm(total=1 + len(options.kv_caches) + len(options.weights), desc="lowbit", unit="quantizer",
                 disable=not progress)  # fmt: skip
    losses, accuracies = measure(model, full_cache)
    full = dict(quantizer="full", target="none", loss=mean(losses), losses=losses)
    if accuracies is not None:
        full.update(mqar_accuracy=mean(accuracies), mqar_accuracies=accuracies)
    rows = [full]
    steps.update()
    for name in options.kv_caches:
        if windowed:
            rows.append(dict(quantizer=f"kv {name}", target="kv cache", skipped=(
                f"transformers' QuantizedCache holds full-attention layers only; layers {windowed} have sliding "
                "windows")))  # fmt: skip
        else:
            cache = KV_CACHES[name]
            new_cache = lambda c=cache: c.cache(model, group_size)  # noqa: E731
            rows.append(_row(f"kv {name}", "kv cache", *measure(model, new_cache), full))
        steps.update()
    for name in options.weights:
        target = "weights" if name != "w8a8" else "weights and inputs"
        if name in untileable:
            rows.append(dict(quantizer=f"weights {name}", target=target, skipped=untileable[name]))
            steps.update()
            continue
        quantized = copy.deepcopy(model)
        quantize_weights(quantized, SCHEMES[name])
        rows.append(_row(f"weights {name}", target, *measure(quantized, full_cache), full))
        del quantized
        steps.update()
    steps.close()
    inputs = quantizer_inputs(model, windows, kept)
    model.train(was_training)
    results = dict(
        task="lowbit", length=options.length, num_sequences=options.num_sequences, continuation=options.continuation,
        q_group_size=group_size, mqar_pairs=options.mqar_pairs, kv_caches=options.kv_caches,
        weights=options.weights, full_precision=list(kept),
        outliers=inputs, rows=rows,
    )  # fmt: skip
    return save_results(results, output_dir, lambda path: plot_lowbit(rows, path))


# Each family of quantizers a width is read from: its rows' names and their bits
FAMILIES = {
    "kv hqq": {f"kv {name}": cache.bits for name, cache in KV_CACHES.items() if cache.backend == "hqq"},
    "weights": {"weights int8": 8, "weights int4": 4},
}


def fewest_bits_held(rows: list[dict]) -> dict[str, int | None]:
    """Per family of :data:`FAMILIES`, the fewest bits among its measured rows whose loss rises by at most
    :data:`HELD_NATS`; None where none does or none was measured."""
    held = {}
    for family, widths in FAMILIES.items():
        bits = [widths[row["quantizer"]] for row in rows
                if row["quantizer"] in widths and row.get("loss_increase", HELD_NATS + 1) <= HELD_NATS]  # fmt: skip
        held[family] = min(bits, default=None)
    return held


def plot_lowbit(rows: list[dict], path) -> None:
    """Each quantizer's loss increase (and MQAR accuracy change) over full precision, with its 95% interval."""
    plt = pyplot()
    measured = [row for row in rows if "loss_increase" in row]
    panels = [("loss_increase", "held-out loss increase (nats)")]
    if measured and "mqar_change" in measured[0]:
        panels.append(("mqar_change", "MQAR accuracy change"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.5), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        names = [row["quantizer"] for row in measured]
        values = [row[key] for row in measured]
        bounds = [row[f"{key}_interval"] or (value, value) for row, value in zip(measured, values)]
        errors = [
            [v - low for v, (low, _) in zip(values, bounds)],
            [high - v for v, (_, high) in zip(values, bounds)],
        ]
        ax.barh(names, values, xerr=errors, capsize=3)
        ax.axvline(0, color="gray", lw=0.8)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle("quantized minus full precision, paired (95% t intervals)")
    save_figure(fig, path)


class LowbitTask(Task):
    """Real quantizers: held-out loss and MQAR accuracy with a quantized KV cache or quantized weights, as
    degradations from full precision, and the outlier ratios of what each quantizer reads."""

    name = "lowbit"
    title = "Real low-bit quantizers (lowbit)"
    help = "quantized KV caches and weights: loss and MQAR degradation from full precision"
    Options = LowbitOptions
    # In a comparison: the quantizers this environment has (resolved when compare plans, so its options record
    # them), 8 windows, MQAR with 4 pairs.
    light = LowbitOptions(num_sequences=8, mqar_pairs=4)

    def fit(
        self, options: LowbitOptions, model: nn.Module, tokenizer: Any, given: frozenset[str]
    ) -> LowbitOptions:
        fitted = fit_length(options, model, given)
        if "continuation" in given or fitted.continuation < fitted.length - 1:
            return fitted
        return dataclasses.replace(fitted, continuation=fitted.length // 4)

    def light_options(self, light: LowbitOptions, suite: SuiteContext) -> LowbitOptions:
        return dataclasses.replace(
            light, length=suite.context_length, num_sequences=suite.windows(light.num_sequences),
            continuation=min(light.continuation, suite.context_length // 4), seed=suite.seed,
        ).resolved()  # fmt: skip

    def run(self, model, tokenizer, texts, options: LowbitOptions, output_dir: Path, progress: bool) -> dict:
        options = options.resolved()  # before reading the text
        check_context_length(model, options.length, "`length`")
        ids = token_stream(tokenizer, texts, options.length * options.num_sequences)
        return run_lowbit(model, tokenizer, ids, options, output_dir=output_dir, progress=progress)

    def summarise(self, results: dict) -> dict:
        full, *quantized = results["rows"]
        keys = ("loss_increase", "mqar_change")
        return dict(
            full={key: full.get(key) for key in ("loss", "mqar_accuracy")},
            quantizers={
                row["quantizer"]: {"skipped": row["skipped"]} if "skipped" in row else dict(
                    loss=row["loss"], loss_increase=row["loss_increase"], mqar_accuracy=row.get("mqar_accuracy"),
                    mqar_change=row.get("mqar_change"),
                    intervals={key: list(row[f"{key}_interval"]) for key in keys if row.get(f"{key}_interval")},
                )
                for row in quantized
            },
            outliers=results["outliers"],
            fewest_bits=fewest_bits_held(quantized),
        )  # fmt: skip

    @staticmethod
    def _value(summary: dict, quantizer: str, key: str) -> float | None:
        return summary["quantizers"][quantizer].get(key)

    def columns(self, summary: dict) -> list[Column]:
        nan = float("nan")
        columns = [Column("loss full", summary["full"]["loss"], 3)]
        columns += [
            Column(f"loss +{q}", row.get("loss_increase", nan), 3) for q, row in summary["quantizers"].items()
        ]
        if summary["full"]["mqar_accuracy"] is not None:
            columns.append(Column("mqar full", summary["full"]["mqar_accuracy"], 2))
            columns += [Column(f"mqar Δ{q}", row.get("mqar_change", nan), 2)
                        for q, row in summary["quantizers"].items()]  # fmt: skip
        columns += [Column(f"{name} top-1/median", ratio, 1) for name, ratio in summary["outliers"].items()]
        for family, bits in summary.get("fewest_bits", {}).items():
            columns.append(Column(f"{family} fewest bits held", float("nan") if bits is None else bits, 0))
        return columns

    def describe(self, options: dict) -> str:
        mqar = (f" and MQAR accuracy ({options['mqar_pairs']} pairs, {MQAR_SEQUENCES} sequences, the pairs written "
                "to the cache first)" if options.get("mqar_pairs") else "")  # fmt: skip
        return (
            f"Held-out loss of the last {options['continuation']} tokens of {options['num_sequences']} windows of "
            f"{options['length']} tokens, the rest of each window read from the KV cache{mqar}, with the cache "
            f"quantized by transformers' QuantizedCache ({', '.join(options['kv_caches']) or 'none'}) or the linear "
            f"layers' weights by difftransformer quantize's schemes ({', '.join(options['weights']) or 'none'}). "
            "'loss +X' is X's loss minus full precision's and 'mqar ΔX' its accuracy change, paired on the same "
            "windows and sequences: lower loss increases and smaller accuracy drops are better. The top-1/median "
            "columns are the outlier ratios, in full precision, of what the quantizers read: keys, values, and the "
            f"inputs of the linear layers. 'fewest bits held' is the narrowest hqq cache, and weight scheme, whose "
            f"loss rises by at most {HELD_NATS} nats. A quantizer the model's shapes cannot take is skipped (no value)."
        )

    def chart(self, summary: dict) -> Chart:
        quantizers = [q for q, row in summary["quantizers"].items()]
        panels = [Panel("loss increase (nats)", [f"loss +{q}" for q in quantizers])]
        if summary["full"]["mqar_accuracy"] is not None:
            panels.append(Panel("MQAR accuracy change", [f"mqar Δ{q}" for q in quantizers]))
        return Chart("bars", "degradation under real quantizers", panels)

    def measures(self, summary: dict) -> list[Measure]:
        measures = []
        for q in summary["quantizers"]:
            measures.append(
                Measure(f"loss increase with {q}", lambda s, q=q: self._value(s, q, "loss_increase"), False, 3,
                        paper=paper.LOW_BIT, interval=lambda s, q=q: interval_at(s["quantizers"][q], "loss_increase"))
            )  # fmt: skip
        if summary["full"]["mqar_accuracy"] is not None:
            for q in summary["quantizers"]:
                measures.append(
                    Measure(f"MQAR accuracy change with {q}", lambda s, q=q: self._value(s, q, "mqar_change"), True,
                            2, paper=paper.LOW_BIT,
                            at_chance=lambda s: chance.exact_at_chance(s["full"]["mqar_accuracy"]),
                            chance=chance.MQAR, interval=lambda s, q=q: interval_at(s["quantizers"][q], "mqar_change"))
                )  # fmt: skip
        return measures


TASK = LowbitTask()
