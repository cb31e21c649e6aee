"""compare's report, assembled: the paper's claims judged first, then the setup, the runs, the learning rates, the
verdicts, the loss curves, lambda, the gap, the verdicts at equal compute, each part's effect, recall against
length, the evaluation suite, the harness and the scaling fits. Each section is a module of this folder and takes the runs grouped by arm (:mod:`.arms`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from difftransformer.compare.rates import at_rates
from difftransformer.compare.records import RunRecord, SweepPoint, learned_recall
from difftransformer.compare.report.arms import at_scale, group
from difftransformer.compare.report.claims_table import claims_section, verdict_sentences
from difftransformer.compare.report.compute import equal_compute_section, part_effects_section
from difftransformer.compare.report.curves import loss_section
from difftransformer.compare.report.document import Report
from difftransformer.compare.report.gap import gap_section
from difftransformer.compare.report.harness import harness_section
from difftransformer.compare.report.lambda_traces import traces_section
from difftransformer.compare.report.learning_rates import learning_rate_section
from difftransformer.compare.report.lengths import length_section
from difftransformer.compare.report.results import results_section
from difftransformer.compare.report.scaling import scaling_section
from difftransformer.compare.report.setup import setup_section
from difftransformer.compare.report.suite import suite_sections
from difftransformer.compare.settings import ComparisonSettings
from difftransformer.compare.variants import Variant
from difftransformer.storage import versions
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.presets import Preset


def provenance_line(origin: Mapping[str, str]) -> str:
    """The report's first line: the versions that made it, and how many of its runs (``origin``: each run folder's
    "trained" by this invocation or "reused" from an earlier one, the sweep's included) this invocation trained."""
    found = versions()
    reused = sum(1 for how in origin.values() if how == "reused")
    runs = (
        f"{len(origin) - reused} run(s) trained by this invocation, {reused} reused from an earlier one with the "
        "same settings (each run folder's provenance.json records them)"
    )
    return (
        f"Made with difftransformer {found['difftransformer']}, torch {found['torch']} and transformers "
        f'{found["transformers"]}; {runs}; the settings are in results.json ("provenance").'
    )


def build_report(
    records: list[RunRecord],
    variants: Sequence[Variant],
    data: PreparedData,
    preset: Preset,
    comparison: ComparisonSettings,
    out: Path,
    sweep: Sequence[SweepPoint] = (),
    shared_rate: float | None = None,
    best: dict[tuple[str, str], float] | None = None,
    origin: Mapping[str, str] | None = None,
) -> Report:
    """The whole report of ``records`` (the runs of ``variants``), with its plots written into ``out``. With a
    learning-rate ``sweep``, ``records`` hold every seed at the ``shared_rate`` and at each arm's ``best``: the
    claims are judged at both, the learning-rate section follows the results, and the sections after it read the
    runs at each arm's best rate. ``origin``: which runs this invocation trained and which it reused (results.json's
    ``provenance.runs``; None: every record's folder counted as trained)."""
    scales = list(dict.fromkeys(r.scale for r in records))
    by = ("parameters" if comparison.sizes else "tokens") if len(scales) > 1 else None
    # Claims and verdicts read the largest scale: the model or budget closest to the paper's.
    largest = max(scales, key=lambda s: max((r.parameters, r.tokens) for r in records if r.scale == s))
    report = Report(f"{' vs '.join(v.label for v in variants)}: preset {preset.name}")
    report.paragraph(
        provenance_line(origin if origin is not None else {str(r.folder): "trained" for r in records})
    )
    every = group(records, variants)
    if sweep and any(rate != shared_rate for rate in best.values()):
        arms = group(at_rates(records, best), variants)
        claims_section(report, group(at_rates(records, shared_rate), variants), largest, by,
                       heading=f"The paper's claims at the shared learning rate {shared_rate:g} (every arm alike)")  # fmt: skip
        claims_section(report, arms, largest, by,
                       heading="The paper's claims, each arm at its own best learning rate")  # fmt: skip
    elif sweep:
        arms = group(at_rates(records, shared_rate), variants)
        claims_section(report, arms, largest, by,
                       heading=f"The paper's claims at the shared learning rate {shared_rate:g}, every arm's best")  # fmt: skip
    else:
        arms = every
        claims_section(report, arms, largest, by)
    setup_section(report, [r for arm in arms for r in arm.runs], variants, data, preset)
    results_section(
        report, every, min(comparison.test_blocks, data.test_blocks.shape[0]), best if sweep else None
    )
    if sweep:
        learning_rate_section(report, sweep, best, shared_rate, out, comparison.rate_choice)
        report.paragraph("The sections below read every arm's runs at its own best learning rate.")
    report.paragraph(" ".join(verdict_sentences(arms, largest)))
    loss_section(report, arms, out)
    traces_section(report, arms, out)
    gap_section(report, *at_scale(arms, largest), out)
    equal_compute_section(report, *at_scale(arms, largest), preset.block_size, out)
    part_effects_section(report, arms, preset.block_size)
    groups = [(arm.name, [r.suite for r in arm.runs]) for arm in arms]
    learned = [[learned_recall(r.folder) for r in arm.runs] for arm in arms]
    length_section(report, groups, preset.block_size, out, preset.length_schedule, learned)
    suite_sections(report, groups, out)
    harness_section(report, arms, out)
    if by is not None:
        scaling_section(report, arms, out, by)
    return report
