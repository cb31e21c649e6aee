"""What one comparison trains and evaluates: ``difftransformer compare``'s own options, declared once as the fields
of :class:`ComparisonSettings`, whose flags are generated from them (:mod:`difftransformer.flags`; the preset,
data and training options are ``train``'s, see :mod:`difftransformer.train.settings`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from difftransformer.compare.variants import Variant, parse_variants
from difftransformer.errors import UsageError, check_seed
from difftransformer.eval.needle import parse_needle_configs
from difftransformer.eval.registry import TASKS, parse_tasks

DEFAULT_NEEDLES: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 2))


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
        token_budgets: training tokens to train every variant for (loss against tokens), or None.
        tasks: evaluation tasks (None: every one that fits the block size).
        needles: the N:R configurations of the needle task and quant's needle check.
        needle_samples: needle samples per (N:R, depth) cell (None: the task's light default).
        test_blocks: held-out test blocks for loss and perplexity.
        lm_eval_tasks, lm_eval_include, lm_eval_limit, lm_eval_batch_size: lm-evaluation-harness tasks to run as
            well (None: none), a folder of local task files, documents per task (a count from 1 on, a share
            below), batch size.
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

    def __post_init__(self) -> None:
        specs = [variant.spec() for variant in self.variants]
        if not specs or len(set(specs)) != len(specs):
            raise UsageError(f"`variants` must list distinct variants; got {', '.join(specs) or 'none'}")
        for name in ("seeds", "sizes", "token_budgets", "lm_eval_tasks"):
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
        return values
