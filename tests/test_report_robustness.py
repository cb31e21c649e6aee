"""compare's report survives whatever a short comparison leaves: runs of 1-30 steps logged every 1-50 steps (so
possibly no logged row at all), any subset of the evaluation tasks (none included), one variant or several, with or
without the baseline, one seed or two, with or without a learning-rate sweep: report.md and report.html are always
written.

The runs are real: one model of each kind trained 30 steps with every step logged and evaluated with the whole
suite; each drawn comparison keeps of their metrics.csv what a run of its length and logging steps writes, and of
their suite the tasks it drew."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from difftransformer.compare.records import RunRecord, SweepPoint
from difftransformer.compare.report import build_report
from difftransformer.compare.settings import ComparisonSettings
from difftransformer.compare.variants import parse_variants
from difftransformer.eval import suite
from difftransformer.eval.registry import TASKS
from difftransformer.models import DiffTransformerForCausalLM
from difftransformer.train.mixture import RecallMix
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.presets import get_preset
from difftransformer.train.runner import METRICS_CSV, train_model
from test_train_support import pack, small_tokenizer, synthetic_texts

KINDS = ("diff", "diff_v2", "softmax")
STEPS = 30


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """Per kind: the folder of a 30-step run logged at every step (validation every 5), and the suite's results on
    one of them (every kind's have the same form, which is what the report reads)."""
    root = tmp_path_factory.mktemp("trained")
    texts = synthetic_texts(count=80)
    tokenizer = small_tokenizer(texts, vocab_size=400)
    preset = get_preset("micro")
    blocks = pack(texts[:60], tokenizer, preset.block_size)
    light = suite.SuiteSettings(
        context_length=preset.block_size, needle=preset.needle, needles=((1, 1),),
        light={"needle": {"samples": 1}, "quant": {"samples": 1}},
    )  # fmt: skip
    folders = {}
    for kind in KINDS:
        folder = root / kind
        config = preset.model_config(kind, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
        settings = preset.training_settings(output_dir=str(folder), max_steps=STEPS, logging_steps=1, eval_steps=5,
                                            save_steps=STEPS, report_to="none")  # fmt: skip
        train_model(config, blocks[:-8], blocks[-8:], tokenizer, settings)
        folders[kind] = folder
    model = DiffTransformerForCausalLM.from_pretrained(folders["softmax"]).eval()
    results = suite.run_suite(model, tokenizer, texts[70:], light, root / "eval", progress=False)
    runs = {kind: (folder, results) for kind, folder in folders.items()}
    data = PreparedData(
        tokenizer=tokenizer, train_blocks=blocks, validation_blocks=blocks[-8:], test_blocks=blocks[-8:],
        test_texts=texts[70:], corpus_name="synthetic", recall=RecallMix(),
    )  # fmt: skip
    return {"runs": runs, "data": data}


def _short_metrics(source: Path, target: Path, steps: int, logging: int, eval_steps: int) -> None:
    """What a run of ``steps`` steps logging every ``logging`` and validating every ``eval_steps`` writes: the
    source's rows at those steps (the last step's validation row too)."""
    with open(source, newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames, list(reader)
    kept = []
    for row in rows:
        step = int(row["step"])
        if step > steps:
            continue
        if row["loss"] and step % logging == 0:
            kept.append(row)
        elif row["eval_loss"] and (step % eval_steps == 0 or step == steps):
            kept.append(row)
    with open(target, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept)


FIXTURE = settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)


@pytest.mark.slow
@FIXTURE
@given(
    steps=st.integers(1, STEPS),
    logging=st.integers(1, 50),
    eval_steps=st.sampled_from([1, 5, 100]),
    tasks=st.lists(st.sampled_from(TASKS), unique=True, max_size=len(TASKS)),
    specs=st.lists(
        st.sampled_from(["diff", "diff_v2", "softmax", "diff(subln=none)"]), unique=True, min_size=1
    ),
    seeds=st.integers(1, 2),
    swept=st.booleans(),
)
def test_every_short_comparison_leaves_a_whole_report(trained, tmp_path, steps, logging, eval_steps, tasks, specs,
                                                       seeds, swept):  # fmt: skip
    out = tmp_path / "report"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    variants = parse_variants(",".join(specs))
    records, points = [], []
    for variant in variants:
        source, results = trained["runs"][variant.kind]
        for seed in range(seeds):
            folder = out / "runs" / f"{variant.slug}-seed{seed}"
            folder.mkdir(parents=True)
            _short_metrics(source / METRICS_CSV, folder / METRICS_CSV, steps, logging, eval_steps)
            kept = {part: {t: v for t, v in results[part].items() if t in tasks} for part in results}
            records.append(
                RunRecord(
                    variant=variant.spec(),
                    seed=seed,
                    scale="micro",
                    folder=folder,
                    parameters=1000,
                    tokens=steps * 1024,
                    tokens_per_second=1.0,
                    train_seconds=1.0,
                    validation_loss=5.0 + seed,
                    test_loss=5.0 + 0.1 * seed,
                    suite=kept,
                    learning_rate=3e-3,
                )  # fmt: skip
            )
            if swept and seed == 0:
                points.append(SweepPoint(variant.spec(), "micro", 3e-3, 0, steps, steps, 5.0, False))
    comparison = ComparisonSettings(output_dir=str(out), variants=tuple(variants), seeds=tuple(range(seeds)),
                                    tasks=tuple(tasks) or None)  # fmt: skip
    best = {("micro", v.spec()): 3e-3 for v in variants} if swept else None
    report = build_report(records, comparison.variants, trained["data"], get_preset("micro"), comparison, out,
                          sweep=points, shared_rate=3e-3, best=best)  # fmt: skip
    markdown, html = report.write(out)
    assert markdown.read_text().startswith("# ") and "## Results" in markdown.read_text()
    assert "<html" in html.read_text()
    shutil.rmtree(out)


def test_a_run_with_no_logged_row_still_reports_its_lambda_as_missing(trained, tmp_path):
    """The report of a run shorter than its logging steps (compare --max-steps 5 --logging-steps 20)."""
    variants = parse_variants("diff,softmax")
    records = []
    for variant in variants:
        source, results = trained["runs"][variant.kind]
        folder = tmp_path / variant.slug
        folder.mkdir()
        _short_metrics(source / METRICS_CSV, folder / METRICS_CSV, 5, 20, 100)
        records.append(RunRecord(variant.spec(), 0, "micro", folder, 1000, 5120, 1.0, 1.0, 5.0, 5.0, results))
    comparison = ComparisonSettings(output_dir=str(tmp_path), variants=tuple(variants))
    markdown, _ = build_report(
        records, variants, trained["data"], get_preset("micro"), comparison, tmp_path
    ).write(tmp_path)
    text = markdown.read_text()
    assert "lambda during training" in text and "no run logged lambda" in text


def test_a_run_whose_losses_are_not_finite_is_named_and_left_out_of_every_mean_and_claim(trained, tmp_path):
    """A reused run with NaN weights evaluates to a NaN test loss, which results.json holds as null: the report
    crashed on it in stats.mean (the sweep report's defect 11). It is named, and every cell says what it left out."""
    variants = parse_variants("diff,softmax")
    records = []
    for variant in variants:
        source, results = trained["runs"][variant.kind]
        for seed in range(2):
            folder = tmp_path / "runs" / f"{variant.slug}-seed{seed}"
            folder.mkdir(parents=True)
            _short_metrics(source / METRICS_CSV, folder / METRICS_CSV, STEPS, 1, 5)
            diverged = variant.kind == "diff" and seed == 1
            written = {
                "variant": variant.spec(), "seed": seed, "scale": "micro", "folder": folder.name, "parameters": 1000,
                "tokens": 1024, "tokens_per_second": 1.0, "train_seconds": 1.0,
                "validation_loss": None if diverged else 5.0, "test_loss": None if diverged else 5.0 + seed,
                "suite": results,
            }  # fmt: skip
            records.append(RunRecord.from_json(written, tmp_path / "runs"))  # as results.json holds NaN: null
    comparison = ComparisonSettings(output_dir=str(tmp_path), variants=tuple(variants), seeds=(0, 1))
    report = build_report(records, variants, trained["data"], get_preset("micro"), comparison, tmp_path)
    text = report.write(tmp_path)[0].read_text()
    assert "Not finite: DIFF seed 1 (validation loss, test loss)" in text
    diff_row = next(line for line in text.splitlines() if line.startswith("| DIFF | micro |"))
    assert "| 5.000 (1 of 2 not finite) | 5.000 (1 of 2 not finite) |" in diff_row
    loss_claim = next(line for line in text.splitlines() if line.startswith("| language-modelling loss"))
    assert loss_claim.endswith("| - | - |")  # not judged on one finite seed against two
