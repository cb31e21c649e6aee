"""compare's verdicts at equal training compute and each part's paired effect (compare/report/compute.py), on run
folders written here: each holds the configuration its arm trains, a validation-loss curve and its CPU seconds."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from difftransformer.compare.records import RunRecord
from difftransformer.compare.report.arms import Arm
from difftransformer.compare.report.compute import (
    direction,
    effective_parts,
    equal_compute_section,
    flops_per_token,
    loss_at_flops,
    paired_at_equal_compute,
    part_effects_section,
    part_pairs,
)
from difftransformer.compare.report.document import Report
from difftransformer.compare.variants import parse_variants
from difftransformer.models import DiffTransformerConfig, matched_config
from difftransformer.models.flops import training_flops
from difftransformer.stats import paired_interval
from difftransformer.train.callbacks import CSV_FIELDS

BLOCK = 64
BASE = DiffTransformerConfig(
    attention="softmax", hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=4, vocab_size=97, max_position_embeddings=BLOCK,
)  # fmt: skip
STEPS = (10, 20, 30, 40)


def run_folder(folder: Path, config: DiffTransformerConfig, losses: list[float], cpu: float) -> Path:
    folder.mkdir(parents=True)
    config.to_json_file(folder / "config.json")  # all from_pretrained reads here
    with open(folder / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, CSV_FIELDS)
        writer.writeheader()
        for step, loss in zip(STEPS, losses):
            writer.writerow({"step": step, "loss": loss + 0.1, "eval_loss": loss})
    (folder / "usage.json").write_text(
        json.dumps({"attempts": [{"phase": "compare", "wall_seconds": cpu, "cpu_seconds": cpu}]})
    )
    return folder


def arm_of(
    root: Path, spec: str, curves: dict[int, list[float]], cpu: float = 100.0, scale: str = "s"
) -> Arm:
    (variant,) = parse_variants(spec)
    config = variant.config(matched_config(BASE, variant.kind))
    runs = []
    for seed, losses in curves.items():
        folder = run_folder(root / f"{variant.slug}-{scale}-{seed}", config, losses, cpu * (1 + seed / 100))
        runs.append(
            RunRecord(spec, seed, scale, folder, 1000, 4000, 1.0, 1.0, losses[-1], losses[-1] + 0.01, {})
        )
    return Arm(variant, scale, variant.label, tuple(runs))


def test_a_validation_loss_is_read_at_a_flop_budget_between_its_evaluations(tmp_path):
    arm = arm_of(tmp_path, "softmax", {0: [4.0, 3.0, 2.6, 2.4]})
    run, per_token = arm.runs[0], flops_per_token(arm.runs[0], BLOCK)
    assert per_token == training_flops(BASE, BLOCK).total
    tokens_per_step = 4000 / 40
    # halfway between the evaluations at steps 20 and 30
    budget = 25 * tokens_per_step * per_token
    assert loss_at_flops(run, per_token, budget) == pytest.approx(2.8)
    assert loss_at_flops(run, per_token, 40 * tokens_per_step * per_token) == pytest.approx(2.4)
    assert loss_at_flops(run, per_token, 41 * tokens_per_step * per_token) is None  # past its last evaluation
    assert loss_at_flops(run, per_token, 9 * tokens_per_step * per_token) is None


def test_two_runs_of_a_seed_meet_at_the_cheaper_ones_budget(tmp_path):
    baseline = arm_of(tmp_path, "softmax", {0: [4.0, 3.0, 2.6, 2.4], 1: [4.1, 3.1, 2.7, 2.5]})
    dear = arm_of(
        tmp_path, "diff_v2(output_gate=elementwise)", {0: [3.9, 2.9, 2.5, 2.2], 1: [4.0, 3.0, 2.5, 2.3]}
    )
    ratio = flops_per_token(dear.runs[0], BLOCK) / flops_per_token(baseline.runs[0], BLOCK)
    assert ratio > 1.05  # the gate and the noise maps cost FLOPs the baseline does not spend
    differences, budgets = paired_at_equal_compute(dear, baseline, BLOCK)
    for seed, (difference, budget) in enumerate(zip(differences, budgets)):
        # the baseline's whole run; the dearer arm read at the step its FLOPs reached that budget
        step = 40 / ratio
        losses = {0: [3.9, 2.9, 2.5, 2.2], 1: [4.0, 3.0, 2.5, 2.3]}[seed]
        below = max(s for s in STEPS if s <= step)
        above = min(s for s in STEPS if s >= step)
        at = losses[STEPS.index(below)] + (losses[STEPS.index(above)] - losses[STEPS.index(below)]) * (
            (step - below) / (above - below) if above != below else 0
        )
        assert difference == pytest.approx(at - baseline.runs[seed].validation_loss)
        assert budget == pytest.approx(4000 * flops_per_token(baseline.runs[0], BLOCK))


def test_a_part_is_the_one_thing_two_arms_differ_in(tmp_path):
    curve = {0: [4.0, 3.0, 2.6, 2.4]}
    arms = [
        arm_of(tmp_path, spec, curve)
        for spec in ("softmax", "gated", "diff_v2", "diff_v2(output_gate=elementwise)", "diff_v2(gda_ratio=4)",
                     "motif(sliding_window_period=1)", "motif")
    ]  # fmt: skip
    found = {(part, a.variant.spec(), b.variant.spec()) for part, a, b in part_pairs(arms)}
    assert found == {
        ("output_gate", "softmax", "gated"),
        ("output_gate", "diff_v2", "diff_v2(output_gate=elementwise)"),
        ("gda_ratio", "diff_v2", "diff_v2(gda_ratio=4)"),
        # a window that windows no layer is no window: Motif without its windows is DIFF V2 at G=4 with the gate
        ("output_gate", "diff_v2(gda_ratio=4)", "motif(sliding_window_period=1)"),
        ("gda_ratio", "diff_v2(output_gate=elementwise)", "motif(sliding_window_period=1)"),
        ("window", "motif(sliding_window_period=1)", "motif"),
    }
    motif = effective_parts(DiffTransformerConfig.from_pretrained(arms[-1].runs[0].folder))
    assert motif["window"] == (129, (1, 2, 3))  # Motif's pattern: every fourth layer full, from layer 0


def test_a_part_effect_is_judged_by_its_paired_interval(tmp_path):
    assert direction([-0.10, -0.11, -0.09], "lowers", "raises") == "lowers"
    assert direction([0.10, 0.12, 0.08], "lowers", "raises") == "raises"
    assert direction([-0.10, 0.12, 0.01], "lowers", "raises").startswith("not resolved")
    assert direction([-0.1], "lowers", "raises").startswith("one seed")
    low, high = paired_interval([1.0, 2.0, 3.0])
    assert (low, high) == pytest.approx((2.0 - 4.303 / 3**0.5, 2.0 + 4.303 / 3**0.5))


def test_the_report_shows_equal_compute_and_part_effects_with_a_plot(tmp_path):
    seeds = {0: [4.0, 3.0, 2.6, 2.4], 1: [4.1, 3.1, 2.7, 2.5], 2: [4.05, 3.05, 2.65, 2.45]}
    lower = {seed: [value - 0.2 - seed / 100 for value in losses] for seed, losses in seeds.items()}
    baseline = arm_of(tmp_path, "softmax", seeds, cpu=100.0)
    gated = arm_of(tmp_path, "gated", lower, cpu=130.0)
    report = Report("t")
    equal_compute_section(report, baseline, [gated], BLOCK, tmp_path)
    part_effects_section(report, [baseline, gated], BLOCK)
    text = report.markdown()
    assert "## At equal training compute" in text and "## What each part does" in text
    assert (tmp_path / "loss_against_compute.png").is_file()
    row = next(line for line in text.splitlines() if line.startswith("| Gated"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    ratio = flops_per_token(gated.runs[0], BLOCK) / flops_per_token(baseline.runs[0], BLOCK)
    assert cells[1] == f"{ratio:.3f}" and cells[2] == "1.30"
    assert cells[5] == "ahead of the baseline"
    effect = next(line for line in text.splitlines() if line.startswith("| output_gate"))
    assert (
        "none → elementwise" in effect and "lowers the loss" in effect and effect.rstrip(" |").endswith("3")
    )
