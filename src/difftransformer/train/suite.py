"""The evaluation suite on one trained model, with light settings scaled to its preset (what ``compare`` runs).

Every task of ``difftransformer eval`` runs through its own ``run_*`` function: contexts of the preset's block
size, magic numbers of its needle digits, haystacks and held-out text from the test split, few samples. On the
tiny preset the whole suite took 16-18 s per model on two idle CPU cores; ``difftransformer eval TASK --model
RUN_FOLDER`` runs one task with its full settings. Each task writes its JSON and plots to
OUTPUT_DIR/TASK/; :func:`run_suite` returns the numbers a reader compares between variants.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from difftransformer.eval.cli import TASKS
from difftransformer.eval.common import token_stream
from difftransformer.train.presets import Preset


def parse_tasks(text: str) -> tuple[str, ...]:
    """'mqar,needle' -> ('needle', 'mqar'): distinct task names, returned in the suite's order."""
    tasks = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks or len(set(tasks)) != len(tasks):
        problem = f"unknown {', '.join(unknown)}" if unknown else "empty or repeated names"
        raise ValueError(
            f"--tasks must be distinct comma-separated names from {', '.join(TASKS)}; got {text!r} ({problem})"
        )
    return tuple(t for t in TASKS if t in tasks)


@dataclass(frozen=True)
class SuiteSettings:
    """What each task of the suite runs. The defaults are light: together 16-18 s per model of the tiny preset
    (d_model 128, 4 layers, 256-token contexts) on two idle CPU cores, needle, quant and icl taking most of it.

    Attributes:
        tasks: which tasks, a subset of ``difftransformer.eval.cli.TASKS``.
        context_length: tokens of every needle prompt and every held-out window (the preset's block size).
        needle_digits: digits of the magic numbers (the preset's, as in its retrieval training blocks).
        needles, needle_depths, needle_samples: needle's N:R configurations, answer depths and samples per cell.
        attention_needles, attention_depths, attention_samples: attention's one N:R pair, depths and samples.
        outlier_windows: outliers scans this many context-length windows of held-out text.
        quant_bits, quant_sequences, quant_needle_samples: logit bit widths; held-out windows for the loss;
            needle samples per configuration (at depth 0.5) for the accuracy at each width.
        longctx_sequences: held-out windows whose per-position NLL is averaged.
        icl_max_shots, icl_test_size, icl_orderings: the synthetic topic task at 0 and every power of two up to
            ``icl_max_shots`` demonstrations whose prompt fits the context; test examples; orderings per mode.
        mqar_max_pairs, mqar_sequences: MQAR at every power of two from 4 pairs up to this whose sequence (keys,
            values, queries) fits the context; sequences per setting.
        seed: every task's draws (the same samples for every variant).
    """

    tasks: tuple[str, ...] = TASKS
    context_length: int = 256
    needle_digits: int = 6
    needles: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 2))
    needle_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    needle_samples: int = 6
    attention_needles: tuple[int, int] = (4, 1)
    attention_depths: tuple[float, ...] = (0.0, 0.5, 1.0)
    attention_samples: int = 2
    outlier_windows: int = 4
    quant_bits: tuple[int, ...] = (16, 8, 6, 4)
    quant_sequences: int = 4
    quant_needle_samples: int = 2
    longctx_sequences: int = 8
    icl_max_shots: int = 16
    icl_test_size: int = 20
    icl_orderings: int = 3
    mqar_max_pairs: int = 64
    mqar_sequences: int = 16
    seed: int = 1234

    def __post_init__(self) -> None:
        parse_tasks(",".join(self.tasks))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, int) and field.name != "seed" and value < 1:
                raise ValueError(f"SuiteSettings.{field.name} must be >= 1; got {value}")

    @classmethod
    def for_preset(cls, preset: Preset, **fields) -> SuiteSettings:
        """The light settings for ``preset``: its block size and needle digits; ``fields`` override any default."""
        return cls(context_length=preset.block_size, needle_digits=preset.needle_digits, **fields)


def fitting_shots(tokenizer, data, context_length: int, most: int) -> list[int]:
    """0 and the powers of two up to ``most`` for which the longest demonstrations, query and label of ``data``
    (an :class:`difftransformer.eval.icl.LabelledData`) fit ``context_length`` tokens."""
    from difftransformer.eval.icl import format_demo, format_query

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


def fitting_pairs(context_length: int, most: int) -> list[int]:
    """Powers of two from 4 up to ``most`` whose MQAR sequence (every key queried: 4 tokens a pair) fits."""
    pairs, n = [], 4
    while n <= most and 4 * n <= context_length:
        pairs.append(n)
        n *= 2
    return pairs


def held_out_tokens(tokenizer, texts: Sequence[str]) -> int:
    """Tokens that :func:`difftransformer.eval.common.token_stream` can cut from ``texts``."""
    eos = 0 if getattr(tokenizer, "eos_token_id", None) is None else 1
    return sum(len(ids) + eos for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"])


def task_options(task: str, settings: SuiteSettings, tokenizer, held_out: int) -> dict:
    """The keyword arguments ``task``'s ``run_*`` function gets (besides model, data and output): JSON-able, so
    that an earlier result can be reused exactly when they are unchanged. ``held_out``: tokens of held-out text;
    a small test split gets fewer windows than the settings ask for rather than none."""
    length, digits, seed = settings.context_length, settings.needle_digits, settings.seed
    if task in ("needle", "attention", "outliers", "quant", "longctx") and held_out < length:
        raise ValueError(
            f"the held-out texts give {held_out} tokens; {task} needs at least one window of context_length "
            f"{length}"
        )

    def windows(wanted: int) -> int:
        return min(wanted, held_out // length)

    configs = [list(c) for c in settings.needles]
    if task == "needle":
        return dict(
            context_lengths=[length], needle_configs=configs, depths=list(settings.needle_depths),
            samples=settings.needle_samples, number_digits=digits, seed=seed,
        )  # fmt: skip
    if task == "attention":
        n, r = settings.attention_needles
        return dict(
            context_length=length, num_needles=n, num_queries=r, depths=list(settings.attention_depths),
            samples=settings.attention_samples, number_digits=digits, seed=seed,
        )  # fmt: skip
    if task == "outliers":
        return dict(tokens=windows(settings.outlier_windows) * length, length=length)
    if task == "quant":
        needle_kwargs = dict(
            context_lengths=[length], needle_configs=configs, depths=[0.5],
            samples=settings.quant_needle_samples, number_digits=digits,
        )  # fmt: skip
        return dict(
            bits=list(settings.quant_bits), length=length, num_sequences=windows(settings.quant_sequences),
            needle_kwargs=needle_kwargs, seed=seed,
        )  # fmt: skip
    if task == "longctx":
        return dict(length=length, num_sequences=windows(settings.longctx_sequences))
    if task == "icl":
        from difftransformer.eval.icl import synthetic_task

        shots = fitting_shots(tokenizer, synthetic_task(seed=seed), length, settings.icl_max_shots)
        return dict(
            shots=shots, test_size=settings.icl_test_size, orderings=settings.icl_orderings, seed=seed
        )
    if task == "mqar":
        pairs = fitting_pairs(length, settings.mqar_max_pairs)
        if not pairs:
            raise ValueError(f"mqar needs a context of at least 16 tokens; got context_length {length}")
        return dict(num_pairs=pairs, sequences=settings.mqar_sequences, seed=seed)
    raise ValueError(f"task must be one of {', '.join(TASKS)}; got {task!r}")


def suite_options(settings: SuiteSettings, tokenizer, texts: Sequence[str]) -> dict[str, dict]:
    """Every task's options (see :func:`task_options`), checked: call it before long work to fail early."""
    held_out = held_out_tokens(tokenizer, texts)
    # Through JSON, as an earlier result read back from disk has lists where these have tuples.
    return {
        task: json.loads(json.dumps(task_options(task, settings, tokenizer, held_out)))
        for task in settings.tasks
    }


def run_task(
    task: str,
    options: dict,
    model: nn.Module,
    tokenizer,
    texts: Sequence[str],
    output_dir: Path,
    progress: bool,
) -> dict:
    """Run one task with ``options`` (from :func:`task_options`); write its files to ``output_dir`` and return its
    summary numbers (see :func:`run_suite`)."""
    if task == "needle":
        from difftransformer.eval.needle import run_needle

        results = run_needle(model, tokenizer, texts, **options, output_dir=output_dir, progress=progress)
        return results["by_config"]
    if task == "attention":
        from difftransformer.eval.attention import run_attention

        results = run_attention(model, tokenizer, texts, **options, output_dir=output_dir, progress=progress)
        depths = results["by_depth"]
        return {key: sum(e[key] for e in depths) / len(depths) for key in ("answer", "context")}
    if task == "outliers":
        from difftransformer.eval.outliers import run_outliers

        ids = token_stream(tokenizer, texts, options["tokens"])
        results = run_outliers(model, ids, **options, output_dir=output_dir, progress=progress)
        return {
            key: dict(top1=results[key]["top1"], median=results[key]["median"],
                      ratio=results[key]["top1"] / results[key]["median"])
            for key in ("attention_logits", "hidden_states")
        }  # fmt: skip
    if task == "quant":
        from difftransformer.eval.quant import run_quant

        ids = token_stream(tokenizer, texts, options["length"] * options["num_sequences"])
        results = run_quant(model, tokenizer, ids, texts, **options, output_dir=output_dir, progress=progress)
        return {
            "unquantised" if row["bits"] is None else str(row["bits"]): dict(
                loss=row["loss"], needle_accuracy=row["needle_accuracy"]
            )
            for row in results["rows"]
        }
    if task == "longctx":
        from difftransformer.eval.longctx import run_longctx

        ids = token_stream(tokenizer, texts, options["length"] * options["num_sequences"])
        results = run_longctx(model, ids, **options, output_dir=output_dir, progress=progress)
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
    if task == "icl":
        from difftransformer.eval.icl import run_icl, synthetic_task

        data = synthetic_task(seed=options["seed"])
        results = run_icl(model, tokenizer, data, **options, output_dir=output_dir, progress=progress)
        return dict(
            accuracy={str(c["shots"]): c["accuracy"] for c in results["curve"]},
            spread={mode: r["spread"] for mode, r in results["order_robustness"].items()},
        )
    if task == "mqar":
        from difftransformer.eval.mqar import run_mqar

        results = run_mqar(model, tokenizer, **options, output_dir=output_dir, progress=progress)
        return {str(r["num_pairs"]): r["accuracy"] for r in results["rows"]}
    raise ValueError(f"task must be one of {', '.join(TASKS)}; got {task!r}")


def run_suite(
    model: nn.Module,
    tokenizer,
    texts: Sequence[str],
    settings: SuiteSettings,
    output_dir: str | Path,
    *,
    previous: dict | None = None,
    progress: bool = True,
) -> dict:
    """Run ``settings.tasks`` on ``model`` (held-out ``texts`` as haystacks and windows); every task writes its
    JSON and plots to OUTPUT_DIR/TASK/.

    ``previous``: an earlier return value for the same model; a task whose options are unchanged is taken from it
    instead of being run again.

    Returns a JSON-able dict: ``options`` (task -> the keyword arguments its run_* function got), ``seconds``
    (task -> wall time of its run) and ``summary`` (task -> its numbers):

    - needle: {"N:R": exact-recall accuracy} per configuration, averaged over depths;
    - attention: {"answer", "context"}: shares of attention on the answer needle and on the rest of the context
      (noise), averaged over depths;
    - outliers: {"attention_logits", "hidden_states"} each {"top1", "median", "ratio"} of absolute values;
    - quant: {"unquantised" or bits: {"loss", "needle_accuracy"}};
    - longctx: {"mean_nll", "cumulative_nll": {position: cumulative average NLL}} at positions 1, 4, 16, ...
      and the last;
    - icl: {"accuracy": {shots: accuracy}, "spread": {"random"/"grouped": best minus worst over orderings}} (no
      spread when no demonstration fits);
    - mqar: {pairs: accuracy}.
    """
    previous = previous or {}
    suite: dict[str, dict] = {"options": {}, "seconds": {}, "summary": {}}
    for task, options in suite_options(settings, tokenizer, texts).items():
        if previous.get("options", {}).get(task) == options and task in previous.get("summary", {}):
            summary, seconds = previous["summary"][task], previous["seconds"][task]
        else:
            start = time.perf_counter()
            summary = run_task(task, options, model, tokenizer, texts, Path(output_dir) / task, progress)
            seconds = time.perf_counter() - start
        suite["options"][task], suite["seconds"][task], suite["summary"][task] = options, seconds, summary
    return suite
