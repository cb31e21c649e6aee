"""The runs of a comparison and its report: every (scale, variant, seed) trained alike and evaluated with the suite.

Every variant of a seed gets the same blocks in the same order (one tokenizer, one packed and needle-mixed
training set, Trainer's sampler seeded with the run seed) and the same optimizer recipe: only the attention
differs. ``--sizes`` and ``--token-budgets`` repeat this over model widths or training lengths and fit power laws.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from difftransformer.compare.records import RunRecord
from difftransformer.compare.report import build_report
from difftransformer.compare.settings import ComparisonSettings
from difftransformer.compare.variants import Variant
from difftransformer.convert.upcycle import initial_model
from difftransformer.errors import UsageError
from difftransformer.eval.common import mean_token_nll
from difftransformer.eval.harness import run_harness
from difftransformer.eval.registry import TASKS
from difftransformer.eval.suite import SuiteSettings, run_suite, suite_options
from difftransformer.models import DiffTransformerForCausalLM
from difftransformer.storage import read_json, write_json
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.presets import Preset
from difftransformer.train.runner import SUMMARY_JSON, train_model
from difftransformer.train.settings import tokens_per_step


def train_and_evaluate(
    data: PreparedData,
    preset: Preset,
    variant: Variant,
    seed: int,
    scale: str,
    folder: Path,
    settings: SuiteSettings,
    comparison: ComparisonSettings,
    training: dict[str, Any],
) -> RunRecord:
    """Train one model (resuming a killed run, reusing a finished one; with ``comparison.init_from`` the pretrained
    model, upcycled to the variant's kind) and evaluate it on the test split: test loss and the evaluation suite,
    whose files go to FOLDER/eval/TASK/ (a task already run on this model with the same settings is reused from
    evaluation.json). ``training``: the command line's training options beyond the
    preset's (its seed replaced by ``seed``)."""
    tokenizer = data.tokenizer
    run_settings = preset.training_settings(**{**training, "output_dir": str(folder), "seed": seed})
    if not (folder / SUMMARY_JSON).is_file():
        train_model(
            initial_model(comparison.init_from, variant.kind, seed=seed)
            if comparison.init_from
            else variant.config(preset.model_for(variant.kind, tokenizer)),
            data.train_dataset,
            data.validation_blocks[: preset.eval_blocks],
            tokenizer,
            run_settings,
            resume=True,
            progress_desc=f"{variant.label} {scale} seed {seed}",
        )
    summary = read_json(folder / SUMMARY_JSON)
    model = DiffTransformerForCausalLM.from_pretrained(folder).eval()
    trained = dict(
        parameters=summary["parameters"],
        tokens=summary["global_step"] * tokens_per_step(preset.block_size, run_settings),
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
        model, data.test_blocks[: comparison.test_blocks], run_settings.per_device_eval_batch_size
    )
    suite = run_suite(model, tokenizer, data.test_texts, settings, folder / "eval", previous=previous)
    tqdm.write(
        f"{variant.label} {scale} seed {seed} evaluated in seconds: "
        + ", ".join(f"{task} {sec:.1f}" for task, sec in suite["seconds"].items())
    )
    harness = {}
    if comparison.lm_eval_tasks:
        options = dict(tasks=list(comparison.lm_eval_tasks), include_path=comparison.lm_eval_include, limit=comparison.lm_eval_limit,
                       batch_size=comparison.lm_eval_batch_size, seed=seed)  # fmt: skip
        if earlier_harness.get("options") == options:
            harness = earlier_harness
        else:
            metrics = run_harness(folder, include_defaults=comparison.lm_eval_include is None, **options)
            harness = {"options": options, "metrics": metrics}
    record = RunRecord(
        variant=variant.spec(),
        seed=seed,
        scale=scale,
        folder=folder,
        test_loss=test_loss,
        suite=suite,
        harness=harness,
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
            warmup = min(preset.training["warmup_steps"], max(1, steps // 10))
            scales.append(
                (f"t{steps * step_tokens}", preset.with_training(max_steps=steps, warmup_steps=warmup))
            )
        return scales
    return [(preset.name, preset)]


def run_comparison(
    data: PreparedData, preset: Preset, comparison: ComparisonSettings, training: dict[str, Any]
) -> Path:
    """Train and evaluate every (scale, variant, seed), write the report into ``comparison.output_dir``; returns the
    path of report.md. ``training``: the command line's training options beyond the preset's."""
    out = Path(comparison.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data.tokenizer.save_pretrained(str(out / "tokenizer"))
    seeds = comparison.seeds if comparison.seeds is not None else [training["seed"]]
    scales = []
    for scale, scaled in scaled_presets(preset, comparison, training):
        settings = SuiteSettings(
            tasks=comparison.tasks or TASKS,
            context_length=scaled.block_size,
            needle_digits=scaled.needle_digits,
            needles=tuple(tuple(pair) for pair in comparison.needles),
            # A pretrained model (--init-from) keeps its own context; the preset's models take this one.
            max_positions=None if comparison.init_from else scaled.model_config().max_position_embeddings,
            light={"needle": {"samples": comparison.needle_samples}} if comparison.needle_samples else {},
        )
        # Refuse settings the held-out text or the tokenizer cannot serve before anything is trained; without
        # --tasks, leave out the tasks that cannot run at this block size and say why.
        skipped: dict[str, str] | None = None if comparison.tasks else {}
        fitting = suite_options(settings, data.tokenizer, data.test_texts, skipped)
        for task, reason in (skipped or {}).items():
            print(f"compare: {task} left out at block size {scaled.block_size}: {reason}")
        settings = dataclasses.replace(settings, tasks=tuple(fitting))
        scales.append((scale, scaled, settings))
    plan = [(*scale, variant, seed) for scale in scales for seed in seeds for variant in comparison.variants]
    records = []
    for scale, scaled, settings, variant, seed in tqdm(plan, desc="compare", unit="run"):
        folder = out / "runs" / f"{scale}-{variant.slug}-seed{seed}"
        records.append(
            train_and_evaluate(data, scaled, variant, seed, scale, folder, settings, comparison, training)
        )
    write_json(out / "results.json", {"runs": [r.to_json() for r in records]})
    markdown, _ = build_report(records, comparison.variants, data, preset, comparison, out).write(out)
    return markdown
