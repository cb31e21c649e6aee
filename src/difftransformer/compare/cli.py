"""``difftransformer compare``: train DIFF and its matched Transformer (and DIFF V2) alike, evaluate them on the same
held-out data with the whole evaluation suite (light settings scaled to the preset), and write report.md /
report.html with PNG plots.

Options: the comparison's own first (:class:`~difftransformer.compare.settings.ComparisonSettings`, one flag per
field), then the preset and data options and every transformers ``TrainingArguments`` option, as for ``train``
(each run's Trainer folder is OUTPUT_DIR/runs/RUN). Every option, folder and earlier run in OUTPUT_DIR is checked
before any data is prepared or anything is written.
"""

from __future__ import annotations

import argparse
import os

from difftransformer.compare.comparison import carry_out
from difftransformer.compare.plan import plan_comparison
from difftransformer.compare.ray.cluster import connect
from difftransformer.compare.settings import ComparisonSettings
from difftransformer.convert.folders import model_type
from difftransformer.eval.harness import check_harness
from difftransformer.flags import add_flags, given
from difftransformer.storage import check_input_dir
from difftransformer.train.cli import (
    add_recipe_options,
    checked_training_settings,
    data_options,
    recall_note,
    resolved_preset,
    training_options,
)
from difftransformer.train.pipeline import prepare_preset_data

INTERRUPTED_NOTE = "the same command continues it (finished runs are reused, a killed one resumes)"


def configure(parser: argparse.ArgumentParser) -> None:
    """The comparison's options, then the preset, data and training options shared with ``train``."""
    parser.usage = (
        "%(prog)s [--output-dir DIR] [--preset NAME] [--variants VARIANTS] [--seeds SEEDS] [OPTION ...]"
    )
    add_flags(parser, ComparisonSettings, only_given=True, list_items=True)
    add_recipe_options(parser, exclude=frozenset({"output_dir"}))


def comparison_settings(args: argparse.Namespace) -> ComparisonSettings:
    """The comparison's own options from the command line (checked by :class:`ComparisonSettings`)."""
    return ComparisonSettings(**given(vars(args), ComparisonSettings))


def run(args: argparse.Namespace) -> int:
    """Check every flag, folder and earlier run, prepare the data (with --seed, as ``train`` does), run the
    comparison, print where the report is."""
    preset = resolved_preset(args)
    comparison = comparison_settings(args)
    if comparison.init_from:
        check_input_dir(comparison.init_from, "init_from", "a saved model")
        model_type(comparison.init_from)  # a folder without a readable config.json is refused now
    data = data_options(args, comparison.init_from)
    if comparison.lm_eval_tasks:
        check_harness(comparison.lm_eval_include, comparison.lm_eval_batch_size)
    # --output-dir is the report's folder here; every run gets its own under it.
    training = {name: value for name, value in training_options(args).items() if name != "output_dir"}
    # Every training option is checked now, before any work (each run builds its own with its folder and seed).
    checked_training_settings(preset, output_dir=os.path.join(comparison.output_dir, "runs"), **training)
    plan = plan_comparison(preset, comparison, training, data)
    # The cluster, and whether it can hold a run, before any data is prepared.
    with connect(comparison.ray_address) as cluster:
        resources = cluster.resources_for(comparison.run_resources, len(plan.final()))
        print(f"compare: {cluster.describe()}; each run holds {resources}")
        if cluster.dashboard_url:
            print(f"compare: Ray's dashboard at {cluster.dashboard_url} (its token: `ray get-auth-token`)")
        if data.data is not None and (note := recall_note(preset)):
            print(note)
        markdown = carry_out(plan, prepare_preset_data(preset, data, training["seed"]), cluster)
    print(f"report: {os.path.abspath(markdown)}")
    print(f"        {os.path.abspath(markdown.with_suffix('.html'))}")
    return 0
