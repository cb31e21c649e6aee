"""The report's results table: every arm at every rate it trained at, with its size, speed and losses, and the
runs whose losses are not finite (a diverged run, NaN weights), named."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from difftransformer.compare.report.arms import Arm
from difftransformer.compare.report.document import Report, mean_spread


def results_section(
    report: Report,
    arms: Sequence[Arm],
    test_blocks: int,
    best: Mapping[tuple[str, str], float] | None = None,
) -> None:
    """One row per arm and learning rate (the rate column, with each arm's own marked, when ``best`` holds the
    rates a sweep chose), then what the values are; ``test_blocks``: the held-out blocks of the test loss."""
    report.heading("Results")
    swept = best is not None
    header = ["variant", "scale", *(["learning rate"] if swept else []), "parameters", "tokens", "tokens/s",
              "validation loss", "test loss", "test perplexity"]  # fmt: skip
    rows = []
    for arm in arms:
        for rate in dict.fromkeys(r.learning_rate for r in arm.runs):
            runs = [r for r in arm.runs if r.learning_rate == rate]
            chosen = " (its best)" if swept and best.get((arm.scale, arm.variant.spec())) == rate else ""
            rows.append(
                [
                    arm.variant.label,
                    arm.scale,
                    *([f"{rate:g}{chosen}"] if swept else []),
                    f"{runs[0].parameters:,}",
                    f"{runs[0].tokens:,}",
                    mean_spread([r.tokens_per_second for r in runs], 0),
                    mean_spread([r.validation_loss for r in runs]),
                    mean_spread([r.test_loss for r in runs]),
                    mean_spread([math.exp(r.test_loss) for r in runs], 1),
                ]
            )
    report.table(header, rows)
    report.paragraph(
        "Values here and in every table below are mean ± sample standard deviation across seeds; the test "
        f"loss is over {test_blocks} held-out blocks."
    )
    diverged = [
        f"{arm.name} seed {r.seed} ({', '.join(what)})"
        for arm in arms
        for r in arm.runs
        if (what := [name for name, value in (("validation loss", r.validation_loss), ("test loss", r.test_loss))
                     if not math.isfinite(value)])
    ]  # fmt: skip
    if diverged:
        report.paragraph(
            f"Not finite: {'; '.join(diverged)} (the run diverged, or its weights hold NaN). Every mean leaves "
            "such a value out and says how many it left out, and no claim is judged on it."
        )
