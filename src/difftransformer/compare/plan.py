"""What a comparison trains, decided once before any work: every (scale, variant, learning rate, seed), its
settings and folder, the sweep that chooses each arm's rate, and what each scale evaluates.

Every variant of a seed gets the same blocks in the same order (one tokenizer, one packed and needle-mixed
training set, Trainer's sampler seeded with the run seed) and the same optimizer recipe: only the attention
differs. ``--sizes`` and ``--token-budgets`` repeat this over model widths or training lengths.

With ``--learning-rates`` every arm (a variant at a scale) first trains on the first seed at every rate (the
sweep); then every seed trains at the arm's chosen rate (:mod:`difftransformer.compare.rates`) and at the shared
rate (the preset's, or ``--learning-rate``: the paper's protocol, every arm alike).

A run folder records the settings it was trained with (``provenance.json``,
:mod:`difftransformer.train.provenance`). :func:`plan_comparison` refuses a comparison folder whose runs were
trained with other settings (a rerun with the same settings continues them: a killed run resumes, a finished one is
reused), so a report never labels models with settings they were not trained with; the runs finished before this
invocation are the ones its results call reused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difftransformer.compare.history import earlier_variants
from difftransformer.compare.records import RUN_LOG
from difftransformer.compare.settings import ComparisonSettings
from difftransformer.compare.variants import BASELINE, Variant
from difftransformer.data import DataOptions
from difftransformer.errors import UsageError
from difftransformer.eval.registry import TASKS
from difftransformer.eval.suite import SuiteSettings, suite_options
from difftransformer.storage import check_output_dir
from difftransformer.train.checkpoints import checkpoints
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.plan import count_parameters
from difftransformer.train.presets import Preset
from difftransformer.train.provenance import differing_settings, recorded_settings, run_settings
from difftransformer.train.runner import SUMMARY_JSON
from difftransformer.train.settings import HARDWARE_DEFAULTS, TrainingSettings, tokens_per_step

# The fewest steps a run whose length --tokens-per-parameter or --token-budgets sets may train: a tenth of them
# warm up, and a fit through runs shorter than this measures their warm-up.
MIN_SCALED_STEPS = 10


@dataclass(frozen=True)
class PlannedRun:
    """One (scale, variant, learning rate, seed) of a comparison: its preset at that scale and rate, its folder,
    the command line's training options (``training``; the run's :class:`TrainingSettings` are made where it
    trains, whose hardware decides what was left unset), the settings it records
    (:func:`~difftransformer.train.provenance.run_settings`), and whether it is evaluated (a sweep's run is not:
    only its validation loss chooses the rate)."""

    scale: str
    preset: Preset
    variant: Variant
    seed: int
    folder: Path
    training: Mapping[str, Any]
    settings: dict[str, Any]
    evaluate: bool = True
    tag: str = ""

    @property
    def name(self) -> str:
        """How the progress display and the messages name the run (``tag``: its rate and sweep length)."""
        return f"{self.variant.label} {self.scale}{self.tag} seed {self.seed}"

    @property
    def arm(self) -> Hashable:
        """The runs a learning-rate sweep compares: one variant at one scale."""
        return (self.scale, self.variant.spec())

    @property
    def log(self) -> Path:
        """The run's log: every attempt's output."""
        return self.folder / RUN_LOG

    @property
    def learning_rate(self) -> float:
        return self.preset.training.learning_rate

    @property
    def max_steps(self) -> int:
        return self.preset.training.max_steps

    def training_settings(self) -> TrainingSettings:
        """The run's Trainer settings, made on the machine that calls this."""
        return self.preset.training_settings(
            **{**self.training, "output_dir": str(self.folder), "seed": self.seed}
        )


@dataclass(frozen=True)
class ComparisonPlan:
    """Every run a comparison may train, checked before any work.

    Attributes:
        preset, comparison, training, data_options: what the command asked for (``training``: the command line's
            training options beyond the preset's; ``data_options``: where the data comes from, recorded).
        out: the comparison folder.
        presets: the preset of every scale, by scale name, in order.
        shared_rate: the rate every arm trains at under the paper's protocol (the preset's, or --learning-rate).
        sweep: the learning-rate sweep's runs (the first seed at every rate; empty without --learning-rates).
        runs: the evaluated runs by (scale, variant spec, rate, seed): without a sweep every one of them is trained;
            with one, each arm's chosen rate and the shared rate (:meth:`final`).
        seeds: the seeds, in order.
        finished: the folders of the planned runs that had finished before this invocation (it reuses them).
    """

    preset: Preset
    comparison: ComparisonSettings
    training: Mapping[str, Any]
    data_options: DataOptions
    out: Path
    presets: Mapping[str, Preset]
    shared_rate: float
    sweep: tuple[PlannedRun, ...]
    runs: Mapping[tuple[str, str, float, int], PlannedRun]
    seeds: tuple[int, ...]
    finished: frozenset[Path]

    @property
    def scales(self) -> tuple[str, ...]:
        return tuple(self.presets)

    @property
    def variants(self) -> tuple[Variant, ...]:
        return self.comparison.variants

    def final(self, best: Mapping[Hashable, float] | None = None) -> list[PlannedRun]:
        """The evaluated runs: every seed of every arm at the shared rate and at the arm's ``best`` rate (the
        shared rate alone without a sweep), scale by scale, seed by seed, variant by variant."""
        chosen = []
        for scale in self.scales:
            for seed in self.seeds:
                for variant in self.variants:
                    rates = dict.fromkeys(
                        [self.shared_rate, (best or {}).get((scale, variant.spec()), self.shared_rate)]
                    )
                    chosen += [self.runs[(scale, variant.spec(), rate, seed)] for rate in rates]
        return chosen

    def all_runs(self) -> list[PlannedRun]:
        return [*self.sweep, *self.runs.values()]


def scaled_presets(
    preset: Preset, comparison: ComparisonSettings, training: Mapping[str, Any]
) -> dict[str, Preset]:
    """The preset of every scale to train, by scale name: the preset itself, each --sizes width, or each
    --token-budgets (``training``: the command line's other training options, which set the tokens per step with
    the preset's). A scale whose tokens come to fewer than :data:`MIN_SCALED_STEPS` steps is refused, and so is a
    sweep longer than a scale's runs (``sweep_steps`` is a shorter run of the same recipe)."""
    settings = preset.training_settings(**{**training, "output_dir": comparison.output_dir})
    step_tokens = tokens_per_step(preset.block_size, settings)

    def trained_on(scaled: Preset, tokens: float, field: str, what: str) -> Preset:
        steps = round(tokens / step_tokens)
        if steps < MIN_SCALED_STEPS:
            raise UsageError(
                f"`{field}` gives {what} {steps} training step(s) ({tokens:,.0f} tokens at {step_tokens:,} a step); "
                f"each scale needs at least {MIN_SCALED_STEPS} steps ({MIN_SCALED_STEPS * step_tokens:,} tokens), "
                "else its fit reads the warm-up alone"
            )
        warmup = min(scaled.training.warmup_steps, max(1, steps // 10))
        return scaled.with_training(max_steps=steps, warmup_steps=warmup)

    scales = {}
    if comparison.sizes:
        for width in comparison.sizes:
            try:
                scaled = preset.at_width(width)
            except UsageError as err:
                raise UsageError(str(err).replace("`hidden_size`", "`sizes`")) from None
            if comparison.tokens_per_parameter:
                counts = count_parameters(scaled.model_config("softmax"))
                tokens = comparison.tokens_per_parameter * (counts.total - counts.outside_layers)
                scaled = trained_on(scaled, tokens, "tokens_per_parameter", f"size {width}")
            scales[f"d{width}"] = scaled
    elif comparison.token_budgets:
        for tokens in comparison.token_budgets:
            scaled = trained_on(preset, tokens, "token_budgets", f"the budget {tokens:,}")
            scales[f"t{scaled.training.max_steps * step_tokens}"] = scaled
    else:
        scales[preset.name] = preset
    for scale, scaled in scales.items():
        if (comparison.sweep_steps or 0) > scaled.training.max_steps:
            at = f" at scale {scale}" if len(scales) > 1 else ""
            raise UsageError(
                f"`sweep_steps` must be at most `max_steps`{at} ({scaled.training.max_steps}: the sweep is a "
                f"shorter run of the same recipe, never a longer one); got {comparison.sweep_steps}"
            )
    return scales


def plan_comparison(
    preset: Preset,
    comparison: ComparisonSettings,
    training: Mapping[str, Any],
    data_options: DataOptions | None = None,
) -> ComparisonPlan:
    """Every (scale, variant, rate, seed) the comparison may train, with its folder
    (OUTPUT_DIR/runs/SCALE-VARIANT[-lrRATE]-seedSEED) and training settings, checked before any work: the output
    folder must be writable, every run's training settings valid, the sweep no longer than the runs it chooses for,
    the comparison one whose claims can be judged (unless ``comparison.allow_unjudged``), and a run folder that
    already holds a run must hold one trained with exactly these settings (then it is continued or reused);
    otherwise a UsageError names the problem and the way out. ``training``: the command line's training options
    beyond the preset's; ``data_options``: where the data comes from (recorded)."""
    presets = scaled_presets(preset, comparison, training)
    out = check_output_dir(comparison.output_dir, "output_dir")
    # The claims need the matched baseline and a variant beside it, here or in the folder's earlier report.
    specs = {*earlier_variants(out), *(variant.spec() for variant in comparison.variants)}
    if not comparison.allow_unjudged and (BASELINE not in specs or not specs - {BASELINE}):
        missing = (
            "the matched baseline (softmax)" if BASELINE not in specs else "a variant beside the baseline"
        )
        shown = ",".join(variant.spec() for variant in comparison.variants)
        raise UsageError(
            f"`variants` {shown}: no claim of the paper could be judged without {missing}; add it, or give "
            "`allow_unjudged` to train and table these runs alone"
        )
    data_options = data_options or DataOptions()
    seeds = comparison.seeds if comparison.seeds is not None else (training["seed"],)
    shared = preset.training.learning_rate
    rates = list(dict.fromkeys([*(comparison.learning_rates or ()), shared]))
    if comparison.learning_rates and shared not in comparison.learning_rates:
        print(f"compare: the shared rate {shared:g} (the paper's protocol) joins the sweep's rates")
    swept = comparison.learning_rates is not None

    def planned(
        scale: str, scaled: Preset, variant: Variant, seed: int, rate: float, steps: int | None
    ) -> PlannedRun:
        recipe = dict(learning_rate=rate)
        if steps is not None:
            recipe.update(
                max_steps=steps, warmup_steps=min(scaled.training.warmup_steps, max(1, steps // 10))
            )
        at_rate = scaled.with_training(**recipe) if swept else scaled
        name = (
            f"{scale}-{variant.slug}"
            + (f"-lr{rate:g}" if swept else "")
            + (f"-{steps}steps" if steps else "")
        )
        tag = (f" lr {rate:g}" if swept else "") + (f", {steps} steps" if steps else "")
        folder = out / "runs" / f"{name}-seed{seed}"
        settings = at_rate.training_settings(**{**training, "seed": seed, "output_dir": str(folder)})
        record = run_settings(preset=at_rate, training=settings, data=data_options,
                              attention=variant.spec(), init_from=comparison.init_from)  # fmt: skip
        run = PlannedRun(
            scale, at_rate, variant, seed, folder, training, record, evaluate=steps is None, tag=tag
        )
        _check_reusable(run, ignored=HARDWARE_DEFAULTS - set(training))
        return run

    sweep, runs = [], {}
    for scale, scaled in presets.items():
        # A sweep as long as the runs is the first seed's runs: no folders of its own.
        shorter = comparison.sweep_steps if comparison.sweep_steps != scaled.training.max_steps else None
        for variant in comparison.variants:
            if not comparison.init_from:  # the variant's overrides are checked against its config now
                variant.config(scaled.model_config(variant.kind))
            for rate in rates:
                for seed in seeds:
                    runs[(scale, variant.spec(), rate, seed)] = planned(
                        scale, scaled, variant, seed, rate, None
                    )
                if swept:  # the first seed's run at this rate, or a shorter one; trained, not evaluated
                    sweep.append(
                        planned(scale, scaled, variant, seeds[0], rate, shorter)
                        if shorter
                        else dataclasses.replace(
                            runs[(scale, variant.spec(), rate, seeds[0])], evaluate=False
                        )
                    )
    every = [*sweep, *runs.values()]
    finished = frozenset(run.folder for run in every if (run.folder / SUMMARY_JSON).is_file())
    return ComparisonPlan(preset, comparison, training, data_options, out, presets, shared, tuple(sweep), runs,
                          tuple(seeds), finished)  # fmt: skip


def _check_reusable(run: PlannedRun, ignored: Iterable[str] = ()) -> None:
    """Refuse a run folder holding a run whose recorded settings differ from ``run``'s (or that records none);
    ``ignored``: settings left to the hardware the run trained on."""
    if not run.folder.is_dir() or not any(run.folder.iterdir()):
        return
    recorded = recorded_settings(run.folder)
    if recorded is None:
        if (run.folder / SUMMARY_JSON).is_file() or checkpoints(run.folder):
            raise UsageError(
                f"{run.folder} holds a run that records no settings (made by an earlier version), so it cannot be "
                "reused; choose a new `output_dir`"
            )
        return
    ignored = set(ignored)
    differ = [entry for entry in differing_settings(recorded, run.settings) if entry[0] not in ignored]
    if differ:
        shown = "; ".join(f"`{name}` {old!r} then, {new!r} now" for name, old, new in differ[:6])
        more = f" (and {len(differ) - 6} more)" if len(differ) > 6 else ""
        raise UsageError(
            f"{run.folder} was trained with other settings than this command gives: {shown}{more}; choose a new "
            f"`output_dir`, or give the settings as they were to continue {run.folder.parent.parent}"
        )


def suite_settings(plan: ComparisonPlan, data: PreparedData) -> dict[str, SuiteSettings]:
    """The evaluation suite of every scale: the comparison's tasks (without --tasks, every one that fits the block
    size; those left out are named), checked against the held-out text and the tokenizer before any training."""
    comparison = plan.comparison
    suites = {}
    for scale, scaled in plan.presets.items():
        settings = SuiteSettings(
            tasks=comparison.tasks or TASKS,
            context_length=scaled.block_size,
            needle=scaled.needle,
            needles=tuple(tuple(pair) for pair in comparison.needles),
            # A pretrained model (--init-from) keeps its own context; the preset's models take this one.
            max_positions=None if comparison.init_from else scaled.model_config().max_position_embeddings,
            # The preset's own evaluation settings (e.g. mqar's grid of lengths), then --needle-samples.
            light={
                **scaled.evaluation,
                **({"needle": {"samples": comparison.needle_samples}} if comparison.needle_samples else {}),
            },
        )
        skipped: dict[str, str] | None = None if comparison.tasks else {}
        fitting = suite_options(settings, data.tokenizer, data.test_texts, skipped)
        for task, reason in (skipped or {}).items():
            print(f"compare: {task} left out at block size {scaled.block_size}: {reason}")
        suites[scale] = dataclasses.replace(settings, tasks=tuple(fitting))
    return suites
