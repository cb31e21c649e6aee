"""The report's setup section: the corpus, the rows served, the recipe every variant shared, seeds and variants."""

from __future__ import annotations

from collections.abc import Sequence

from difftransformer.compare.records import RunRecord
from difftransformer.compare.report.document import Report
from difftransformer.compare.variants import Variant
from difftransformer.train.mixture import RecallMix
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.presets import Preset


def _schedule_text(mix: RecallMix, block_size: int) -> str:
    """How the training rows grew along a length schedule ("" without one)."""
    if not mix.length_schedule:
        return ""
    stages = []
    for step, length in mix.length_schedule:
        low, high = mix.pairs_at(length, block_size)
        stages.append(
            f"{length} tokens from step {step}" + (f" ({low}-{high} MQAR pairs)" if mix.mqar_fraction else "")
        )
    grown = ", then ".join(stages)
    return f"; the rows grew with the step (a length curriculum): {grown}, text blocks cut to that length"


def setup_section(
    report: Report,
    records: Sequence[RunRecord],
    variants: Sequence[Variant],
    data: PreparedData,
    preset: Preset,
) -> None:
    """What every run of ``records`` trained on and how: one paragraph."""
    recipe = preset.training
    report.heading("Setup")
    report.paragraph(
        f"Corpus: {data.corpus_name}; {data.train_blocks.shape[0]} training blocks of {preset.block_size} tokens"
        + "".join(
            f"; {share:.0%} of the rows served were {what}"
            for share, what in (
                (data.recall.needle_fraction, "multi-needle retrieval examples"),
                (
                    data.recall.mqar_fraction,
                    f"MQAR rows ({data.recall.mqar_pairs[0]}-{data.recall.mqar_pairs[1]} "
                    "key-value pairs, loss on the answers only)",
                ),
                (
                    data.recall.induction_fraction,
                    "induction rows (a random segment repeated, loss on the repeat)",
                ),
            )
            if share
        )
        + _schedule_text(data.recall, preset.block_size)
        + f"; tokenizer vocabulary {len(data.tokenizer)}. "
        f"Every variant saw the same blocks in the same order, with the same seeds and optimizer recipe "
        f"(AdamW betas ({recipe['adam_beta1']}, {recipe['adam_beta2']}), weight decay {recipe['weight_decay']}, lr "
        f"{recipe['learning_rate']}, {recipe['warmup_steps']} warm-up steps then {recipe['lr_scheduler_type']}, "
        f"clip {recipe['max_grad_norm']}). Seeds: {sorted({r.seed for r in records})}. Variants: "
        + "; ".join(f"{v.label} = `{v.spec()}`" for v in variants)
        + "."
    )
