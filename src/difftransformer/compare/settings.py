"""What one comparison trains and evaluates: ``difftransformer compare``'s own options, declared once (the preset,
data and training options are ``train``'s, see :mod:`difftransformer.train.settings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from difftransformer.compare.variants import Variant, parse_variants
from difftransformer.errors import UsageError

DEFAULT_NEEDLES: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 2))


@dataclass(frozen=True)
class ComparisonSettings:
    """One comparison.

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
            well (None: none), a folder of local task files, documents per task, batch size.
    """

    output_dir: str = "runs/compare"
    variants: tuple[Variant, ...] = field(default_factory=lambda: tuple(parse_variants("diff,softmax")))
    init_from: str | None = None
    seeds: tuple[int, ...] | None = None
    sizes: tuple[int, ...] | None = None
    token_budgets: tuple[int, ...] | None = None
    tasks: tuple[str, ...] | None = None
    needles: tuple[tuple[int, int], ...] = DEFAULT_NEEDLES
    needle_samples: int | None = None
    test_blocks: int = 256
    lm_eval_tasks: tuple[str, ...] | None = None
    lm_eval_include: str | None = None
    lm_eval_limit: float | None = None
    lm_eval_batch_size: int = 8

    def __post_init__(self) -> None:
        if self.sizes and self.token_budgets:
            raise UsageError("give --sizes or --token-budgets, not both")
        if self.needle_samples is not None and self.needle_samples < 1:
            raise UsageError(
                f"--needle-samples must be >= 1 (leave needle out of --tasks to skip it); got {self.needle_samples}"
            )
        if self.test_blocks < 1:
            raise UsageError(f"--test-blocks must be >= 1; got {self.test_blocks}")
        if self.init_from:
            for variant in self.variants:
                if variant.overrides:
                    raise UsageError(
                        f"--variants: with --init-from the pretrained model fixes every shape; got {variant.spec()}"
                    )
            if self.sizes:
                raise UsageError(
                    "--sizes: with --init-from the pretrained model fixes the width; drop --sizes"
                )
