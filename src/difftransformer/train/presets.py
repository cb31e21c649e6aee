"""Named model sizes and training recipes: the CPU demo, a small GPU run, and the paper's configurations.

A preset describes the DIFF V1 model (``h`` differential heads); the matched Transformer is
``config.matched_baseline()`` (2h heads of the same width d), and DIFF V2 takes the baseline's head count
(SPEC §2-3). Training fields carry the transformers ``TrainingArguments`` names they are passed as.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from difftransformer.models import ATTENTION_KINDS, DiffTransformerConfig


@dataclass(frozen=True)
class Preset:
    """One model size and its training recipe.

    Model: ``hidden_size`` (d_model), ``num_hidden_layers``, ``diff_heads`` (h, so the baseline has 2h heads of
    width hidden_size / 2h), ``intermediate_size`` (None: 8/3 d_model rounded up to 64), ``block_size``
    (training sequence length). Training: the ``TrainingArguments`` of the same names; ``needle_fraction`` is the
    share of training blocks replaced by multi-needle retrieval examples (0 disables them), whose magic numbers
    have ``needle_digits`` digits (also in the retrieval evaluation).
    """

    name: str
    hidden_size: int
    num_hidden_layers: int
    diff_heads: int
    intermediate_size: int | None
    block_size: int
    vocab_size: int = 4096
    max_steps: int = 1000
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 3.2e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    lr_scheduler_type: str = "cosine"
    logging_steps: int = 10
    eval_steps: int = 100
    save_steps: int = 500
    eval_blocks: int | None = None
    needle_fraction: float = 0.0
    needle_digits: int = 6
    description: str = ""

    def model_config(self, attention: str = "diff", **fields) -> DiffTransformerConfig:
        """The model for ``attention`` ("diff", "softmax" = the matched baseline, "diff_v2"); ``fields`` (e.g.
        vocab_size, bos/eos/pad ids) override the preset's."""
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}; got {attention!r}")
        kwargs = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.diff_heads,
            attention="diff",
            max_position_embeddings=max(2048, self.block_size),
        )
        kwargs.update(fields)
        diff = DiffTransformerConfig(**kwargs)
        if attention == "diff":
            return diff
        baseline = diff.matched_baseline()
        if attention == "softmax":
            return baseline
        return dataclasses.replace(baseline, attention="diff_v2")

    def tokens_per_step(self, world_size: int = 1) -> int:
        """Tokens in one optimizer step's global batch."""
        return (
            self.block_size * self.per_device_train_batch_size * self.gradient_accumulation_steps * world_size
        )


def _paper(name: str, hidden: int, layers: int, heads: int, **fields) -> Preset:
    """The scaling runs of SPEC §5: length 2048, 0.25M-token batches (128 x 2048), 40K steps, AdamW betas
    (0.9, 0.98), warmup 375, weight decay 0.05. The learning rate of these runs is not in the SPEC; 3.2e-4 is
    the 3B recipe's."""
    recipe = dict(
        intermediate_size=None,
        block_size=2048,
        max_steps=40_000,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=16,
        learning_rate=3.2e-4,
        warmup_steps=375,
        weight_decay=0.05,
        adam_beta2=0.98,
        logging_steps=50,
        eval_steps=1000,
        save_steps=1000,
        eval_blocks=256,
        description=f"paper {name}: d_model {hidden}, {layers} layers, {heads} DIFF / {2 * heads} Transformer heads",
    )
    recipe.update(fields)
    return Preset(name=name, hidden_size=hidden, num_hidden_layers=layers, diff_heads=heads, **recipe)


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="micro",
            hidden_size=32,
            num_hidden_layers=2,
            diff_heads=2,
            intermediate_size=64,
            block_size=256,
            vocab_size=320,
            max_steps=6,
            per_device_train_batch_size=4,
            learning_rate=3e-3,
            warmup_steps=2,
            logging_steps=1,
            eval_steps=3,
            save_steps=3,
            eval_blocks=8,
            needle_fraction=0.25,
            description="seconds-long smoke test (used by the tests)",
        ),
        Preset(
            name="tiny",
            hidden_size=128,
            num_hidden_layers=4,
            diff_heads=2,
            intermediate_size=384,
            block_size=256,
            vocab_size=4096,
            max_steps=500,
            per_device_train_batch_size=8,
            learning_rate=2e-3,
            warmup_steps=30,
            logging_steps=10,
            eval_steps=100,
            save_steps=250,
            eval_blocks=32,
            needle_fraction=0.5,
            needle_digits=3,
            description="the CPU demo (make demo): minutes on 2 cores, with multi-needle retrieval blocks mixed in",
        ),
        Preset(
            name="small",
            hidden_size=384,
            num_hidden_layers=6,
            diff_heads=3,
            intermediate_size=None,
            block_size=512,
            vocab_size=8192,
            max_steps=3000,
            per_device_train_batch_size=16,
            learning_rate=1e-3,
            warmup_steps=200,
            logging_steps=20,
            eval_steps=250,
            save_steps=500,
            eval_blocks=128,
            needle_fraction=0.15,
            description="one GPU for under an hour, or a long CPU run",
        ),
        _paper("830m", 1536, 24, 8),
        _paper("1.4b", 2048, 24, 8),
        _paper("2.8b", 2560, 32, 10),
        _paper("6.8b", 4096, 32, 16),
        _paper("13.1b", 5120, 40, 20),
        _paper(
            "3b",
            3072,
            28,
            12,
            intermediate_size=8192,
            block_size=4096,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=16,
            learning_rate=3.2e-4,
            warmup_steps=1000,
            weight_decay=0.1,
            adam_beta2=0.95,
            description="paper 3B: d_model 3072, 28 layers, 12 DIFF / 24 Transformer heads (dim 128), FFN 8192",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ValueError listing the known ones otherwise."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}; got {name!r}")
    return PRESETS[name]
