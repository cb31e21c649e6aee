"""The runs of a comparison and its report: every (scale, variant, seed) trained alike and evaluated with the suite.

Every variant of a seed gets the same blocks in the same order (one tokenizer, one packed and needle-mixed
training set, Trainer's sampler seeded with the run seed) and the same optimizer recipe: only the attention
differs. ``--sizes`` and ``--token-budgets`` repeat this over model widths or training lengths and fit power laws.

With ``--learning-rates`` the comparison runs in two phases: every arm (a variant at a scale) first trains on the
first seed at every rate (the sweep), the rate with the lowest validation loss is the arm's best, and then every
seed trains at the arm's best rate and at the shared rate (the preset's, or ``--learning-rate``: the paper's
protocol, every arm alike). The report judges the claims at both.

The runs fan out over a Ray cluster (:mod:`difftransformer.compare.fanout`): one started on this machine, or the
one ``--ray-address`` names. A run folder records the settings it was trained with (``provenance.json``,
:mod:`difftransformer.train.provenance`). Before any work, :func:`plan_comparison` refuses a comparison folder
whose runs were trained with other settings (a rerun with the same settings continues them: a killed run resumes,
a finished one is reused), so a report never labels models with settings they were not trained with.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback

from difftransformer.compare.claims import learned_recall
from difftransformer.compare.cluster import Cluster, check_shared, connect
from difftransformer.compare.fanout import run_grid, usage_seconds
from difftransformer.compare.grid import Grid
from difftransformer.compare.history import extend_earlier
from difftransformer.compare.records import EVALUATION_JSON, RESULTS_JSON, RunRecord, SweepPoint
from difftransformer.compare.report import build_report
from difftransformer.compare.settings import ComparisonSettings, RateChoice
from difftransformer.compare.variants import Variant
from difftransformer.convert.upcycle import initial_model
from difftransformer.data import DataOptions
from difftransformer.errors import UsageError
from difftransformer.eval.common import mean_token_nll
from difftransformer.eval.harness import run_harness
from difftransformer.eval.registry import TASKS
from difftransformer.eval.suite import SuiteSettings, run_suite, suite_options
from difftransformer.models import DiffTransformerForCausalLM
from difftransformer.storage import check_output_dir, read_json, versions, write_json
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.checkpoints import checkpoints
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.plan import count_parameters
from difftransformer.train.presets import Preset
from difftransformer.train.provenance import (
    differing_settings,
    record_provenance,
    recorded_settings,
    run_settings,
)
from difftransformer.train.runner import METRICS_CSV, SUMMARY_JSON, is_main_process, train_model
from difftransformer.train.settings import HARDWARE_DEFAULTS, TrainingSettings, tokens_per_step


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


def execute_run(
    data: PreparedData,
    suites: Mapping[str, SuiteSettings],
    comparison: ComparisonSettings,
    data_options: DataOptions,
    run: PlannedRun,
    callbacks: Sequence[TrainerCallback] = (),
) -> None:
    """What a worker does with one run: train it (resuming a killed run, reusing a finished one) and, for a run
    that is evaluated, evaluate it (:func:`train_and_evaluate`); the results land in the run's folder."""
    if run.evaluate:
        train_and_evaluate(data, run, suites[run.scale], comparison, data_options, callbacks)
    else:
        train_run(data, run, comparison, data_options, callbacks)


def train_run(
    data: PreparedData,
    run: PlannedRun,
    comparison: ComparisonSettings,
    data_options: DataOptions,
    callbacks: Sequence[TrainerCallback] = (),
) -> bool:
    """Train one model into its folder unless it is finished already (with ``comparison.init_from`` the pretrained
    model, upcycled to the variant's kind); True when this call trained."""
    if (run.folder / SUMMARY_JSON).is_file():
        return False
    training = run.training_settings()
    record_provenance(
        run.folder,
        preset=run.preset,
        training=training,
        data=data_options,
        attention=run.variant.spec(),
        init_from=comparison.init_from,
    )
    train_model(
        initial_model(comparison.init_from, run.variant.kind, seed=run.seed)
        if comparison.init_from
        else run.variant.config(run.preset.model_for(run.variant.kind, data.tokenizer)),
        data.train_dataset,
        data.validation_blocks[: run.preset.eval_blocks],
        data.tokenizer,
        training,
        resume=True,
        progress_desc=run.name,
        callbacks=list(callbacks),
    )
    return True


def train_and_evaluate(
    data: PreparedData,
    run: PlannedRun,
    suite_settings: SuiteSettings,
    comparison: ComparisonSettings,
    data_options: DataOptions,
    callbacks: Sequence[TrainerCallback] = (),
) -> RunRecord:
    """Train one model (:func:`train_run`) and evaluate it on the test split: test loss and the evaluation suite,
    whose files go to FOLDER/eval/TASK/ (a task already run on this model with the same settings is reused from
    evaluation.json). Only the main process of a data-parallel run evaluates."""
    trained_now = train_run(data, run, comparison, data_options, callbacks)
    if not is_main_process():
        return None
    folder, preset, tokenizer = run.folder, run.preset, data.tokenizer
    summary = read_json(folder / SUMMARY_JSON)
    model = DiffTransformerForCausalLM.from_pretrained(folder).eval()
    training = run.training_settings()
    trained = dict(
        parameters=summary["parameters"],
        tokens=preset.recall.tokens_between(
            0, summary["global_step"], preset.block_size, tokens_per_step(preset.block_size, training)
        ),
        tokens_per_second=summary["tokens_per_second"],
        train_seconds=summary["train_seconds"],
        validation_loss=summary["final_eval_loss"],
    )
    previous, earlier_harness = None, {}
    if (folder / EVALUATION_JSON).is_file():
        earlier = read_json(folder / EVALUATION_JSON)
        # Only an evaluation of this very training run (same summary) may be reused.
        if all(earlier.get(key) == value for key, value in trained.items()):
            previous, earlier_harness = earlier.get("suite"), earlier.get("harness") or {}
    test_loss = mean_token_nll(
        model, data.test_blocks[: comparison.test_blocks], training.per_device_eval_batch_size
    )
    suite = run_suite(model, tokenizer, data.test_texts, suite_settings, folder / "eval", previous=previous)
    tqdm.write(
        f"{run.name} evaluated in seconds: "
        + ", ".join(f"{task} {sec:.1f}" for task, sec in suite["seconds"].items())
    )
    harness = {}
    if comparison.lm_eval_tasks:
        options = dict(tasks=list(comparison.lm_eval_tasks), include_path=comparison.lm_eval_include, limit=comparison.lm_eval_limit,
                       batch_size=comparison.lm_eval_batch_size, seed=run.seed)  # fmt: skip
        if earlier_harness.get("options") == options:
            harness = earlier_harness
        else:
            metrics = run_harness(folder, include_defaults=comparison.lm_eval_include is None, **options)
            harness = {"options": options, "metrics": metrics}
    record = RunRecord(
        variant=run.variant.spec(),
        seed=run.seed,
        scale=run.scale,
        folder=folder,
        test_loss=test_loss,
        suite=suite,
        harness=harness,
        reused=not trained_now,
        learning_rate=run.learning_rate,
        layer_parameters=sum(p.numel() for p in model.model.layers.parameters()),
        **trained,
    )
    write_json(folder / EVALUATION_JSON, record.to_json())
    return record


def scaled_presets(
    preset: Preset, comparison: ComparisonSettings, training: dict[str, Any]
) -> list[tuple[str, Preset]]:
    """(label, preset) for every scale to train: the preset itself, each --sizes width, or each --token-budgets
    (``training``: the command line's other training options, which set the tokens per step with the preset's)."""
    settings = preset.training_settings(**{**training, "output_dir": comparison.output_dir})
    step_tokens = tokens_per_step(preset.block_size, settings)

    def trained_on(scaled: Preset, tokens: float) -> Preset:
        steps = max(1, round(tokens / step_tokens))
        warmup = min(scaled.training.warmup_steps, max(1, steps // 10))
        return scaled.with_training(max_steps=steps, warmup_steps=warmup)

    if comparison.sizes:
        scales = []
        for width in comparison.sizes:
            try:
                scaled = preset.at_width(width)
            except UsageError as err:
                raise UsageError(str(err).replace("`hidden_size`", "`sizes`")) from None
            if comparison.tokens_per_parameter:
                counts = count_parameters(scaled.model_config("softmax"))
                scaled = trained_on(
                    scaled, comparison.tokens_per_parameter * (counts.total - counts.outside_layers)
                )
            scales.append((f"d{width}", scaled))
        return scales
    if comparison.token_budgets:
        scales = []
        for tokens in comparison.token_budgets:
            scaled = trained_on(preset, tokens)
            scales.append((f"t{scaled.training.max_steps * step_tokens}", scaled))
        return scales
    return [(preset.name, preset)]


@dataclass(frozen=True)
class ComparisonPlan:
    """Every run a comparison may train, checked before any work.

    Attributes:
        shared_rate: the rate every arm trains at under the paper's protocol (the preset's, or --learning-rate).
        sweep: the learning-rate sweep's runs (the first seed at every rate; empty without --learning-rates).
        runs: the evaluated runs by (scale, variant spec, rate, seed): without a sweep every one of them is trained;
            with one, each arm's best rate and the shared rate (:meth:`final`).
        seeds, variants, scales: the grid's axes, in order.
    """

    shared_rate: float
    sweep: tuple[PlannedRun, ...]
    runs: Mapping[tuple[str, str, float, int], PlannedRun]
    seeds: tuple[int, ...]
    variants: tuple[Variant, ...]
    scales: tuple[str, ...]

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


def plan_comparison(
    preset: Preset,
    comparison: ComparisonSettings,
    training: dict[str, Any],
    data_options: DataOptions | None = None,
) -> ComparisonPlan:
    """Every (scale, variant, rate, seed) the comparison may train, with its folder
    (OUTPUT_DIR/runs/SCALE-VARIANT[-lrRATE]-seedSEED) and training settings, checked before any work: the output
    folder must be writable, every run's training settings valid, and a run folder that already holds a run must
    hold one trained with exactly these settings (then it is continued or reused); otherwise a UsageError names the
    differing settings and the way out. ``training``: the command line's training options beyond the preset's;
    ``data_options``: where the data comes from (recorded)."""
    out = check_output_dir(comparison.output_dir, "output_dir")
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
        _check_reusable(run, out, ignored=HARDWARE_DEFAULTS - set(training))
        return run

    sweep, runs, scales = [], {}, []
    for scale, scaled in scaled_presets(preset, comparison, training):
        scales.append(scale)
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
                        planned(scale, scaled, variant, seeds[0], rate, comparison.sweep_steps)
                        if comparison.sweep_steps
                        else dataclasses.replace(
                            runs[(scale, variant.spec(), rate, seeds[0])], evaluate=False
                        )
                    )
    return ComparisonPlan(shared, tuple(sweep), runs, tuple(seeds), tuple(comparison.variants), tuple(scales))


def _check_reusable(run: PlannedRun, out: Path, ignored: Iterable[str] = ()) -> None:
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
            f"`output_dir`, or give the settings as they were to continue {out}"
        )


def sweep_point(run: PlannedRun) -> SweepPoint:
    """Where a sweep run ended: its last validation loss and step (from train_summary.json when it finished,
    else from metrics.csv: early stopping ended it)."""
    if (run.folder / SUMMARY_JSON).is_file():
        summary = read_json(run.folder / SUMMARY_JSON)
        loss, step, stopped = summary["final_eval_loss"], summary["global_step"], False
    else:
        steps, losses = column(read_metrics(run.folder / METRICS_CSV), "eval_loss")
        loss, step, stopped = (losses[-1], steps[-1], True) if losses else (math.nan, 0, True)
    return SweepPoint(
        variant=run.variant.spec(),
        scale=run.scale,
        learning_rate=run.learning_rate,
        seed=run.seed,
        steps=run.max_steps,
        step=step,
        validation_loss=loss,
        stopped_early=stopped,
        learned_recall=learned_recall(run.folder),
    )


def best_rates(
    points: Sequence[SweepPoint], rate_choice: RateChoice = "validation_loss"
) -> dict[tuple[str, str], float]:
    """Each arm's rate with the lowest validation loss among its sweep runs that reached their last step (the
    lower rate on a tie); with ``rate_choice="learned_recall"``, among those whose recall probe reached 0.9, where
    any of the arm's did."""
    finished = [p for p in points if not p.stopped_early and not math.isnan(p.validation_loss)]
    learned = {(p.scale, p.variant) for p in finished if p.learned_recall}
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for point in finished:
        key = (point.scale, point.variant)
        if rate_choice == "learned_recall" and key in learned and not point.learned_recall:
            continue
        candidate = (point.validation_loss, point.learning_rate)
        best[key] = min(best.get(key, candidate), candidate)
    return {arm: rate for arm, (_, rate) in best.items()}


def suite_settings(
    comparison: ComparisonSettings, data: PreparedData, scales: Iterable[tuple[str, Preset]]
) -> dict[str, SuiteSettings]:
    """The evaluation suite of every scale: the comparison's tasks (without --tasks, every one that fits the block
    size; those left out are named), checked against the held-out text and the tokenizer before any training."""
    suites = {}
    for scale, scaled in scales:
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


def run_comparison(
    data: PreparedData,
    preset: Preset,
    comparison: ComparisonSettings,
    training: dict[str, Any],
    data_options: DataOptions | None = None,
    cluster: Cluster | None = None,
) -> Path:
    """Train and evaluate every run of :func:`plan_comparison` on ``cluster`` (None: connect to the one
    ``comparison.ray_address`` names, or start one here), the sweep first when there is one, and write the report
    into ``comparison.output_dir``; returns the path of report.md. ``training``: the command line's training
    options beyond the preset's; ``data_options``: where ``data`` came from (recorded with every run and the
    report)."""
    data_options = data_options or DataOptions()
    plan = plan_comparison(preset, comparison, training, data_options)
    suites = suite_settings(comparison, data, scaled_presets(preset, comparison, training))
    out = Path(comparison.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data.tokenizer.save_pretrained(str(out / "tokenizer"))
    if cluster is None:
        with connect(comparison.ray_address) as connected:
            return run_comparison(data, preset, comparison, training, data_options, connected)
    check_shared([out, *data.block_files()], cluster)
    work = functools.partial(execute_run, data, suites, comparison, data_options)

    def fan_out(runs: Sequence[PlannedRun], desc: str) -> None:
        resources = cluster.resources_for(comparison.run_resources, len(runs))
        grid = Grid(
            tuple(runs),
            work,
            resources,
            retries=comparison.run_retries,
            early_stop=comparison.sweep_early_stop and desc.startswith("sweep"),
            desc=desc,
        )
        run_grid(grid)

    points: list[SweepPoint] = []
    best = None
    if plan.sweep:
        fan_out(plan.sweep, "sweep")
        points = [sweep_point(run) for run in plan.sweep]
        best = best_rates(points, comparison.rate_choice)
    final = plan.final(best)
    fan_out(final, "compare")
    records = [RunRecord.from_json(read_json(run.folder / EVALUATION_JSON)) for run in final]
    provenance = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "comparison": comparison.to_json(),
        "preset": preset.name,
        "training": training,
        "data": dataclasses.asdict(data_options),
        "cluster": cluster.describe(),
    }
    extended = extend_earlier(out, provenance, records, points, comparison.variants)
    records, points = extended.records, extended.points
    best = best_rates(points, comparison.rate_choice) if points else None
    provenance["comparison"]["variants"] = [variant.spec() for variant in extended.variants]
    provenance["runs"] = {str(r.folder): "reused" if r.reused else "trained" for r in records}
    # Every attempt at every run this report holds, this invocation's and earlier ones'.
    provenance["usage"] = usage_seconds(
        sorted({r.folder for r in records} | {run.folder for run in plan.sweep})
    )
    results = {"provenance": provenance, "runs": [r.to_json() for r in records]}
    if points:
        results["learning_rates"] = {
            "shared": plan.shared_rate,
            "best": [
                {"scale": scale, "variant": spec, "learning_rate": rate}
                for (scale, spec), rate in best.items()
            ],
            "sweep": [dataclasses.asdict(point) for point in points],
        }
    folder = extended.folder
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / RESULTS_JSON, results)
    markdown, _ = build_report(
        records,
        extended.variants,
        data,
        preset,
        comparison,
        folder,
        sweep=points,
        shared_rate=plan.shared_rate,
        best=best,
    ).write(folder)
    if extended.beside:
        print(f"compare: this report is in {folder}, beside the one in {out}: {extended.beside}")
    return markdown
