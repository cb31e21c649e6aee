"""The runs of a comparison and its report: every (scale, variant, seed) trained alike and evaluated with the suite.

Every variant of a seed gets the same blocks in the same order (one tokenizer, one packed and needle-mixed
training set, Trainer's sampler seeded with the run seed) and the same optimizer recipe: only the attention
differs. ``--sizes`` and ``--token-budgets`` repeat this over model widths or training lengths and fit power laws.

A run folder records the settings it was trained with (``provenance.json``, :mod:`difftransformer.train.provenance`).
Before any work, :func:`plan_comparison` refuses a comparison folder whose runs were trained with other settings
(a rerun with the same settings continues them: a killed run resumes, a finished one is reused), so a report never
labels models with settings they were not trained with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from difftransformer.compare.records import RunRecord
from difftransformer.compare.report import build_report
from difftransformer.compare.settings import ComparisonSettings
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
from difftransformer.train.checkpoints import checkpoints
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.presets import Preset
from difftransformer.train.provenance import (
    differing_settings,
    record_provenance,
    recorded_settings,
    run_settings,
)
from difftransformer.train.runner import SUMMARY_JSON, train_model
from difftransformer.train.settings import TrainingSettings, tokens_per_step


@dataclass(frozen=True)
class PlannedRun:
    """One (scale, variant, seed) of a comparison: its preset at that scale, its folder, its training settings
    and the settings it records (:func:`~difftransformer.train.provenance.run_settings`)."""

    scale: str
    preset: Preset
    variant: Variant
    seed: int
    folder: Path
    training: TrainingSettings
    settings: dict[str, Any]

    @property
    def name(self) -> str:
        """How the progress bar and the messages name the run."""
        return f"{self.variant.label} {self.scale} seed {self.seed}"


def train_and_evaluate(
    data: PreparedData,
    run: PlannedRun,
    suite_settings: SuiteSettings,
    comparison: ComparisonSettings,
    data_options: DataOptions,
) -> RunRecord:
    """Train one model (resuming a killed run, reusing a finished one; with ``comparison.init_from`` the pretrained
    model, upcycled to the variant's kind) and evaluate it on the test split: test loss and the evaluation suite,
    whose files go to FOLDER/eval/TASK/ (a task already run on this model with the same settings is reused from
    evaluation.json)."""
    tokenizer, preset, variant, folder = data.tokenizer, run.preset, run.variant, run.folder
    reused = (folder / SUMMARY_JSON).is_file()
    if not reused:
        record_provenance(
            folder,
            preset=preset,
            training=run.training,
            data=data_options,
            attention=variant.spec(),
            init_from=comparison.init_from,
        )
        train_model(
            initial_model(comparison.init_from, variant.kind, seed=run.seed)
            if comparison.init_from
            else variant.config(preset.model_for(variant.kind, tokenizer)),
            data.train_dataset,
            data.validation_blocks[: preset.eval_blocks],
            tokenizer,
            run.training,
            resume=True,
            progress_desc=run.name,
        )
    summary = read_json(folder / SUMMARY_JSON)
    model = DiffTransformerForCausalLM.from_pretrained(folder).eval()
    trained = dict(
        parameters=summary["parameters"],
        tokens=preset.recall.tokens_between(
            0, summary["global_step"], preset.block_size, tokens_per_step(preset.block_size, run.training)
        ),
        tokens_per_second=summary["tokens_per_second"],
        train_seconds=summary["train_seconds"],
        validation_loss=summary["final_eval_loss"],
    )
    previous, earlier_harness = None, {}
    if (folder / "evaluation.json").is_file():
        earlier = read_json(folder / "evaluation.json")
        # Only an evaluation of this very training run (same summary) may be reused.
        if all(earlier.get(key) == value for key, value in trained.items()):
            previous, earlier_harness = earlier.get("suite"), earlier.get("harness") or {}
    test_loss = mean_token_nll(
        model, data.test_blocks[: comparison.test_blocks], run.training.per_device_eval_batch_size
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
        variant=variant.spec(),
        seed=run.seed,
        scale=run.scale,
        folder=folder,
        test_loss=test_loss,
        suite=suite,
        harness=harness,
        reused=reused,
        **trained,
    )
    write_json(folder / "evaluation.json", record.to_json())
    return record


def scaled_presets(
    preset: Preset, comparison: ComparisonSettings, training: dict[str, Any]
) -> list[tuple[str, Preset]]:
    """(label, preset) for every scale to train: the preset itself, each --sizes width, or each --token-budgets
    (``training``: the command line's other training options, which set the tokens per step with the preset's)."""
    if comparison.sizes:
        head_width = preset.hidden_size // (2 * preset.diff_heads)
        scales = []
        for width in comparison.sizes:
            if width < 2 * head_width or width % (2 * head_width):
                raise UsageError(
                    f"`sizes`: each width must be a multiple of 2 x head width {head_width}; got {width}"
                )
            scales.append(
                (
                    f"d{width}",
                    dataclasses.replace(
                        preset,
                        hidden_size=width,
                        diff_heads=width // (2 * head_width),
                        intermediate_size=None,
                    ),
                )
            )
        return scales
    if comparison.token_budgets:
        settings = preset.training_settings(**{**training, "output_dir": comparison.output_dir})
        step_tokens = tokens_per_step(preset.block_size, settings)
        scales = []
        for tokens in comparison.token_budgets:
            steps = max(1, round(tokens / step_tokens))
            warmup = min(preset.training.warmup_steps, max(1, steps // 10))
            scales.append(
                (f"t{steps * step_tokens}", preset.with_training(max_steps=steps, warmup_steps=warmup))
            )
        return scales
    return [(preset.name, preset)]


def plan_comparison(
    preset: Preset,
    comparison: ComparisonSettings,
    training: dict[str, Any],
    data_options: DataOptions | None = None,
) -> list[PlannedRun]:
    """Every (scale, variant, seed) of the comparison with its folder (OUTPUT_DIR/runs/SCALE-VARIANT-seedSEED) and
    training settings, checked before any work: the output folder must be writable, every run's training settings
    valid, and a run folder that already holds a run must hold one trained with exactly these settings (then it is
    continued or reused); otherwise a UsageError names the differing settings and the way out. ``training``: the
    command line's training options beyond the preset's; ``data_options``: where the data comes from (recorded)."""
    out = check_output_dir(comparison.output_dir, "output_dir")
    data_options = data_options or DataOptions()
    seeds = comparison.seeds if comparison.seeds is not None else (training["seed"],)
    runs = []
    for scale, scaled in scaled_presets(preset, comparison, training):
        for seed in seeds:
            for variant in comparison.variants:
                folder = out / "runs" / f"{scale}-{variant.slug}-seed{seed}"
                settings = scaled.training_settings(**{**training, "output_dir": str(folder), "seed": seed})
                record = run_settings(preset=scaled, training=settings, data=data_options,
                                      attention=variant.spec(), init_from=comparison.init_from)  # fmt: skip
                if not comparison.init_from:  # the variant's overrides are checked against its config now
                    variant.config(scaled.model_config(variant.kind))
                run = PlannedRun(scale, scaled, variant, seed, folder, settings, record)
                _check_reusable(run, out)
                runs.append(run)
    return runs


def _check_reusable(run: PlannedRun, out: Path) -> None:
    """Refuse a run folder holding a run whose recorded settings differ from ``run``'s (or that records none)."""
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
    differ = differing_settings(recorded, run.settings)
    if differ:
        shown = "; ".join(f"`{name}` {old!r} then, {new!r} now" for name, old, new in differ[:6])
        more = f" (and {len(differ) - 6} more)" if len(differ) > 6 else ""
        raise UsageError(
            f"{run.folder} was trained with other settings than this command gives: {shown}{more}; choose a new "
            f"`output_dir`, or give the settings as they were to continue {out}"
        )


def run_comparison(
    data: PreparedData,
    preset: Preset,
    comparison: ComparisonSettings,
    training: dict[str, Any],
    data_options: DataOptions | None = None,
) -> Path:
    """Train and evaluate every (scale, variant, seed) of :func:`plan_comparison`, write the report into
    ``comparison.output_dir``; returns the path of report.md. ``training``: the command line's training options
    beyond the preset's; ``data_options``: where ``data`` came from (recorded with every run and the report)."""
    data_options = data_options or DataOptions()
    plan = plan_comparison(preset, comparison, training, data_options)
    scales = {}
    for scale, scaled in {run.scale: run.preset for run in plan}.items():
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
        # Refuse settings the held-out text or the tokenizer cannot serve before anything is trained; without
        # --tasks, leave out the tasks that cannot run at this block size and say why.
        skipped: dict[str, str] | None = None if comparison.tasks else {}
        fitting = suite_options(settings, data.tokenizer, data.test_texts, skipped)
        for task, reason in (skipped or {}).items():
            print(f"compare: {task} left out at block size {scaled.block_size}: {reason}")
        settings = dataclasses.replace(settings, tasks=tuple(fitting))
        scales[scale] = settings
    out = Path(comparison.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data.tokenizer.save_pretrained(str(out / "tokenizer"))
    records = []
    for run in tqdm(plan, desc="compare", unit="run"):
        records.append(train_and_evaluate(data, run, scales[run.scale], comparison, data_options))
    provenance = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "comparison": comparison.to_json(),
        "preset": preset.name,
        "training": training,
        "data": dataclasses.asdict(data_options),
        "runs": {str(r.folder): "reused" if r.reused else "trained" for r in records},
    }
    write_json(out / "results.json", {"provenance": provenance, "runs": [r.to_json() for r in records]})
    markdown, _ = build_report(records, comparison.variants, data, preset, comparison, out).write(out)
    return markdown
