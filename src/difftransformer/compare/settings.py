"""What one comparison trains and evaluates: ``difftransformer compare``'s own options, declared once as the fields
of :class:`ComparisonSettings`, whose flags are generated from them (:mod:`difftransformer.flags`; the preset,
data and training options are ``train``'s, see :mod:`difftransformer.train.settings`)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Literal, get_args

from difftransformer.compare.ray.cluster import check_address
from difftransformer.compare.ray.resources import RunResources, parse_run_resources
from difftransformer.compare.variants import Variant, parse_variants
from difftransformer.errors import UsageError, check_seed
from difftransformer.eval.needle import parse_needle_configs
from difftransformer.eval.registry import TASKS, parse_tasks

DEFAULT_NEEDLES: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 2))
RateChoice = Literal["validation_loss", "learned_recall"]
RATE_CHOICES: tuple[str, ...] = get_args(RateChoice)


def _option(default, help: str, **metadata):
    """A field: its default, its help and our flag metadata (``parse``, ``show``, ``metavar``;
    :mod:`difftransformer.flags`)."""
    return field(default=default, metadata={"help": help, **metadata})


@dataclass(frozen=True)
class ComparisonSettings:
    """One comparison: each field is a ``compare`` flag (``variants`` -> ``--variants``); the values are checked
    when the settings are made, before any work.

    Attributes:
        output_dir: the report's folder; every run gets its own under ``output_dir/runs``.
        variants: the models to train (the baseline is the one named ``softmax``).
        init_from: a pretrained softmax folder every variant starts from (upcycled to its kind), or None.
        seeds: one run per variant and seed (None: the training seed alone).
        sizes: model widths to train every variant at (loss against parameters), or None.
        tokens_per_parameter: with ``sizes``, each size's training tokens per non-embedding parameter of its
            matched Transformer (None: the preset's steps at every size).
        token_budgets: training tokens to train every variant for (loss against tokens), or None.
        tasks: evaluation tasks (None: every one that fits the block size).
        needles: the N:R configurations of the needle task and quant's needle check.
        needle_samples: needle samples per (N:R, depth) cell (None: the task's light default).
        test_blocks: held-out test blocks for loss and perplexity.
        lm_eval_tasks, lm_eval_include, lm_eval_limit, lm_eval_batch_size: lm-evaluation-harness tasks to run as
            well (None: none), a folder of local task files, documents per task (a count from 1 on, a share
            below), batch size.
        learning_rates: rates every variant (at every scale) is swept over on the first seed, the best on
            validation loss then trained with every seed (None: every run at the preset's rate).
        sweep_steps: training steps of each sweep run (None, or the full budget: the sweep's runs are the first
            seed's runs; never more than the full budget).
        sweep_early_stop: stop a sweep run whose validation loss falls behind the other rates of its variant
            (ASHA, per variant and scale).
        rate_choice: how the sweep chooses each arm's rate (:func:`~difftransformer.compare.rates.best_rates`;
            "validation_loss" where ``learning_rates`` are given and it is not, None without a sweep).
        ray_address: the Ray cluster to run on (None: ``RAY_ADDRESS``, else a Ray started on this machine).
        run_resources: one run's CPUs, GPUs and workers (None: fitted to the cluster, see
            :func:`~difftransformer.compare.ray.resources.default_resources`).
        run_retries: how often a run whose worker died is started again from its last checkpoint.
        allow_unjudged: train variants whose report can judge no claim (no matched baseline, or nothing beside it).
    """

    _argument_group_name = "comparison"

    output_dir: str = _option("runs/compare", "report folder; every run gets its own under OUTPUT_DIR/runs")
    variants: tuple[Variant, ...] = _option(
        tuple(parse_variants("diff,softmax")),
        "models to train, comma-separated: an attention kind (diff: DIFF V1 as the paper specifies it; softmax: "
        "the matched baseline; diff_v2; gda, its signal heads per noise map as gda_ratio; gated) with optional "
        "config overrides in parentheses, e.g. "
        "'diff,diff(subln=none),diff_v2,softmax'; each is reported under a name saying what it is, and every "
        "other variant is judged against softmax",
        parse=parse_variants,
        show=lambda variants: ",".join(variant.spec() for variant in variants),
        metavar="VARIANTS",
    )
    init_from: str | None = _option(
        None,
        "a pretrained softmax model folder (Llama-family or ours) every variant starts from, with its tokenizer: "
        "softmax continues it as it is, diff_v2 and diff continue it upcycled (the same logits at step 0; "
        "docs/training.md); the preset gives the recipe",
        metavar="DIR",
    )
    seeds: tuple[int, ...] | None = _option(
        None,
        "train every variant once per seed and report mean ± spread, e.g. 0,1,2 (default: --seed)",
        metavar="SEEDS",
    )
    sizes: tuple[int, ...] | None = _option(
        None,
        "model widths (hidden_size) to train every variant at, with the preset's depth and head width and the "
        "same tokens each; fits loss against parameters and says how many parameters DIFF needs to match the "
        "baseline",
        metavar="SIZES",
    )
    tokens_per_parameter: float | None = _option(
        None,
        "with --sizes: train each size on this many tokens per non-embedding parameter of its matched Transformer "
        "(rounded to whole steps; warm-up shortened to a tenth of a short run) instead of the preset's steps",
        metavar="RATIO",
    )
    token_budgets: tuple[int, ...] | None = _option(
        None,
        "training tokens (rounded to whole steps) to train every variant for at the preset's size; fits loss "
        "against tokens",
        metavar="TOKENS",
    )
    tasks: tuple[str, ...] | None = _option(
        None,
        f"evaluation tasks to run on every trained model with light settings, comma-separated: {', '.join(TASKS)} "
        "(default: every one that fits the block size; a task named here that cannot run is refused before "
        "training)",
        parse=parse_tasks,
        metavar="TASKS",
    )
    needles: tuple[tuple[int, int], ...] = _option(
        DEFAULT_NEEDLES,
        "multi-needle retrieval configurations N:R (N needles, R queried), comma-separated, for the needle task "
        "and quant's needle check",
        parse=parse_needle_configs,
        show=lambda needles: ",".join(f"{n}:{r}" for n, r in needles),
        metavar="N:R",
    )
    needle_samples: int | None = _option(
        None,
        "multi-needle retrieval samples per (needles, depth) cell, context = block size (unset: the needle "
        "task's light setting)",
    )
    test_blocks: int = _option(256, "held-out test blocks for loss and perplexity")
    lm_eval_tasks: tuple[str, ...] | None = _option(
        None,
        "lm-evaluation-harness tasks to run on every trained model as well, comma-separated (e.g. "
        "hellaswag,arc_easy; needs the lmeval extra, and the tasks' data offline or a reachable hub); their table "
        "and plot join the report",
        metavar="TASKS",
    )
    lm_eval_include: str | None = _option(
        None,
        "a folder of local lm-eval task YAML files (--lm-eval-tasks may name them; built-in tasks are then not "
        "indexed)",
        metavar="DIR",
    )
    lm_eval_limit: float | None = _option(
        None, "documents per harness task (a share below 1 takes that share; unset: all)"
    )
    lm_eval_batch_size: int = _option(8, "harness batch size")
    learning_rates: tuple[float, ...] | None = _option(
        None,
        "learning rates to sweep every variant over (at every size), comma-separated, e.g. 1e-3,3e-3,1e-2: each "
        "rate trains on the first seed, the rate with the lowest validation loss then trains every seed, and the "
        "report judges the claims both at the shared rate (--learning-rate, the paper's protocol; swept too) and "
        "at each variant's best",
        metavar="RATES",
    )
    sweep_steps: int | None = _option(
        None,
        "training steps of each sweep run (default: the full budget, so that the sweep's runs are the first "
        "seed's runs); the report says when the sweep was shorter",
    )
    sweep_early_stop: bool = _option(
        False,
        "stop sweep runs whose validation loss falls behind the other rates of their variant (ASHA, per variant "
        "and size; the choice then depends on the order runs report in, so off by default)",
    )
    rate_choice: RateChoice | None = _option(
        None,
        "how the sweep chooses each variant's rate: validation_loss (the default with --learning-rates), the lowest "
        "validation loss; learned_recall, the lowest validation loss among the rates whose recall probe reached "
        "0.9 during training (all rates where none did), for presets that train on recall rows, whose validation "
        "text does not measure recall",
        metavar="{validation_loss,learned_recall}",
    )
    ray_address: str | None = _option(
        None,
        "the Ray cluster to run on, HOST:PORT of its head (as `ray start --head` prints it) or auto (default: "
        "$RAY_ADDRESS, else a Ray started on this machine with its cores and GPUs)",
        metavar="ADDRESS",
    )
    run_resources: RunResources | None = _option(
        None,
        "one run's share of the cluster, e.g. cpus=4,gpus=1 or gpus=4 (4 data-parallel workers); keys cpus, gpus, "
        "workers (default: one GPU a run where there are GPUs, else the cores split between as many runs as fit)",
        parse=parse_run_resources,
        show=str,
        metavar="cpus=N,gpus=N",
    )
    run_retries: int = _option(
        3, "how often a run whose worker process died is started again, from its last checkpoint"
    )
    allow_unjudged: bool = _option(
        False,
        "train and report variants although no claim of the paper can be judged (no softmax baseline among them "
        "and the folder's earlier report, or nothing beside it): the report then tables the runs alone",
    )

    def __post_init__(self) -> None:
        # The runs are trained and evaluated by workers that may stand in another folder, on another node.
        for name in ("output_dir", "init_from", "lm_eval_include"):
            if getattr(self, name):
                object.__setattr__(self, name, os.path.abspath(getattr(self, name)))
        specs = [variant.spec() for variant in self.variants]
        if not specs or len(set(specs)) != len(specs):
            raise UsageError(f"`variants` must list distinct variants; got {', '.join(specs) or 'none'}")
        for name in ("seeds", "sizes", "token_budgets", "lm_eval_tasks", "learning_rates"):
            values = getattr(self, name)
            if values is not None and not values:
                raise UsageError(f"`{name}` must list at least one value; got none")
        if self.seeds is not None:
            if len(set(self.seeds)) != len(self.seeds):
                raise UsageError(f"`seeds` must be distinct; got {', '.join(map(str, self.seeds))}")
            for seed in self.seeds:
                check_seed(seed, "seeds")
        for name in ("sizes", "token_budgets"):
            values = getattr(self, name) or ()
            if any(value < 1 for value in values) or len(set(values)) != len(values):
                raise UsageError(f"`{name}` must be distinct positive integers; got {list(values)}")
        if self.learning_rates is not None:
            rates = self.learning_rates
            if any(not 0 < rate < 1 for rate in rates) or len(set(rates)) != len(rates):
                raise UsageError(
                    f"`learning_rates` must be distinct rates in (0, 1); got {', '.join(map(str, rates))}"
                )
        if self.rate_choice is not None and self.rate_choice not in RATE_CHOICES:
            raise UsageError(
                f"`rate_choice` must be one of {', '.join(RATE_CHOICES)}; got {self.rate_choice!r}"
            )
        for name in ("sweep_steps", "sweep_early_stop", "rate_choice"):
            if getattr(self, name) not in (None, False) and self.learning_rates is None:
                raise UsageError(f"`{name}` applies to `learning_rates`; give them, or leave `{name}` out")
        if self.learning_rates is not None and self.rate_choice is None:
            object.__setattr__(self, "rate_choice", "validation_loss")
        if self.sweep_steps is not None and self.sweep_steps < 1:
            raise UsageError(f"`sweep_steps` must be >= 1; got {self.sweep_steps}")
        if self.ray_address is not None:
            check_address(self.ray_address)
        if self.run_retries < 0:
            raise UsageError(f"`run_retries` must be >= 0; got {self.run_retries}")
        if self.tokens_per_parameter is not None:
            if not self.sizes:
                raise UsageError("`tokens_per_parameter` applies to `sizes`; give them, or leave it out")
            if not self.tokens_per_parameter > 0:
                raise UsageError(f"`tokens_per_parameter` must be > 0; got {self.tokens_per_parameter}")
        if self.sizes and self.token_budgets:
            raise UsageError("give `sizes` or `token_budgets`, not both")
        if self.needle_samples is not None and self.needle_samples < 1:
            raise UsageError(
                f"`needle_samples` must be >= 1 (leave needle out of `tasks` to skip it); got {self.needle_samples}"
            )
        if self.test_blocks < 1:
            raise UsageError(f"`test_blocks` must be >= 1; got {self.test_blocks}")
        if self.lm_eval_batch_size < 1:
            raise UsageError(f"`lm_eval_batch_size` must be >= 1; got {self.lm_eval_batch_size}")
        if self.lm_eval_limit is not None:
            if self.lm_eval_limit <= 0:
                raise UsageError(f"`lm_eval_limit` must be > 0; got {self.lm_eval_limit}")
            if self.lm_eval_limit >= 1:  # a count from 1 on, a share below
                object.__setattr__(self, "lm_eval_limit", int(self.lm_eval_limit))
        for name in ("lm_eval_include", "lm_eval_limit"):
            if getattr(self, name) is not None and not self.lm_eval_tasks:
                raise UsageError(f"`{name}` applies to `lm_eval_tasks`; give them, or leave `{name}` out")
        if self.init_from:
            for variant in self.variants:
                if variant.overrides:
                    raise UsageError(
                        f"`variants`: with `init_from` the pretrained model fixes every shape; got {variant.spec()}"
                    )
            if self.sizes:
                raise UsageError(
                    "`sizes`: with `init_from` the pretrained model fixes the width; drop `sizes`"
                )

    def to_json(self) -> dict:
        """The settings as JSON data (variants as their specs), as results.json records them."""
        values = dataclasses.asdict(self)
        values["variants"] = [variant.spec() for variant in self.variants]
        values["run_resources"] = str(self.run_resources) if self.run_resources else None
        return values
