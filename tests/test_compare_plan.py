"""What compare plans before Ray runs anything: the learning-rate sweep and the runs at the chosen rates, each run's
resources on a cluster, early stopping within an arm, and the prepared data as it travels to a worker."""

from __future__ import annotations

import argparse
import json
import math
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ray.tune.schedulers import TrialScheduler

from difftransformer.compare import cli as compare_cli
from difftransformer.compare.plan import plan_comparison
from difftransformer.compare.rates import at_rates, best_rates
from difftransformer.compare.ray.cluster import check_address, check_fits
from difftransformer.compare.ray.resources import RunResources, default_resources, parse_run_resources
from difftransformer.compare.ray.schedulers import PerArmASHA
from difftransformer.compare.records import RunRecord, SweepPoint
from difftransformer.compare.report.document import Report
from difftransformer.compare.report.learning_rates import RATES_PNG, learning_rate_section
from difftransformer.data.blocks import BlockFile, _mapped, block_file
from difftransformer.errors import UsageError
from difftransformer.train.cli import resolved_preset, training_options
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.plan import count_parameters
from difftransformer.train.presets import get_preset


def plan(tmp_path, *flags: str):
    parser = argparse.ArgumentParser()
    compare_cli.configure(parser)
    args = parser.parse_args(
        ["--preset", "micro", "--output-dir", str(tmp_path), "--report-to", "none", *flags]
    )
    training = {k: v for k, v in training_options(args).items() if k != "output_dir"}
    return plan_comparison(resolved_preset(args), compare_cli.comparison_settings(args), training)


def test_a_sweep_trains_every_rate_on_the_first_seed_then_every_seed_at_the_best_and_the_shared_rate(
    tmp_path,
):
    swept = plan(tmp_path, "--seeds", "3,4", "--learning-rates", "1e-3,1e-2")
    assert swept.shared_rate == 3e-3  # the micro preset's; it joins the sweep
    assert [(r.variant.spec(), r.learning_rate, r.seed, r.evaluate) for r in swept.sweep] == [
        (v, rate, 3, False) for v in ("diff", "softmax") for rate in (1e-3, 1e-2, 3e-3)
    ]
    assert swept.sweep[0].folder.name == "micro-diff-lr0.001-seed3"
    final = swept.final({("micro", "diff"): 1e-2, ("micro", "softmax"): 3e-3})
    assert [(r.variant.spec(), r.learning_rate, r.seed) for r in final] == [
        ("diff", 3e-3, 3), ("diff", 1e-2, 3), ("softmax", 3e-3, 3),
        ("diff", 3e-3, 4), ("diff", 1e-2, 4), ("softmax", 3e-3, 4),
    ]  # fmt: skip
    assert all(r.evaluate for r in final)
    # The first seed's runs of the sweep are the final runs of that seed: the same folders.
    assert {r.folder for r in swept.sweep} >= {r.folder for r in final if r.seed == 3}
    shorter = plan(tmp_path, "--seeds", "3,4", "--learning-rates", "1e-3,3e-3", "--sweep-steps", "4")
    assert shorter.sweep[0].folder.name == "micro-diff-lr0.001-4steps-seed3"
    assert {r.max_steps for r in shorter.sweep} == {4} and shorter.sweep[0].preset.training.warmup_steps == 1
    assert all(r.max_steps == 6 for r in shorter.final())
    plain = plan(tmp_path)
    assert not plain.sweep and [r.folder.name for r in plain.final()] == [
        "micro-diff-seed0",
        "micro-softmax-seed0",
    ]


def test_the_best_rate_is_the_lowest_validation_loss_of_the_runs_that_finished():
    def point(variant, rate, loss, stopped=False):
        return SweepPoint(variant, "s", rate, 0, 10, 5 if stopped else 10, loss, stopped)

    points = [point("diff", 1e-3, 3.0), point("diff", 3e-3, 2.5), point("diff", 1e-2, 2.0, stopped=True),
              point("softmax", 1e-3, 2.2), point("softmax", 3e-3, 2.2), point("softmax", 1e-2, math.nan)]  # fmt: skip
    assert best_rates(points) == {("s", "diff"): 3e-3, ("s", "softmax"): 1e-3}


def test_learned_recall_chooses_among_the_rates_whose_runs_learned_recall(tmp_path):
    def point(variant, rate, loss, learned):
        return SweepPoint(variant, "s", rate, 0, 10, 10, loss, False, learned)

    # DIFF's lowest loss is at a rate whose run never learned recall; the Transformer learned at no rate.
    points = [point("diff", 1e-3, 2.90, False), point("diff", 3e-3, 3.10, True), point("diff", 1e-2, 3.00, True),
              point("softmax", 1e-3, 2.95, False), point("softmax", 3e-3, 2.80, False)]  # fmt: skip
    assert best_rates(points) == {("s", "diff"): 1e-3, ("s", "softmax"): 3e-3}
    assert best_rates(points, "learned_recall") == {("s", "diff"): 1e-2, ("s", "softmax"): 3e-3}
    report = Report("r")
    learning_rate_section(report, points, {("s", "diff"): 1e-2, ("s", "softmax"): 3e-3}, 3e-3, tmp_path,
                          "learned_recall")  # fmt: skip
    text = report.markdown()
    assert "| DIFF | 2.900 (no recall) | 3.100 | 3.000 | 0.01 |" in text
    assert "among those whose recall probe reached 0.9" in text and "'no recall'" in text
    with pytest.raises(UsageError, match="`rate_choice` applies to `learning_rates`"):
        plan(tmp_path, "--rate-choice", "learned_recall")
    assert plan(tmp_path, "--rate-choice", "learned_recall", "--learning-rates", "1e-3").sweep


def test_the_learning_rate_section_tables_every_rate_and_marks_the_stopped(tmp_path):
    points = [SweepPoint("diff", "s", 1e-3, 0, 10, 10, 3.0, False), SweepPoint("diff", "s", 1e-2, 0, 10, 3, 4.5, True),
              SweepPoint("softmax", "s", 1e-3, 0, 10, 10, 2.9, False)]  # fmt: skip
    report = Report("r")
    learning_rate_section(report, points, {("s", "diff"): 1e-3, ("s", "softmax"): 1e-3}, 1e-3, tmp_path)
    text = report.markdown()
    assert "| DIFF | 3.000 | 4.500 (stopped at step 3) | 0.001 |" in text
    assert "| Transformer | 2.900 | - | 0.001 |" in text and "ended 1 sweep run(s)" in text
    assert (tmp_path / RATES_PNG).read_bytes()[:4] == b"\x89PNG"


def test_runs_at_one_rate_or_at_each_arms_own():
    def record(variant, rate):
        return RunRecord(variant, 0, "s", None, 1, 1, 1.0, 1.0, 1.0, 1.0, {}, learning_rate=rate)

    records = [record("diff", 1e-3), record("diff", 3e-3), record("softmax", 3e-3)]
    assert at_rates(records, 3e-3) == records[1:]
    assert at_rates(records, {("s", "diff"): 1e-3, ("s", "softmax"): 3e-3}) == [records[0], records[2]]


def test_run_resources_parse_and_fit_the_cluster():
    assert parse_run_resources("cpus=4,gpus=2") == RunResources(cpus=4, gpus=2, workers=2)
    assert parse_run_resources("gpus=1") == RunResources(cpus=1, gpus=1, workers=1)
    for bad, said in (("cpus=0", "cpus must be an integer >= 1"), ("gpus=two", "gpus must be an integer"),
                      ("cores=2", "KEY one of cpus, gpus, workers"), ("cpus=3,workers=2", "multiple of workers"),
                      ("cpus=1,cpus=2", "given twice")):  # fmt: skip
        with pytest.raises(UsageError, match=said):
            parse_run_resources(bad)
    two_cores = [{"CPU": 2.0}]
    assert default_resources(two_cores, runs=8) == RunResources(cpus=1)
    assert default_resources(two_cores, runs=1) == RunResources(cpus=2)
    assert default_resources([{"CPU": 16.0}], runs=4) == RunResources(cpus=4)
    assert default_resources([{"CPU": 16.0, "GPU": 4.0}], runs=20) == RunResources(cpus=4, gpus=1)
    nodes = [{"CPU": 1.0}, {"CPU": 1.0}]
    check_fits(RunResources(cpus=1), nodes, None)
    check_fits(RunResources(cpus=2, workers=2), nodes, None)  # one worker a node
    with pytest.raises(UsageError, match="cannot hold one run"):
        check_fits(RunResources(cpus=2), nodes, "h:1")
    with pytest.raises(UsageError, match=r"its nodes hold 1 CPUs and 0 GPUs, 1 CPUs and 0 GPUs"):
        check_fits(RunResources(cpus=1, gpus=1), nodes, "h:1")


def test_cluster_addresses_are_host_port_or_auto():
    assert check_address("10.0.0.1:6379") == ("10.0.0.1", 6379) and check_address("auto") is None
    for bad in ("one", "10.0.0.1", "h:0", "h:70000", "ray://h:10001", ":6379"):
        with pytest.raises(UsageError, match="`ray_address`"):
            check_address(bad)


def test_early_stopping_compares_a_run_only_with_its_own_arm():
    scheduler = PerArmASHA(
        arm=lambda trial: trial.config["arm"], time_attr="step", metric="eval_loss", mode="min", max_t=9,
        grace_period=2, reduction_factor=2, stop_last_trials=False,
    )  # fmt: skip
    trials = [SimpleNamespace(trial_id=str(i), config={"arm": arm}) for i, arm in enumerate("AABB")]
    for trial in trials:
        scheduler.on_trial_add(None, trial)

    def result(trial, loss):
        return scheduler.on_trial_result(None, trial, {"step": 2, "eval_loss": loss})

    assert result(trials[0], 1.0) == TrialScheduler.CONTINUE
    assert result(trials[2], 5.0) == TrialScheduler.CONTINUE  # far behind arm A, first in its own
    assert result(trials[1], 2.0) == TrialScheduler.STOP  # behind A's first run
    assert result(trials[3], 4.0) == TrialScheduler.CONTINUE  # ahead of B's first run


def test_prepared_data_travels_with_its_cache_files_named_not_copied(tmp_path):
    path = tmp_path / "blocks.bin"
    np.arange(64 * 1024, dtype="<i8").tofile(path)
    mapped = _mapped(path, (1024, 64))
    assert block_file(mapped) == BlockFile(str(path), (1024, 64)) and block_file(mapped[:2]) is None
    data = PreparedData(tokenizer=None, train_blocks=mapped, validation_blocks=mapped,
                        test_blocks=torch.arange(128).view(2, 64), test_texts=["x"], corpus_name="c")  # fmt: skip
    payload = pickle.dumps(data)
    assert len(payload) < mapped.numel() * 8 / 100  # the 512 KiB of blocks travel as a name
    again = pickle.loads(payload)
    assert torch.equal(again.train_blocks, mapped) and torch.equal(again.test_blocks, data.test_blocks)
    assert again.block_files() == [path, path]
    path.unlink()
    with pytest.raises(UsageError, match="is missing here"):
        pickle.loads(payload)


def test_each_size_trains_on_tokens_in_proportion_to_its_parameters(tmp_path):
    sized = plan(tmp_path, "--sizes", "32,64", "--tokens-per-parameter", "10")
    steps = {run.scale: run.max_steps for run in sized.final()}
    for scale, width in (("d32", 32), ("d64", 64)):
        preset = sized.runs[(scale, "softmax", 3e-3, 0)].preset
        assert preset.hidden_size == width
        counts = count_parameters(preset.model_config("softmax"))
        tokens = 10 * (counts.total - counts.outside_layers)
        assert steps[scale] == round(tokens / (256 * 4)), scale  # micro: 4 blocks of 256 tokens a step
    assert steps["d64"] > 3 * steps["d32"]
    with pytest.raises(UsageError, match="`tokens_per_parameter` applies to `sizes`"):
        plan(tmp_path, "--tokens-per-parameter", "10")


def test_a_preset_at_another_width_keeps_its_depth_and_head_width():
    preset = get_preset("scaling")
    wide = preset.at_width(144)
    assert (wide.hidden_size, wide.diff_heads, wide.num_hidden_layers) == (144, 6, preset.num_hidden_layers)
    assert wide.model_config("softmax").head_dim == preset.model_config("softmax").head_dim == 12
    with pytest.raises(UsageError, match="multiple of 2 x its head width 12; got 100"):
        preset.at_width(100)
    parser = argparse.ArgumentParser()
    compare_cli.configure(parser)
    assert resolved_preset(
        parser.parse_args(["--preset", "scaling", "--hidden-size", "48"])
    ) == preset.at_width(48)
    with pytest.raises(UsageError, match="`sizes`: a width of preset scaling must be a multiple"):
        plan_comparison(
            preset, compare_cli.comparison_settings(parser.parse_args(["--sizes", "50"])), {"seed": 0}
        )


def test_a_sweep_is_never_longer_than_the_runs_and_one_as_long_as_them_is_their_runs(tmp_path):
    """--sweep-steps beyond the full budget trained the sweep longer than the runs it chose for (the sweep report's
    defect 6); equal to it, the sweep's runs are the first seed's runs, not duplicates in folders of their own."""
    with pytest.raises(UsageError, match=r"^`sweep_steps` must be at most `max_steps` \(6: .*; got 40$"):
        plan(tmp_path, "--learning-rates", "1e-3", "--sweep-steps", "40")
    with pytest.raises(UsageError, match=r"`sweep_steps` must be at most `max_steps` at scale d32 \(\d+: "):
        plan(
            tmp_path, "--learning-rates", "1e-3", "--sizes", "32,48", "--max-steps", "8", "--sweep-steps", "9"
        )
    full = plan(tmp_path, "--learning-rates", "1e-3", "--sweep-steps", "6")
    assert [r.folder.name for r in full.sweep] == [f"micro-{v}-lr{rate}-seed0" for v in ("diff", "softmax")
                                                   for rate in ("0.001", "0.003")]  # fmt: skip
    assert {r.folder for r in full.sweep} <= {r.folder for r in full.runs.values()}


def test_scales_too_short_to_fit_and_flags_without_effect_are_refused(tmp_path):
    with pytest.raises(
        UsageError, match=r"`tokens_per_parameter` gives size 16 0 training step\(s\) .* at least 10"
    ):
        plan(tmp_path, "--sizes", "16,32", "--tokens-per-parameter", "1e-9")
    with pytest.raises(UsageError, match=r"`token_budgets` gives the budget 5,000 5 training step\(s\)"):
        plan(tmp_path, "--token-budgets", "5000,100000")
    assert plan(tmp_path, "--token-budgets", "10240,20480").scales == ("t10240", "t20480")
    # The default choice, given without a sweep, would choose nothing (the sweep report's papercut).
    with pytest.raises(UsageError, match="`rate_choice` applies to `learning_rates`"):
        plan(tmp_path, "--rate-choice", "validation_loss")
    assert plan(tmp_path, "--learning-rates", "1e-3").comparison.rate_choice == "validation_loss"


def test_a_comparison_whose_claims_cannot_be_judged_is_refused_unless_asked_for(tmp_path):
    """Variants without the softmax baseline, or the baseline alone, trained everything and then judged nothing."""
    for variants, missing in (
        ("diff,diff_v2", "without the matched baseline \\(softmax\\)"),
        ("softmax", "beside the baseline"),
    ):
        with pytest.raises(
            UsageError, match=f"^`variants` {variants}: no claim .* {missing}; .*`allow_unjudged`"
        ):
            plan(tmp_path, "--variants", variants)
    assert plan(tmp_path, "--variants", "diff,diff_v2", "--allow-unjudged").variants
    # A comparison grown by variants: the folder's earlier report holds the baseline.
    (tmp_path / "results.json").write_text(
        json.dumps({"provenance": {"comparison": {"variants": ["diff", "softmax"]}}, "runs": []})
    )
    assert [v.spec() for v in plan(tmp_path, "--variants", "diff_v2").variants] == ["diff_v2"]
